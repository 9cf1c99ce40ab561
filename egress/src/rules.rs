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

/// Checks a rule's syntax; the message names the field.
pub fn check_rule(rule: &Rule) -> Result<(), String> {
    let host = rule.host.strip_prefix("*.").unwrap_or(&rule.host);
    if host.is_empty() || host.contains(|c: char| c.is_whitespace() || "/@:*".contains(c)) {
        return Err(format!("host = {:?} is not a host name (or *.domain)", rule.host));
    }
    if rule.port == Some(0) {
        return Err("port = 0 is not a port".into());
    }
    for m in &rule.methods {
        if m.is_empty() || !m.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(format!(
                "methods: {m:?} is not an HTTP method in capitals (GET, HEAD, POST, ...)"
            ));
        }
    }
    for p in &rule.paths {
        if !p.starts_with('/') {
            return Err(format!("paths: {p:?} does not start with /"));
        }
    }
    if let Some(c) = &rule.credential {
        if c.header.is_empty() || !c.header.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err(format!("credential.header = {:?} is not a header name", c.header));
        }
        if c.env.is_some() == c.file.is_some() {
            return Err("credential needs exactly one of env (a variable of the host) or file".into());
        }
    }
    if let Some(g) = &rule.git_push {
        if g.refs.is_empty() || g.refs.iter().any(|r| !r.starts_with("refs/")) {
            return Err(
                "git_push.refs must list ref patterns starting with refs/ (e.g. \"refs/heads/agent/*\")".into(),
            );
        }
        if rule.paths.is_empty() {
            return Err("git_push needs paths: the repositories' path prefixes (e.g. \"/repo.git/\")".into());
        }
        if !rule.methods.is_empty() {
            return Err(
                "git_push sets its own methods (GET for the refs, POST for the push): leave methods out".into(),
            );
        }
    }
    Ok(())
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
    pub fn resolve(name: &str, rules: &[Rule]) -> Result<RuleSet, String> {
        let mut secrets = Vec::new();
        for (i, rule) in rules.iter().enumerate() {
            check_rule(rule).map_err(|e| format!("{name} rules[{i}]: {e}"))?;
            let secret = match &rule.credential {
                None => None,
                Some(c) => {
                    let value = match (&c.env, &c.file) {
                        (Some(var), _) => std::env::var(var)
                            .map_err(|_| format!("{name} rules[{i}].credential: the host variable {var} is not set"))?,
                        (None, Some(path)) => std::fs::read_to_string(path)
                            .map_err(|e| format!("{name} rules[{i}].credential: reading {}: {e}", path.display()))?
                            .lines()
                            .next()
                            .unwrap_or("")
                            .to_string(),
                        (None, None) => unreachable!("checked"),
                    };
                    if value.trim().is_empty() || value.contains(['\r', '\n']) {
                        return Err(format!(
                            "{name} rules[{i}].credential: the value is empty or holds a line break"
                        ));
                    }
                    Some(format!("{}{}", c.prefix, value.trim()))
                }
            };
            secrets.push(secret);
        }
        let ca = if rules.is_empty() {
            None
        } else {
            Some(std::sync::Arc::new(Ca::generate(name)?))
        };
        Ok(RuleSet {
            name: name.to_string(),
            rules: rules.to_vec(),
            secrets,
            ca,
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

    /// The first rule that allows `method` to `host:port` at `target` (path and query).
    pub fn decide(&self, method: &str, host: &str, port: u16, target: &str) -> Decision<'_> {
        let path = target.split('?').next().unwrap_or("");
        let query = target.split_once('?').map(|(_, q)| q).unwrap_or("");
        // A prefix means what it says only on a path in normal form: no `.` or `..` segments,
        // no empty ones, and no escaped `.`, `/` or `\` a server would decode into them.
        if let Some(why) = abnormal(path) {
            return Decision::Deny(format!(
                "{method} {host}:{port}{path}: {why}; rules of {} compare normal paths only",
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
                };
            }
        }
        Decision::Deny(format!("no rule of {} allows {method} {host}:{port}{path}", self.name))
    }
}

/// Why a request path is not in normal form, if it is not.
fn abnormal(path: &str) -> Option<&'static str> {
    if !path.starts_with('/') {
        return Some("the path does not start with /");
    }
    let lower = path.to_ascii_lowercase();
    if ["%2e", "%2f", "%5c"].iter().any(|e| lower.contains(e)) || path.contains('\\') {
        return Some("the path escapes a '.', '/' or '\\'");
    }
    if path[1..]
        .split('/')
        .enumerate()
        .any(|(i, seg)| seg == "." || seg == ".." || (seg.is_empty() && i + 1 < path[1..].split('/').count()))
    {
        return Some("the path has '.', '..' or empty segments");
    }
    None
}

/// One ref update of a push: `old new name` (ids in hex).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefUpdate {
    pub old: String,
    pub new: String,
    pub name: String,
}

impl RefUpdate {
    pub fn is_delete(&self) -> bool {
        !self.new.is_empty() && self.new.bytes().all(|b| b == b'0')
    }
}

/// Most bytes of ref-update commands read before the pack.
pub const MAX_COMMANDS: usize = 1 << 20;

/// The ref-update commands at the start of a `git-receive-pack` request body (pkt-lines up
/// to the first flush packet). Ok(None): more bytes are needed. Returns the updates and how
/// many bytes they took.
pub fn receive_pack_commands(body: &[u8]) -> Result<Option<(Vec<RefUpdate>, usize)>, String> {
    let mut at = 0;
    let mut updates = Vec::new();
    loop {
        if body.len() < at + 4 {
            return if at + 4 > MAX_COMMANDS {
                Err("the push's commands are too long".into())
            } else {
                Ok(None)
            };
        }
        let len_text = std::str::from_utf8(&body[at..at + 4]).map_err(|_| "not a pkt-line".to_string())?;
        let len = usize::from_str_radix(len_text, 16).map_err(|_| format!("not a pkt-line length: {len_text:?}"))?;
        if len == 0 {
            return if updates.is_empty() {
                Err("a push without ref updates".into())
            } else {
                Ok(Some((updates, at + 4)))
            };
        }
        if len < 4 {
            return Err(format!("a pkt-line of length {len} where commands belong"));
        }
        if at + len > MAX_COMMANDS {
            return Err("the push's commands are too long".into());
        }
        if body.len() < at + len {
            return Ok(None);
        }
        let line = &body[at + 4..at + len];
        let line = line.split(|b| *b == 0).next().unwrap_or(b""); // capabilities after NUL
        let line = std::str::from_utf8(line)
            .map_err(|_| "a ref update that is not text".to_string())?
            .trim_end_matches('\n');
        if line.starts_with("push-cert") || line.starts_with("shallow") {
            return Err(format!(
                "{:?} in a push is not supported by the push rule",
                line.split(' ').next().unwrap_or("")
            ));
        }
        let mut parts = line.splitn(3, ' ');
        let (old, new, name) = (
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
        );
        let hex = |s: &str| (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| b.is_ascii_hexdigit());
        if !hex(old) || !hex(new) || name.is_empty() {
            return Err(format!("not a ref update: {line:?}"));
        }
        updates.push(RefUpdate {
            old: old.into(),
            new: new.into(),
            name: name.into(),
        });
        at += len;
    }
}

/// Whether `name` matches `pattern` (`*` matches any run of characters, `/` included).
pub fn ref_matches(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            let Some(rest) = name.strip_prefix(head) else {
                return false;
            };
            (0..=rest.len())
                .filter(|&i| rest.is_char_boundary(i))
                .any(|i| ref_matches(tail, &rest[i..]))
        }
    }
}

/// Refuses the whole push when one update is outside the patterns, or deletes a ref the rule
/// may not delete.
pub fn check_push(rule: &GitPush, updates: &[RefUpdate]) -> Result<(), String> {
    for u in updates {
        if !rule.refs.iter().any(|p| ref_matches(p, &u.name)) {
            return Err(format!(
                "the push updates {}, which no pattern allows ({})",
                u.name,
                rule.refs.join(", ")
            ));
        }
        if u.is_delete() && !rule.allow_delete {
            return Err(format!(
                "the push deletes {}, and the rule does not allow deletion",
                u.name
            ));
        }
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
                git_push: None
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
        .unwrap_err();
        assert!(
            missing.contains("rules[0].credential") && missing.contains("FARM_TEST_EGRESS_MISSING"),
            "{missing}"
        );
        assert!(RuleSet::resolve("r", &[rule("host = \"a\"\nmethods = [\"get\"]")])
            .unwrap_err()
            .contains("methods"));
        assert!(RuleSet::resolve("r", &[rule("host = \"a\"\npaths = [\"x\"]")])
            .unwrap_err()
            .contains("paths"));
        assert!(RuleSet::resolve("r", &[rule("host = \"a/b\"")])
            .unwrap_err()
            .contains("host"));
    }

    fn pkt(line: &str) -> String {
        format!("{:04x}{line}", line.len() + 4)
    }

    #[test]
    fn a_push_is_read_from_its_commands_and_refused_whole_outside_the_patterns() {
        let (z, a, b) = ("0".repeat(40), "a".repeat(40), "b".repeat(40));
        let body = format!(
            "{}{}0000PACK...",
            pkt(&format!("{z} {a} refs/heads/agent/fix\0report-status side-band-64k\n")),
            pkt(&format!("{a} {b} refs/heads/agent/x/y\n"))
        );
        let (updates, used) = receive_pack_commands(body.as_bytes()).unwrap().unwrap();
        assert_eq!(&body[used..], "PACK...");
        assert_eq!(
            updates.iter().map(|u| u.name.as_str()).collect::<Vec<_>>(),
            ["refs/heads/agent/fix", "refs/heads/agent/x/y"]
        );
        assert_eq!(
            receive_pack_commands(&body.as_bytes()[..30]).unwrap(),
            None,
            "more bytes needed"
        );
        let rule = GitPush {
            refs: vec!["refs/heads/agent/*".into()],
            allow_delete: false,
        };
        assert!(check_push(&rule, &updates).is_ok());
        let main = vec![
            updates[0].clone(),
            RefUpdate {
                old: a.clone(),
                new: b.clone(),
                name: "refs/heads/main".into(),
            },
        ];
        assert!(
            check_push(&rule, &main).unwrap_err().contains("refs/heads/main"),
            "one bad ref refuses the whole push"
        );
        let tag = vec![RefUpdate {
            old: z.clone(),
            new: a.clone(),
            name: "refs/tags/v1".into(),
        }];
        assert!(check_push(&rule, &tag).is_err());
        let delete = vec![RefUpdate {
            old: a.clone(),
            new: z.clone(),
            name: "refs/heads/agent/old".into(),
        }];
        assert!(check_push(&rule, &delete).unwrap_err().contains("deletes"));
        assert!(check_push(
            &GitPush {
                allow_delete: true,
                ..rule.clone()
            },
            &delete
        )
        .is_ok());
        for bad in [
            "zzzz",
            "0003",
            &pkt("not an update\n"),
            &format!("{}0000", pkt(&format!("push-cert\0{a}\n"))),
        ] {
            assert!(receive_pack_commands(bad.as_bytes()).is_err(), "{bad}");
        }
        assert!(
            ref_matches("refs/heads/*", "refs/heads/a/b") && !ref_matches("refs/heads/agent/*", "refs/heads/agentx")
        );
    }
}
