//! The host's registry settings: mirrors, plain-HTTP registries, reference overrides and
//! credentials. They belong to the machine, not to a suite: a suite names the image it needs,
//! and the host says how to reach it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use oci_client::secrets::RegistryAuth;
use oci_client::Reference;
use serde::Deserialize;

/// Where the settings file is read from: `FARM_REGISTRIES`, else this under the home folder.
const DEFAULT_FILE: &str = ".config/farm/registries.toml";

/// The settings file (`registries.toml`), as written:
///
/// ```toml
/// insecure = ["registry.lan:5000"]            # plain HTTP (loopback registries always are)
/// [mirrors]
/// "docker.io" = ["mirror.lan:5000"]           # tried in order, then the registry itself
/// [overrides]
/// "python:3.12" = "registry.lan:5000/python:3.12"   # this reference is pulled as that one
/// ```
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    insecure: Vec<String>,
    #[serde(default)]
    mirrors: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    overrides: BTreeMap<String, String>,
}

/// The settings in force for pulls on this host.
#[derive(Debug, Default, Clone)]
pub struct RegistrySettings {
    /// Registries spoken to over plain HTTP (besides loopback ones).
    insecure: BTreeSet<String>,
    /// Per registry (as in references: `docker.io`, `host:port`), its mirrors in order.
    mirrors: BTreeMap<String, Vec<String>>,
    /// Whole reference (normalised) -> the reference pulled instead.
    overrides: BTreeMap<String, Reference>,
    /// Where the settings came from (for messages), if a file was read.
    pub source: Option<PathBuf>,
}

/// Why the registry settings could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("reading {path} failed")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a valid registries file (keys: insecure, [mirrors], [overrides])")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("{path}: [overrides] {key:?}: {value:?} is not an image reference")]
    Reference {
        path: PathBuf,
        key: String,
        value: String,
        #[source]
        source: oci_client::ParseError,
    },
}

impl RegistrySettings {
    /// The host's settings: the file `FARM_REGISTRIES` names (it must exist), else
    /// `~/.config/farm/registries.toml` when it exists, else none.
    pub fn load() -> Result<RegistrySettings, SettingsError> {
        let (path, required) = match std::env::var_os("FARM_REGISTRIES") {
            Some(path) => (PathBuf::from(path), true),
            None => (
                std::env::var_os("HOME")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| PathBuf::from("/root"))
                    .join(DEFAULT_FILE),
                false,
            ),
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => RegistrySettings::parse(&text, &path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => Ok(RegistrySettings::default()),
            Err(source) => Err(SettingsError::Read { path, source }),
        }
    }

    /// The settings in `text` (read from `path`).
    pub fn parse(text: &str, path: &Path) -> Result<RegistrySettings, SettingsError> {
        let file: File = toml::from_str(text).map_err(|source| SettingsError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        let reference = |key: &str, value: &str| {
            value.parse::<Reference>().map_err(|source| SettingsError::Reference {
                path: path.to_path_buf(),
                key: key.to_string(),
                value: value.to_string(),
                source,
            })
        };
        let mut overrides = BTreeMap::new();
        for (from, to) in &file.overrides {
            overrides.insert(reference(from, from)?.whole(), reference(from, to)?);
        }
        Ok(RegistrySettings {
            insecure: file.insecure.into_iter().collect(),
            mirrors: file.mirrors,
            overrides,
            source: Some(path.to_path_buf()),
        })
    }

    /// The reference to pull for `wanted`: its override, if the settings have one.
    pub fn overridden(&self, wanted: &Reference) -> Option<&Reference> {
        self.overrides.get(&wanted.whole())
    }

    /// The mirrors of `registry`, in the order they are tried.
    pub fn mirrors(&self, registry: &str) -> &[String] {
        self.mirrors.get(registry).map(Vec::as_slice).unwrap_or_default()
    }

    /// Whether `registry` (`host[:port]`) is spoken to over plain HTTP: listed as insecure,
    /// or on loopback (as Docker does).
    pub fn plain_http(&self, registry: &str) -> bool {
        self.insecure.contains(registry) || is_loopback(registry)
    }
}

/// `localhost`, `127.x.y.z` or `[::1]`, with or without a port.
fn is_loopback(registry: &str) -> bool {
    let host = match registry.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(rest),
        None => registry.rsplit_once(':').map_or(registry, |(host, _)| host),
    };
    host == "localhost" || host == "::1" || host.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

/// The credentials for `registry`: `FARM_REGISTRY_USERNAME` and `FARM_REGISTRY_PASSWORD`
/// (for every registry), else the Docker config file's entry for it, else anonymous (the
/// registry may still hand out an anonymous bearer token).
pub fn credentials(registry: &str) -> RegistryAuth {
    if let (Ok(user), Ok(password)) = (
        std::env::var("FARM_REGISTRY_USERNAME"),
        std::env::var("FARM_REGISTRY_PASSWORD"),
    ) {
        return RegistryAuth::Basic(user, password);
    }
    docker_config_credentials(&docker_config_path(), registry).unwrap_or(RegistryAuth::Anonymous)
}

/// `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`.
fn docker_config_path() -> PathBuf {
    match std::env::var_os("DOCKER_CONFIG") {
        Some(dir) => PathBuf::from(dir).join("config.json"),
        None => std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/root"))
            .join(".docker/config.json"),
    }
}

/// A Docker config file's `auths` (other keys, such as credential helpers, are not read).
#[derive(Debug, Default, Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, DockerAuth>,
}

#[derive(Debug, Default, Deserialize)]
struct DockerAuth {
    /// base64 of `user:password`.
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

/// The entry for `registry` in the Docker config at `path`. Keys may carry a scheme and a
/// path (`https://index.docker.io/v1/` is Docker Hub's).
fn docker_config_credentials(path: &Path, registry: &str) -> Option<RegistryAuth> {
    let config: DockerConfig = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    let host_of = |key: &str| {
        let key = key.split_once("://").map_or(key, |(_, rest)| rest);
        let host = key.split('/').next().unwrap_or(key);
        if host == "index.docker.io" || host == "registry-1.docker.io" {
            "docker.io".to_string()
        } else {
            host.to_string()
        }
    };
    let wanted = if registry == "index.docker.io" {
        "docker.io"
    } else {
        registry
    };
    let entry = config.auths.iter().find(|(key, _)| host_of(key) == wanted)?.1;
    if let (Some(user), Some(password)) = (&entry.username, &entry.password) {
        return Some(RegistryAuth::Basic(user.clone(), password.clone()));
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(entry.auth.as_deref()?.trim())
        .ok()?;
    let (user, password) = std::str::from_utf8(&decoded).ok()?.split_once(':')?;
    Some(RegistryAuth::Basic(user.to_string(), password.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_name_the_bad_key_and_normalise_overrides() {
        let path = Path::new("/etc/registries.toml");
        let s = RegistrySettings::parse("insecure = [\"reg.lan:5000\"]\n[mirrors]\n\"docker.io\" = [\"m1:5000\", \"m2\"]\n[overrides]\n\"python:3.12\" = \"reg.lan:5000/py:1\"\n", path).unwrap();
        assert_eq!(s.mirrors("docker.io"), ["m1:5000", "m2"]);
        assert!(s.mirrors("quay.io").is_empty());
        let wanted: Reference = "docker.io/library/python:3.12".parse().unwrap();
        assert_eq!(s.overridden(&wanted).unwrap().whole(), "reg.lan:5000/py:1");
        assert!(
            s.plain_http("reg.lan:5000")
                && s.plain_http("127.0.0.1:5000")
                && s.plain_http("localhost")
                && s.plain_http("[::1]:80")
        );
        assert!(!s.plain_http("quay.io") && !s.plain_http("127.example.com:5000"));

        let err = RegistrySettings::parse("mirror = 1\n", path).unwrap_err();
        assert!(
            err.to_string()
                .contains("/etc/registries.toml is not a valid registries file"),
            "{err}"
        );
        let err = RegistrySettings::parse("[overrides]\n\"a:1\" = \"UPPER/Case:x\"\n", path).unwrap_err();
        assert!(
            err.to_string()
                .contains("[overrides] \"a:1\": \"UPPER/Case:x\" is not an image reference"),
            "{err}"
        );
    }

    #[test]
    fn docker_config_entries_match_by_host() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        let encoded = base64::engine::general_purpose::STANDARD.encode("amy:s3cret");
        std::fs::write(&path, format!(r#"{{"auths": {{"https://index.docker.io/v1/": {{"auth": "{encoded}"}}, "reg.lan:5000": {{"username": "bo", "password": "pw"}}}}}}"#)).unwrap();
        let basic = |auth: Option<RegistryAuth>| match auth {
            Some(RegistryAuth::Basic(user, password)) => Some((user, password)),
            _ => None,
        };
        assert_eq!(
            basic(docker_config_credentials(&path, "index.docker.io")),
            Some(("amy".into(), "s3cret".into()))
        );
        assert_eq!(
            basic(docker_config_credentials(&path, "reg.lan:5000")),
            Some(("bo".into(), "pw".into()))
        );
        assert_eq!(basic(docker_config_credentials(&path, "quay.io")), None);
    }
}
