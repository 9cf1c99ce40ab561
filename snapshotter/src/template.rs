//! Template configuration: an image plus setup (files copied in, commands run), and the
//! digest that content-addresses the snapshot built from it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// `[template]` in a template or suite file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateConfig {
    /// Root image: `minimal`, `python`, an archive or folder, or `registry:REF`. Empty
    /// when `dockerfile` gives the image instead.
    #[serde(default)]
    pub image: String,
    /// A Dockerfile that builds the image (instead of `image`), relative to the config file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dockerfile: Option<PathBuf>,
    /// The Dockerfile's build context (default: the Dockerfile's folder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<PathBuf>,
    /// The Dockerfile's build arguments (`--build-arg`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub build_args: BTreeMap<String, String>,
    /// The Dockerfile stage to build (default: the last).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Guest memory in MiB.
    #[serde(default = "default_memory_mib")]
    pub memory_mib: u32,
    /// Virtual CPUs.
    #[serde(default = "default_cpus")]
    pub cpus: u32,
    /// Files copied into the guest before the setup commands run.
    #[serde(default)]
    pub files: Vec<TemplateFile>,
    /// Shell commands run in order in the guest (`/bin/sh -c`); each must exit 0.
    #[serde(default)]
    pub setup: Vec<String>,
    /// Time limit for each setup command.
    #[serde(default = "default_setup_timeout")]
    pub setup_timeout_secs: u64,
    /// Environment for the setup commands (over a converted image's `Env`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Size of a converted image (`oci-archive:` and the like), in MiB; default: its
    /// content plus a quarter and 256 MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_size_mib: Option<u64>,
    /// Egress for the setup commands only (`[template.network] allow`); the snapshot's id
    /// covers it. Rollouts and scoring never inherit it.
    #[serde(default, skip_serializing_if = "Network::is_empty")]
    pub network: Network,
    /// The Dockerfile comes from someone the host does not trust (a client of `farm serve`'s
    /// sandbox API): its `FROM` and `COPY --from` images may be registry references and the
    /// built-in images only, never a host path (`oci-archive:`, `rootfs:` ...). Not part of
    /// the template's digest (it changes what is allowed, not what is built).
    #[serde(skip)]
    pub confined: bool,
}

/// `[... .network]`: the `host:port` entries a VM may reach through farm's proxy (passed
/// through), and request rules (`[[... .network.rules]]`, see `vmm::egress`) for hosts whose
/// requests are inspected.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<egress::Rule>,
}

/// An allowlist entry that is not `host:port` (or `*`), or a bad rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadAllowEntry {
    #[error("allow[{index}] = {entry:?} is not host:port (e.g. \"pypi.org:443\"), or \"*\" for any host")]
    Allow { index: usize, entry: String },
    #[error("rules[{index}]: {error}")]
    Rule {
        index: usize,
        error: egress::rules::RuleError,
    },
}

impl Network {
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.rules.is_empty()
    }

    /// Checks each entry is `host:port` and each rule's syntax; names the bad one.
    pub fn check(&self) -> Result<(), BadAllowEntry> {
        for (i, entry) in self.allow.iter().enumerate() {
            let ok = entry == "*"
                || entry.rsplit_once(':').is_some_and(|(host, port)| {
                    !host.is_empty()
                        && !host.contains(|c: char| c.is_whitespace() || c == '/' || c == '@')
                        && port.parse::<u16>().is_ok_and(|p| p > 0)
                });
            if !ok {
                return Err(BadAllowEntry::Allow {
                    index: i,
                    entry: entry.clone(),
                });
            }
        }
        for (i, rule) in self.rules.iter().enumerate() {
            egress::check_rule(rule).map_err(|error| BadAllowEntry::Rule { index: i, error })?;
        }
        Ok(())
    }

    /// The proxy policy of these settings, with the rules' credentials read on the host;
    /// `name` says where they come from (in 403s and the log).
    pub fn policy(&self, name: &str) -> Result<egress::Policy, egress::rules::ResolveError> {
        let rules = egress::RuleSet::resolve(name, &self.rules)?;
        Ok(egress::Policy {
            allow: self.allow.clone(),
            log: None,
            rules: std::sync::Arc::new(rules),
        })
    }

    /// The proxy's variables, for commands that may use the network.
    pub fn proxy_env(&self) -> Vec<(String, String)> {
        if self.is_empty() {
            return Vec::new();
        }
        proxy_env()
    }
}

/// The proxy's variables: every HTTP(S) client goes through farm's proxy, except to the
/// guest's own loopback (its services; the host's are `host.farm.internal`).
pub fn proxy_env() -> Vec<(String, String)> {
    let url = farm_protocol::net::PROXY_URL.to_string();
    let mut env: Vec<(String, String)> = ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"]
        .iter()
        .map(|k| (k.to_string(), url.clone()))
        .collect();
    env.extend(
        ["NO_PROXY", "no_proxy"]
            .iter()
            .map(|k| (k.to_string(), "localhost,127.0.0.1,::1".to_string())),
    );
    env
}

/// One file to place in the guest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateFile {
    /// Host path, relative to the config file.
    pub src: PathBuf,
    /// Absolute guest path.
    pub dest: String,
    /// Permission bits, e.g. `0o644` (default) or `0o755`.
    #[serde(default = "default_mode")]
    pub mode: u32,
}

fn default_memory_mib() -> u32 {
    256
}
fn default_cpus() -> u32 {
    1
}
fn default_setup_timeout() -> u64 {
    600
}
fn default_mode() -> u32 {
    0o644
}

#[derive(Debug, thiserror::Error)]
pub enum TemplateConfigError {
    #[error("cannot read template config {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{path}: {key}: {message}")]
    Invalid { path: String, key: String, message: String },
}

/// The error for a key of the config file at `path` that has a wrong value.
fn invalid_value(path: &Path, key: &str, message: String) -> TemplateConfigError {
    TemplateConfigError::Invalid {
        path: path.display().to_string(),
        key: key.to_string(),
        message,
    }
}

/// A template file on disk: `[template]` and nothing else.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TemplateFileToml {
    template: TemplateConfig,
}

impl TemplateConfig {
    /// Reads a template file (`[template]` table).
    pub fn load(path: &Path) -> Result<TemplateConfig, TemplateConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| TemplateConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let parsed: TemplateFileToml = toml::from_str(&text).map_err(|e| TemplateConfigError::Parse {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        parsed.template.validate(path)?;
        Ok(parsed.template)
    }

    /// Checks values serde cannot (ranges, paths) and names the key that is wrong.
    pub fn validate(&self, path: &Path) -> Result<(), TemplateConfigError> {
        let invalid = |key: &str, message: String| invalid_value(path, key, message);
        self.validate_source(path)?;
        self.network
            .check()
            .map_err(|m| invalid("template.network", m.to_string()))?;
        if !self.network.rules.is_empty() {
            return Err(invalid(
                "template.network",
                "rules are for rollouts and sessions ([rollouts.network]); a template's setup takes allow entries only"
                    .into(),
            ));
        }
        if self.image_size_mib.is_some_and(|s| !(64..=1 << 20).contains(&s)) {
            return Err(invalid(
                "template.image_size_mib",
                format!("{} is out of range 64..=1048576", self.image_size_mib.unwrap_or(0)),
            ));
        }
        if !(64..=65536).contains(&self.memory_mib) {
            return Err(invalid(
                "template.memory_mib",
                format!("{} is out of range 64..=65536", self.memory_mib),
            ));
        }
        if !(1..=64).contains(&self.cpus) {
            return Err(invalid(
                "template.cpus",
                format!("{} is out of range 1..=64", self.cpus),
            ));
        }
        self.validate_files(path)
    }

    /// Where the image comes from: `image` or `dockerfile` (with its `context`, `build_args`
    /// and `target`), never both.
    fn validate_source(&self, path: &Path) -> Result<(), TemplateConfigError> {
        let invalid = |key: &str, message: String| invalid_value(path, key, message);
        match (&self.dockerfile, self.image.is_empty()) {
            (Some(_), false) => {
                return Err(invalid(
                    "template.image",
                    "give either image or dockerfile, not both".into(),
                ))
            }
            (None, true) => {
                return Err(invalid(
                    "template.image",
                    "missing: give an image (or a dockerfile)".into(),
                ))
            }
            (Some(dockerfile), true) => {
                // `path` is the config file, or the folder its paths are relative to.
                let dir = if path.is_dir() {
                    path
                } else {
                    path.parent().unwrap_or(Path::new("."))
                };
                if !dir.join(dockerfile).is_file() {
                    return Err(invalid(
                        "template.dockerfile",
                        format!("{} is not a file", dir.join(dockerfile).display()),
                    ));
                }
                if let Some(context) = &self.context {
                    if !dir.join(context).is_dir() {
                        return Err(invalid(
                            "template.context",
                            format!("{} is not a folder", dir.join(context).display()),
                        ));
                    }
                }
            }
            (None, false) => {
                if self.context.is_some() || !self.build_args.is_empty() || self.target.is_some() {
                    return Err(invalid(
                        "template.context",
                        "context, build_args and target go with a dockerfile".into(),
                    ));
                }
                if images::ImageSource::parse(&self.image, Path::new(".")).is_err() {
                    return Err(invalid(
                        "template.image",
                        format!("{:?} is not an image; expected one of {}, or oci-archive:PATH, docker-archive:PATH, oci:DIR, rootfs:DIR, registry:REF", self.image, vmm::artifacts::IMAGES.join(", ")),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Each file goes to an absolute guest path with a permission mode.
    fn validate_files(&self, path: &Path) -> Result<(), TemplateConfigError> {
        let invalid = |key: &str, message: String| invalid_value(path, key, message);
        for (i, file) in self.files.iter().enumerate() {
            if !file.dest.starts_with('/') {
                return Err(invalid(
                    &format!("template.files[{i}].dest"),
                    format!("{:?} must be an absolute guest path", file.dest),
                ));
            }
            if file.mode > 0o7777 {
                return Err(invalid(
                    &format!("template.files[{i}].mode"),
                    format!("{:o} is not a permission mode", file.mode),
                ));
            }
        }
        Ok(())
    }

    /// The digest of everything that determines the template's snapshot except the host
    /// artifacts: this config and the contents of its files (read relative to `base_dir`).
    pub fn digest(&self, base_dir: &Path) -> Result<String, TemplateConfigError> {
        let mut hasher = Sha256::new();
        hasher.update(serde_json::to_vec(self).expect("config serializes"));
        for (i, file) in self.files.iter().enumerate() {
            let contents = std::fs::read(base_dir.join(&file.src)).map_err(|e| TemplateConfigError::Invalid {
                path: base_dir.display().to_string(),
                key: format!("template.files[{i}].src"),
                message: format!("cannot read {}: {e}", base_dir.join(&file.src).display()),
            })?;
            hasher.update((contents.len() as u64).to_le_bytes());
            hasher.update(&contents);
        }
        Ok(hex(&hasher.finalize()))
    }

    /// A bare template of an image with defaults.
    pub fn of_image(image: &str) -> TemplateConfig {
        TemplateConfig {
            image_size_mib: None,
            network: Network::default(),
            image: image.to_string(),
            dockerfile: None,
            context: None,
            build_args: BTreeMap::new(),
            target: None,
            memory_mib: default_memory_mib(),
            cpus: default_cpus(),
            files: Vec::new(),
            setup: Vec::new(),
            setup_timeout_secs: default_setup_timeout(),
            env: BTreeMap::new(),
            confined: false,
        }
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn parses_with_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            dir.path(),
            "t.toml",
            "[template]\nimage = \"python\"\nsetup = [\"true\"]\n",
        );
        let t = TemplateConfig::load(&p).unwrap();
        assert_eq!(t.memory_mib, 256);
        assert_eq!(t.setup, ["true"]);
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "t.toml", "[template]\nimage = \"python\"\nmemroy_mib = 5\n");
        let err = TemplateConfig::load(&p).unwrap_err().to_string();
        assert!(err.contains("memroy_mib") && err.contains("t.toml"), "{err}");
        let p = write(dir.path(), "t.toml", "[template]\nimage = \"python\"\nmemory_mib = 5\n");
        let err = TemplateConfig::load(&p).unwrap_err().to_string();
        assert!(err.contains("template.memory_mib"), "{err}");
        let p = write(dir.path(), "t.toml", "[template]\nimage = \"arch\"\n");
        assert!(TemplateConfig::load(&p)
            .unwrap_err()
            .to_string()
            .contains("template.image"));
    }

    #[test]
    fn digest_follows_config_and_file_contents() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a.txt", "one");
        let mut t = TemplateConfig::of_image("minimal");
        t.files.push(TemplateFile {
            src: "a.txt".into(),
            dest: "/a".into(),
            mode: 0o644,
        });
        let d1 = t.digest(dir.path()).unwrap();
        assert_eq!(d1, t.digest(dir.path()).unwrap());
        write(dir.path(), "a.txt", "two");
        let d2 = t.digest(dir.path()).unwrap();
        assert_ne!(d1, d2);
        t.setup.push("true".into());
        assert_ne!(d2, t.digest(dir.path()).unwrap());
    }
}
