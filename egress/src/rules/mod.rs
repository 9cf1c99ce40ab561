//! Egress rules beyond hosts: which requests a guest may send, by host, port, HTTP method and
//! path prefix; credentials the host's proxy adds to matching requests (the guest never holds
//! them); and `git push` over smart HTTP limited to refs matching a pattern.
//!
//! A host that any rule names is *inspected*: the proxy ([`crate::spawn`]) reads every request
//! on the connection and lets through only those a rule allows. Hosts on the plain allowlist
//! (`allow = ["host:port"]`) are passed through as before, whatever is sent.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::ca::Ca;

mod push;

pub use push::{check_push, receive_pack_commands, ref_matches, PushError, RefUpdate, MAX_COMMANDS};

/// `[[... .network.rules]]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// A host name (`api.example.com`, `host.farm.internal`), or `*.example.com` for its
    /// subdomains. Compared without case.
    pub host: String,
    /// The port; any when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Methods allowed (`GET`, `HEAD`, `POST`, ...); any when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// Path prefixes allowed (each starts with `/`); any path when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// A header the proxy sets on every request this rule allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<Credential>,
    /// This rule allows `git push` (smart HTTP) to the repositories under `paths`, and only
    /// that: the ref updates are read before anything reaches the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_push: Option<GitPush>,
    /// Requests this rule allows may carry a body whatever their method. By default only
    /// POST, PUT and PATCH do: a server that does not read, say, a GET's body would take it
    /// for the next request on the connection, one no rule checked.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_bodies: bool,
}

/// A credential the proxy adds: `header: prefix + value`, the value read on the host from the
/// variable `env` or the file `file` (its first line) when the rules are loaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Credential {
    pub header: String,
    #[serde(default)]
    pub prefix: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
}

/// Refs a push may update (`refs/heads/agent/*`: `*` matches any run of characters).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GitPush {
    pub refs: Vec<String>,
    /// Whether a push may delete a matching ref.
    #[serde(default)]
    pub allow_delete: bool,
}

/// What is wrong with a rule; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("host = {0:?} is not a host name (or *.domain)")]
    Host(String),
    #[error("port = 0 is not a port")]
    Port,
    #[error("methods: {0:?} is not an HTTP method in capitals (GET, HEAD, POST, ...)")]
    Method(String),
    #[error("paths: {path:?} {why}")]
    Path { path: String, why: PathError },
    #[error("credential.header = {0:?} is not a header name")]
    CredentialHeader(String),
    #[error("credential needs exactly one of env (a variable of the host) or file")]
    CredentialSource,
    #[error("git_push.refs must list ref patterns starting with refs/ (e.g. \"refs/heads/agent/*\")")]
    GitPushRefs,
    #[error("git_push needs paths: the repositories' path prefixes (e.g. \"/repo.git/\")")]
    GitPushPaths,
    #[error("git_push sets its own methods (GET for the refs, POST for the push): leave methods out")]
    GitPushMethods,
}

/// Checks a rule's syntax.
pub fn check_rule(rule: &Rule) -> Result<(), RuleError> {
    let host = rule.host.strip_prefix("*.").unwrap_or(&rule.host);
    if host.is_empty() || host.contains(|c: char| c.is_whitespace() || "/@:*".contains(c)) {
        return Err(RuleError::Host(rule.host.clone()));
    }
    if rule.port == Some(0) {
        return Err(RuleError::Port);
    }
    if let Some(m) = rule
        .methods
        .iter()
        .find(|m| m.is_empty() || !m.bytes().all(|b| b.is_ascii_uppercase()))
    {
        return Err(RuleError::Method(m.clone()));
    }
    for p in &rule.paths {
        // A prefix is compared with paths in normal form, so it must be one itself.
        if let Err(why) = normal_path(p) {
            return Err(RuleError::Path { path: p.clone(), why });
        }
    }
    if let Some(c) = &rule.credential {
        if c.header.is_empty() || !c.header.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err(RuleError::CredentialHeader(c.header.clone()));
        }
        if c.env.is_some() == c.file.is_some() {
            return Err(RuleError::CredentialSource);
        }
    }
    if let Some(g) = &rule.git_push {
        if g.refs.is_empty() || g.refs.iter().any(|r| !r.starts_with("refs/")) {
            return Err(RuleError::GitPushRefs);
        }
        if rule.paths.is_empty() {
            return Err(RuleError::GitPushPaths);
        }
        if !rule.methods.is_empty() {
            return Err(RuleError::GitPushMethods);
        }
    }
    Ok(())
}

/// Why a rule set could not be made: the rule (`{name} rules[{index}]`) and what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("{name} rules[{index}]: {error}")]
    Rule {
        name: String,
        index: usize,
        error: RuleError,
    },
    #[error("{name} rules[{index}].credential: the host variable {variable} is not set")]
    CredentialVariable {
        name: String,
        index: usize,
        variable: String,
    },
    #[error("{name} rules[{index}].credential: reading {}", path.display())]
    CredentialFile {
        name: String,
        index: usize,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{name} rules[{index}].credential: the value is empty or holds a line break")]
    CredentialValue { name: String, index: usize },
    #[error("{name}: making the egress CA")]
    Ca {
        name: String,
        #[source]
        source: crate::ca::CaError,
    },
}

/// Rules with their credentials read: what a VM's proxy applies.
#[derive(Clone, Default)]
pub struct RuleSet {
    /// Where the rules come from, for the 403 and the log (`suite x [rollouts.network]`).
    pub name: String,
    rules: Vec<Rule>,
    /// Each rule's header value, when it has a credential.
    secrets: Vec<Option<String>>,
    /// Answers inspected HTTPS hosts (made when there are rules).
    ca: Option<std::sync::Arc<Ca>>,
    /// The addresses the rules' hosts resolve to, looked up when first needed and again
    /// after [`ADDRESSES_FOR`].
    addresses: std::sync::Arc<tokio::sync::Mutex<Option<Resolved>>>,
}

/// How long resolved rule addresses are used before they are looked up again.
const ADDRESSES_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// The rules' addresses, and when they were resolved.
type Resolved = (std::time::Instant, Vec<Bound>);

/// An address an inspected host is reached at, with the rule's port.
#[derive(Debug, Clone)]
struct Bound {
    host: String,
    port: Option<u16>,
    ip: std::net::IpAddr,
}

impl std::fmt::Debug for RuleSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secrets.
        f.debug_struct("RuleSet")
            .field("name", &self.name)
            .field("rules", &self.rules.len())
            .finish()
    }
}

/// What the proxy does with one request.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision<'a> {
    Allow {
        rule: usize,
        /// (header, value) to set.
        credential: Option<(&'a str, &'a str)>,
        git_push: Option<&'a GitPush>,
        /// The rule's `allow_bodies`.
        bodies: bool,
    },
    Deny(String),
}

fn host_matches(pattern: &str, host: &str) -> bool {
    let (pattern, host) = (pattern.to_ascii_lowercase(), host.to_ascii_lowercase());
    match pattern.strip_prefix("*.") {
        Some(domain) => host.ends_with(&format!(".{domain}")),
        None => pattern == host,
    }
}

impl RuleSet {
    /// Checks the rules and reads their credentials on the host; errors name the rule.
    pub fn resolve(name: &str, rules: &[Rule]) -> Result<RuleSet, ResolveError> {
        let mut secrets = Vec::new();
        for (index, rule) in rules.iter().enumerate() {
            let name = name.to_string();
            check_rule(rule).map_err(|error| ResolveError::Rule {
                name: name.clone(),
                index,
                error,
            })?;
            let secret = match &rule.credential {
                None => None,
                Some(c) => {
                    let value = match (&c.env, &c.file) {
                        (Some(variable), _) => {
                            std::env::var(variable).map_err(|_| ResolveError::CredentialVariable {
                                name: name.clone(),
                                index,
                                variable: variable.clone(),
                            })?
                        }
                        (None, Some(path)) => std::fs::read_to_string(path)
                            .map_err(|source| ResolveError::CredentialFile {
                                name: name.clone(),
                                index,
                                path: path.clone(),
                                source,
                            })?
                            .lines()
                            .next()
                            .unwrap_or("")
                            .to_string(),
                        (None, None) => unreachable!("checked"),
                    };
                    if value.trim().is_empty() || value.contains(['\r', '\n']) {
                        return Err(ResolveError::CredentialValue { name, index });
                    }
                    Some(format!("{}{}", c.prefix, value.trim()))
                }
            };
            secrets.push(secret);
        }
        let ca = if rules.is_empty() {
            None
        } else {
            let ca = Ca::generate(name).map_err(|source| ResolveError::Ca {
                name: name.to_string(),
                source,
            })?;
            Some(std::sync::Arc::new(ca))
        };
        Ok(RuleSet {
            name: name.to_string(),
            rules: rules.to_vec(),
            secrets,
            ca,
            addresses: Default::default(),
        })
    }

    /// The CA guests must trust for inspected HTTPS hosts (None without rules).
    pub fn ca(&self) -> Option<&std::sync::Arc<Ca>> {
        self.ca.as_ref()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Whether any rule names `host:port` (its requests are inspected).
    pub fn inspects(&self, host: &str, port: u16) -> bool {
        self.rules
            .iter()
            .any(|r| host_matches(&r.host, host) && r.port.is_none_or(|p| p == port))
    }

    /// Whether any of `addresses` (a name's, resolved on the host) is where a rule's host is
    /// reached, whatever name was used: the rule's host name, when so. Wildcard rules
    /// (`*.example.com`) are bound by name only: their hosts cannot be listed.
    pub async fn inspected_at(&self, addresses: &[std::net::SocketAddr]) -> Option<String> {
        if self.rules.is_empty() {
            return None;
        }
        let bound = {
            let mut cache = self.addresses.lock().await;
            match &*cache {
                Some((when, bound)) if when.elapsed() < ADDRESSES_FOR => bound.clone(),
                _ => {
                    let bound = self.bind().await;
                    *cache = Some((std::time::Instant::now(), bound.clone()));
                    bound
                }
            }
        };
        let local = crate::destination::LocalAddresses::probe();
        addresses.iter().find_map(|address| {
            bound
                .iter()
                .find(|b| b.port.is_none_or(|p| p == address.port()) && local.same_destination(b.ip, address.ip()))
                .map(|b| match b.port {
                    Some(port) => format!("{}:{port}", b.host),
                    None => b.host.clone(),
                })
        })
    }

    /// The addresses of the rules' hosts (those that resolve; wildcards have none).
    async fn bind(&self) -> Vec<Bound> {
        let mut bound = Vec::new();
        for rule in self.rules.iter().filter(|r| !r.host.starts_with("*.")) {
            let lookup = crate::destination::resolve(&rule.host, rule.port.unwrap_or(80));
            if let Ok(Ok(addresses)) = tokio::time::timeout(crate::destination::UPSTREAM_TIMEOUT, lookup).await {
                bound.extend(addresses.into_iter().map(|a| Bound {
                    host: rule.host.clone(),
                    port: rule.port,
                    ip: a.ip(),
                }));
            }
        }
        bound
    }

    /// The first rule that allows `method` to `host:port` at `target` (path and query).
    pub fn decide(&self, method: &str, host: &str, port: u16, target: &str) -> Decision<'_> {
        let path = target.split('?').next().unwrap_or("");
        let query = target.split_once('?').map(|(_, q)| q).unwrap_or("");
        // A prefix means what it says only on a path every server reads the same way (see
        // [`normal_path`]).
        if let Err(why) = normal_path(path) {
            return Decision::Deny(format!(
                "{method} {host}:{port}{path}: the path {why}; rules of {} compare paths in normal form only",
                self.name
            ));
        }
        for (i, rule) in self.rules.iter().enumerate() {
            if !host_matches(&rule.host, host) || rule.port.is_some_and(|p| p != port) {
                continue;
            }
            let under =
                |prefixes: &[String]| prefixes.is_empty() || prefixes.iter().any(|p| path.starts_with(p.as_str()));
            let allowed = match &rule.git_push {
                // Only the two requests of a push: the refs advertisement and the push itself.
                Some(_) => {
                    under(&rule.paths)
                        && ((method == "GET"
                            && path.ends_with("/info/refs")
                            && query
                                .split('&')
                                .filter(|kv| kv.starts_with("service="))
                                .eq(["service=git-receive-pack"]))
                            || (method == "POST" && path.ends_with("/git-receive-pack")))
                }
                None => (rule.methods.is_empty() || rule.methods.iter().any(|m| m == method)) && under(&rule.paths),
            };
            if allowed {
                let credential = rule
                    .credential
                    .as_ref()
                    .zip(self.secrets[i].as_deref())
                    .map(|(c, v)| (c.header.as_str(), v));
                let git_push = rule.git_push.as_ref().filter(|_| method == "POST");
                return Decision::Allow {
                    rule: i,
                    credential,
                    git_push,
                    bodies: rule.allow_bodies,
                };
            }
        }
        Decision::Deny(format!("no rule of {} allows {method} {host}:{port}{path}", self.name))
    }
}

/// Why a path is not in normal form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("does not start with /")]
    NotAbsolute,
    #[error("holds {0}, which is outside the characters paths may have (letters, digits, - . _ ~ ! $ & ' ( ) * + , = : @ / and %XX escapes)")]
    Character(String),
    #[error("holds a malformed %-escape")]
    BadEscape,
    #[error("escapes bytes that are not UTF-8 (an overlong or invalid sequence)")]
    NotUtf8,
    #[error("escapes {0}, which a server could decode into another path")]
    EscapedDelimiter(char),
    #[error("has '.', '..' or empty segments")]
    DotSegment,
}

/// Checks that `path` reads the same to every server: it starts with `/`; it has only
/// unreserved characters, the sub-delimiters but `;` (which Tomcat and Jetty read as
/// path parameters: `/a/..;/b`), `:`, `@`, `/` and `%XX` escapes; the escapes decode to
/// UTF-8 (no overlong `%c0%ae`) and to none of `.`, `/`, `\`, `;`, `%` (so no `%2e%2e`, no
/// double encoding `%252e`) or a control character; and no segment is `.`, `..` or empty
/// (but a trailing `/`).
pub fn normal_path(path: &str) -> Result<(), PathError> {
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    let bytes = path.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let byte = bytes[at];
        if byte == b'%' {
            let hex = |b: u8| (b as char).to_digit(16);
            let (Some(high), Some(low)) = (
                bytes.get(at + 1).and_then(|b| hex(*b)),
                bytes.get(at + 2).and_then(|b| hex(*b)),
            ) else {
                return Err(PathError::BadEscape);
            };
            let value = (high * 16 + low) as u8;
            if matches!(value, b'.' | b'/' | b'\\' | b';' | b'%') {
                return Err(PathError::EscapedDelimiter(value as char));
            }
            if value < 0x20 || value == 0x7f {
                return Err(PathError::EscapedDelimiter(value as char));
            }
            decoded.push(value);
            at += 3;
            continue;
        }
        let allowed = byte.is_ascii_alphanumeric() || b"-._~!$&'()*+,=:@/".contains(&byte);
        if !allowed {
            let shown = if byte.is_ascii_graphic() {
                format!("{:?}", byte as char)
            } else {
                format!("the byte 0x{byte:02x}")
            };
            return Err(PathError::Character(shown));
        }
        decoded.push(byte);
        at += 1;
    }
    if std::str::from_utf8(&decoded).is_err() {
        return Err(PathError::NotUtf8);
    }
    let segments: Vec<&str> = path[1..].split('/').collect();
    let last = segments.len() - 1;
    if segments
        .iter()
        .enumerate()
        .any(|(i, seg)| *seg == "." || *seg == ".." || (seg.is_empty() && i < last))
    {
        return Err(PathError::DotSegment);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(toml_text: &str) -> Rule {
        toml::from_str(toml_text).unwrap()
    }

    #[test]
    fn requests_are_allowed_by_host_port_method_and_path_and_nothing_else() {
        std::env::set_var("FARM_TEST_EGRESS_TOKEN", "s3cret");
        let rules = vec![
            rule("host = \"pypi.internal\"\nmethods = [\"GET\", \"HEAD\"]\npaths = [\"/simple/\", \"/packages/\"]"),
            rule("host = \"api.internal\"\nport = 8443\nmethods = [\"POST\"]\npaths = [\"/v1/run\"]\ncredential = { header = \"Authorization\", prefix = \"Bearer \", env = \"FARM_TEST_EGRESS_TOKEN\" }"),
            rule("host = \"*.git.internal\"\npaths = [\"/repo.git/\"]\ngit_push = { refs = [\"refs/heads/agent/*\"] }"),
        ];
        let set = RuleSet::resolve("suite s [rollouts.network]", &rules).unwrap();
        assert!(!format!("{set:?}").contains("s3cret"), "Debug shows no secret");
        assert!(matches!(
            set.decide("GET", "PyPI.internal", 80, "/simple/requests/"),
            Decision::Allow {
                rule: 0,
                credential: None,
                ..
            }
        ));
        assert!(matches!(
            set.decide("POST", "pypi.internal", 80, "/simple/x"),
            Decision::Deny(_)
        ));
        assert!(matches!(
            set.decide("GET", "pypi.internal", 80, "/admin"),
            Decision::Deny(_)
        ));
        assert_eq!(
            set.decide("POST", "api.internal", 8443, "/v1/run?x=1"),
            Decision::Allow {
                rule: 1,
                credential: Some(("Authorization", "Bearer s3cret")),
                git_push: None,
                bodies: false
            }
        );
        assert!(
            matches!(set.decide("POST", "api.internal", 443, "/v1/run"), Decision::Deny(_)),
            "another port"
        );
        let denied = set.decide("DELETE", "evil.com", 80, "/");
        assert_eq!(
            denied,
            Decision::Deny("no rule of suite s [rollouts.network] allows DELETE evil.com:80/".into())
        );
        // git push: the refs advertisement and the push; not a fetch, not another repository.
        assert!(matches!(
            set.decide(
                "GET",
                "a.git.internal",
                80,
                "/repo.git/info/refs?service=git-receive-pack"
            ),
            Decision::Allow {
                rule: 2,
                git_push: None,
                ..
            }
        ));
        assert!(matches!(
            set.decide("POST", "a.git.internal", 80, "/repo.git/git-receive-pack"),
            Decision::Allow {
                rule: 2,
                git_push: Some(_),
                ..
            }
        ));
        assert!(matches!(
            set.decide(
                "GET",
                "a.git.internal",
                80,
                "/repo.git/info/refs?service=git-upload-pack"
            ),
            Decision::Deny(_)
        ));
        assert!(matches!(
            set.decide("POST", "a.git.internal", 80, "/other.git/git-receive-pack"),
            Decision::Deny(_)
        ));
        assert!(
            matches!(
                set.decide("POST", "git.internal", 80, "/repo.git/git-receive-pack"),
                Decision::Deny(_)
            ),
            "*.x is the subdomains"
        );
        assert!(set.inspects("pypi.internal", 80) && !set.inspects("pypi.org", 443));
        // Paths that a server would read as another place are refused, whatever the prefix.
        for sneaky in [
            "/repo.git/../other.git/git-receive-pack",
            "/repo.git/%2e%2e/other.git/git-receive-pack",
            "/repo.git//git-receive-pack",
            "/simple/./x",
            "/simple/%2F..%2fadmin",
            "/simple\\..\\admin",
            // Servers that walk what others do not: path parameters (Tomcat, Jetty), double
            // encoding, overlong and invalid UTF-8, bytes outside the documented set.
            "/simple/..;/admin",
            "/simple/x;jsessionid=1",
            "/repo.git/%252e%252e/other.git/git-receive-pack",
            "/simple/%25",
            "/simple/%c0%ae%c0%ae/admin",
            "/simple/%e0%80%ae",
            "/simple/%ff",
            "/simple/%2",
            "/simple/%zz",
            "/simple/a b",
            "/simple/\u{e9}",
            "/simple/%00",
            "/simple/x\"y",
            "/simple/<x>",
        ] {
            let method = if sneaky.starts_with("/repo") { "POST" } else { "GET" };
            assert!(
                matches!(set.decide(method, "a.git.internal", 80, sneaky), Decision::Deny(_))
                    && matches!(set.decide(method, "pypi.internal", 80, sneaky), Decision::Deny(_)),
                "{sneaky}"
            );
        }
        assert!(
            matches!(
                set.decide("GET", "pypi.internal", 80, "/simple/"),
                Decision::Allow { .. }
            ),
            "a trailing / is fine"
        );
        for fine in [
            "/simple/requests/",
            "/simple/a-b_c.d~e/",
            "/simple/%C3%A9t%C3%A9/",
            "/simple/x@1:2+3,4=5",
        ] {
            assert!(
                matches!(set.decide("GET", "pypi.internal", 80, fine), Decision::Allow { .. }),
                "{fine}"
            );
        }
        assert!(
            check_rule(&rule("host = \"a\"\npaths = [\"/x/..;/\"]")).is_err(),
            "a rule's prefix must be a normal path itself"
        );
        assert!(
            matches!(
                set.decide(
                    "GET",
                    "a.git.internal",
                    80,
                    "/repo.git/info/refs?service=git-upload-pack&service=git-receive-pack"
                ),
                Decision::Deny(_)
            ),
            "one service only"
        );
        // Bad rules name the field; a missing credential names the variable.
        std::env::remove_var("FARM_TEST_EGRESS_MISSING");
        let missing = RuleSet::resolve(
            "r",
            &[rule(
                "host = \"a\"\ncredential = { header = \"X-Key\", env = \"FARM_TEST_EGRESS_MISSING\" }",
            )],
        )
        .unwrap_err()
        .to_string();
        assert!(
            missing.contains("rules[0].credential") && missing.contains("FARM_TEST_EGRESS_MISSING"),
            "{missing}"
        );
        assert!(RuleSet::resolve("r", &[rule("host = \"a\"\nmethods = [\"get\"]")])
            .unwrap_err()
            .to_string()
            .contains("methods"));
        assert!(RuleSet::resolve("r", &[rule("host = \"a\"\npaths = [\"x\"]")])
            .unwrap_err()
            .to_string()
            .contains("paths"));
        assert!(RuleSet::resolve("r", &[rule("host = \"a/b\"")])
            .unwrap_err()
            .to_string()
            .contains("host"));
    }
}
