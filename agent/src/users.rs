//! Guest users named in requests: `root`, `UID`, `UID:GID`, or a name from `/etc/passwd`.
//!
//! Numbers never touch `/etc/passwd`: the host names the scoring users by number, so a
//! rollout that rewrote the file (final-state scoring) cannot redirect them.

use std::path::Path;

/// Who a process runs as, or who owns a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    /// Home folder from `/etc/passwd` when the user was named.
    pub home: Option<String>,
}

impl User {
    pub const ROOT: User = User { uid: 0, gid: 0, home: None };

    pub fn is_root(&self) -> bool {
        self.uid == 0
    }
}

/// Resolves a user spec against the guest's `/etc/passwd`.
pub fn resolve(spec: &str) -> Result<User, String> {
    resolve_in(spec, Path::new("/etc/passwd"))
}

pub fn resolve_in(spec: &str, passwd: &Path) -> Result<User, String> {
    let spec = spec.trim();
    if spec == "root" {
        return Ok(User { home: Some("/root".into()), ..User::ROOT });
    }
    if let Some((uid, gid)) = spec.split_once(':') {
        let uid = uid.parse::<u32>().map_err(|_| format!("user {spec:?}: expected UID:GID with numbers"))?;
        let gid = gid.parse::<u32>().map_err(|_| format!("user {spec:?}: expected UID:GID with numbers"))?;
        return Ok(User { uid, gid, home: None });
    }
    if let Ok(uid) = spec.parse::<u32>() {
        return Ok(User { uid, gid: uid, home: None });
    }
    let text = std::fs::read_to_string(passwd).map_err(|e| format!("user {spec:?}: cannot read {}: {e}", passwd.display()))?;
    for line in text.lines() {
        let fields: Vec<&str> = line.split(':').collect();
        if fields.len() >= 6 && fields[0] == spec {
            let uid = fields[2].parse().map_err(|_| format!("user {spec:?}: bad uid in {}", passwd.display()))?;
            let gid = fields[3].parse().map_err(|_| format!("user {spec:?}: bad gid in {}", passwd.display()))?;
            return Ok(User { uid, gid, home: Some(fields[5].to_string()) });
        }
    }
    Err(format!("user {spec:?} is not in the guest's {}", passwd.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_names_and_root() {
        let dir = tempfile::tempdir().unwrap();
        let passwd = dir.path().join("passwd");
        std::fs::write(&passwd, "root:x:0:0:root:/root:/bin/sh\nfarm:x:1000:1000:farm:/home/farm:/bin/sh\nbad\n").unwrap();
        assert_eq!(resolve_in("root", &passwd).unwrap().uid, 0);
        assert_eq!(resolve_in("1000", &passwd).unwrap(), User { uid: 1000, gid: 1000, home: None });
        assert_eq!(resolve_in("999:5", &passwd).unwrap(), User { uid: 999, gid: 5, home: None });
        assert_eq!(resolve_in("farm", &passwd).unwrap(), User { uid: 1000, gid: 1000, home: Some("/home/farm".into()) });
        assert!(resolve_in("nobody", &passwd).unwrap_err().contains("not in the guest"));
        assert!(resolve_in("1:x", &passwd).is_err());
    }
}
