//! Guest users named in requests: `root`, `UID`, `UID:GID`, or a name from `/etc/passwd`.
//!
//! Numbers never touch `/etc/passwd`: the host names the scoring users by number, so a
//! rollout that rewrote the file (final-state scoring) cannot redirect them.

use std::path::{Path, PathBuf};

/// Who a process runs as, or who owns a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    /// Home folder from `/etc/passwd` when the user was named.
    pub home: Option<String>,
}

impl User {
    pub const ROOT: User = User {
        uid: 0,
        gid: 0,
        home: None,
    };

    pub fn is_root(&self) -> bool {
        self.uid == 0
    }
}

/// Why a user spec names no user.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("user {spec:?}: expected UID:GID with numbers")]
    NotNumbers { spec: String },
    #[error("user {spec:?}: cannot read {}", passwd.display())]
    ReadPasswd {
        spec: String,
        passwd: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("user {spec:?}: bad {field} in {}", passwd.display())]
    BadId {
        spec: String,
        field: &'static str,
        passwd: PathBuf,
    },
    #[error("user {spec:?} is not in the guest's {}", passwd.display())]
    Unknown { spec: String, passwd: PathBuf },
}

/// Resolves a user spec against the guest's `/etc/passwd`.
pub fn resolve(spec: &str) -> Result<User, UserError> {
    resolve_in(spec, Path::new("/etc/passwd"))
}

pub fn resolve_in(spec: &str, passwd: &Path) -> Result<User, UserError> {
    let spec = spec.trim();
    if spec == "root" {
        return Ok(User {
            home: Some("/root".into()),
            ..User::ROOT
        });
    }
    if let Some((uid, gid)) = spec.split_once(':') {
        let (Ok(uid), Ok(gid)) = (uid.parse::<u32>(), gid.parse::<u32>()) else {
            return Err(UserError::NotNumbers { spec: spec.to_string() });
        };
        return Ok(User { uid, gid, home: None });
    }
    if let Ok(uid) = spec.parse::<u32>() {
        return Ok(User {
            uid,
            gid: uid,
            home: None,
        });
    }
    let text = std::fs::read_to_string(passwd).map_err(|source| UserError::ReadPasswd {
        spec: spec.to_string(),
        passwd: passwd.to_path_buf(),
        source,
    })?;
    let bad = |field| UserError::BadId {
        spec: spec.to_string(),
        field,
        passwd: passwd.to_path_buf(),
    };
    for line in text.lines() {
        let fields: Vec<&str> = line.split(':').collect();
        if fields.len() >= 6 && fields[0] == spec {
            let uid = fields[2].parse().map_err(|_| bad("uid"))?;
            let gid = fields[3].parse().map_err(|_| bad("gid"))?;
            return Ok(User {
                uid,
                gid,
                home: Some(fields[5].to_string()),
            });
        }
    }
    Err(UserError::Unknown {
        spec: spec.to_string(),
        passwd: passwd.to_path_buf(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_names_and_root() {
        let dir = tempfile::tempdir().unwrap();
        let passwd = dir.path().join("passwd");
        std::fs::write(
            &passwd,
            "root:x:0:0:root:/root:/bin/sh\nfarm:x:1000:1000:farm:/home/farm:/bin/sh\nbad\n",
        )
        .unwrap();
        assert_eq!(resolve_in("root", &passwd).unwrap().uid, 0);
        assert_eq!(
            resolve_in("1000", &passwd).unwrap(),
            User {
                uid: 1000,
                gid: 1000,
                home: None
            }
        );
        assert_eq!(
            resolve_in("999:5", &passwd).unwrap(),
            User {
                uid: 999,
                gid: 5,
                home: None
            }
        );
        assert_eq!(
            resolve_in("farm", &passwd).unwrap(),
            User {
                uid: 1000,
                gid: 1000,
                home: Some("/home/farm".into())
            }
        );
        assert!(resolve_in("nobody", &passwd)
            .unwrap_err()
            .to_string()
            .contains("not in the guest"));
        let missing = resolve_in("x", &dir.path().join("missing")).unwrap_err();
        assert!(matches!(missing, UserError::ReadPasswd { .. }));
        let text = crate::describe(&missing);
        assert!(
            text.contains("cannot read") && text.matches("No such file").count() == 1,
            "the cause once: {text}"
        );
        assert!(resolve_in("1:x", &passwd).is_err());
    }
}
