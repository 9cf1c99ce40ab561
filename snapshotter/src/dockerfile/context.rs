//! The build context: the folder `COPY` and `ADD` read from, minus what `.dockerignore`
//! leaves out. Sources are paths or wildcards relative to it; nothing outside it is read,
//! and no symbolic link is followed (a link is copied as a link), so a task folder cannot
//! pull a host file into an image.

use std::path::{Component, Path, PathBuf};

use globset::{Glob, GlobBuilder, GlobMatcher};

/// Most bytes one `COPY` may read from the context.
const MAX_COPY_BYTES: u64 = 4 << 30;

/// A build context folder and its ignore rules.
pub struct Context {
    root: PathBuf,
    /// `.dockerignore` patterns in order, with `!` (re-include) marked true.
    ignore: Vec<(GlobMatcher, bool)>,
}

/// One thing to copy into the image.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    File { bytes: Vec<u8>, mode: u32 },
    Dir { mode: u32 },
    Symlink { target: String },
}

/// A source matched in the context.
#[derive(Debug, Clone, PartialEq)]
pub struct Selected {
    /// Path relative to the context (`.` for the context itself).
    pub rel: String,
    pub is_dir: bool,
}

/// Why the context could not give what a `COPY` asked for.
#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    #[error("{pattern:?} in .dockerignore is not a valid pattern")]
    Pattern {
        pattern: String,
        #[source]
        source: globset::Error,
    },
    #[error("{source_path:?} is outside the build context")]
    Outside { source_path: String },
    #[error("{source_path:?} is not in the build context {} (or .dockerignore leaves it out)", root.display())]
    NotFound { source_path: String, root: PathBuf },
    #[error("no file in the build context matches {source_path:?}")]
    NoMatch { source_path: String },
    #[error("reading {} failed", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the sources add up to more than {} GiB", MAX_COPY_BYTES >> 30)]
    TooLarge,
}

impl Context {
    /// The context at `root`, with its `.dockerignore` if there is one.
    pub fn open(root: &Path) -> Result<Context, ContextError> {
        let mut ignore = Vec::new();
        if let Ok(text) = std::fs::read_to_string(root.join(".dockerignore")) {
            for line in text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
            {
                let (negated, pattern) = match line.strip_prefix('!') {
                    Some(p) => (true, p.trim()),
                    None => (false, line),
                };
                let cleaned = clean(pattern).unwrap_or_default();
                let glob = GlobBuilder::new(&cleaned)
                    .literal_separator(true)
                    .build()
                    .map_err(|source| ContextError::Pattern {
                        pattern: line.to_string(),
                        source,
                    })?;
                ignore.push((glob.compile_matcher(), negated));
            }
        }
        Ok(Context {
            root: root.to_path_buf(),
            ignore,
        })
    }

    /// Whether `.dockerignore` leaves `rel` out: the last pattern matching it or one of its
    /// parent folders decides.
    fn ignored(&self, rel: &str) -> bool {
        let mut ignored = false;
        let mut prefixes = vec![rel];
        prefixes.extend(rel.match_indices('/').map(|(at, _)| &rel[..at]));
        for (matcher, negated) in &self.ignore {
            if prefixes.iter().any(|p| matcher.is_match(p)) {
                ignored = !negated;
            }
        }
        ignored
    }

    /// What one source names: a path, or every path a wildcard matches.
    pub fn select(&self, source: &str) -> Result<Vec<Selected>, ContextError> {
        let rel = clean(source).ok_or_else(|| ContextError::Outside {
            source_path: source.to_string(),
        })?;
        if !rel.contains(['*', '?', '[']) {
            let path = self.root.join(&rel);
            let meta = std::fs::symlink_metadata(&path).map_err(|_| ContextError::NotFound {
                source_path: source.to_string(),
                root: self.root.clone(),
            })?;
            if rel != "." && self.ignored(&rel) {
                return Err(ContextError::NotFound {
                    source_path: source.to_string(),
                    root: self.root.clone(),
                });
            }
            return Ok(vec![Selected {
                rel,
                is_dir: meta.is_dir(),
            }]);
        }
        let glob = Glob::new(&rel).map_err(|source_err| ContextError::Pattern {
            pattern: source.to_string(),
            source: source_err,
        })?;
        let glob = GlobBuilder::new(glob.glob())
            .literal_separator(true)
            .build()
            .expect("already parsed")
            .compile_matcher();
        let mut found = Vec::new();
        for (rel, is_dir) in self.walk(".")? {
            if glob.is_match(&rel) {
                found.push(Selected { rel, is_dir });
            }
        }
        if found.is_empty() {
            return Err(ContextError::NoMatch {
                source_path: source.to_string(),
            });
        }
        Ok(found)
    }

    /// The entries of `selected`: the file itself, or everything under the folder (as
    /// paths relative to it), folders before what they hold.
    pub fn entries(&self, selected: &Selected) -> Result<Vec<(String, Entry)>, ContextError> {
        let mut out = Vec::new();
        let mut total = 0u64;
        let items = if selected.is_dir {
            self.walk(&selected.rel)?
        } else {
            vec![(selected.rel.clone(), false)]
        };
        for (rel, _) in items {
            let path = self.root.join(&rel);
            let read = |source| ContextError::Read {
                path: path.clone(),
                source,
            };
            let meta = std::fs::symlink_metadata(&path).map_err(read)?;
            let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777;
            let entry = if meta.file_type().is_symlink() {
                Entry::Symlink {
                    target: std::fs::read_link(&path).map_err(read)?.to_string_lossy().into_owned(),
                }
            } else if meta.is_dir() {
                Entry::Dir { mode }
            } else if meta.is_file() {
                total += meta.len();
                if total > MAX_COPY_BYTES {
                    return Err(ContextError::TooLarge);
                }
                Entry::File {
                    bytes: std::fs::read(&path).map_err(read)?,
                    mode,
                }
            } else {
                continue; // sockets, FIFOs and devices are not copied
            };
            let inside = if selected.is_dir {
                rel.strip_prefix(&selected.rel)
                    .unwrap_or(&rel)
                    .trim_start_matches('/')
                    .to_string()
            } else {
                String::new()
            };
            if !(selected.is_dir && inside.is_empty()) {
                out.push((inside, entry));
            }
        }
        Ok(out)
    }

    /// Every path under `rel` (itself included, when a folder), not ignored, sorted, with
    /// whether it is a folder. Links are not followed.
    fn walk(&self, rel: &str) -> Result<Vec<(String, bool)>, ContextError> {
        let mut out = Vec::new();
        let mut pending = vec![rel.to_string()];
        while let Some(dir) = pending.pop() {
            let path = self.root.join(&dir);
            let read = |source| ContextError::Read {
                path: path.clone(),
                source,
            };
            for entry in std::fs::read_dir(&path).map_err(read)? {
                let entry = entry.map_err(read)?;
                let name = entry.file_name().to_string_lossy().into_owned();
                let child = if dir == "." { name } else { format!("{dir}/{name}") };
                if self.ignored(&child) {
                    continue;
                }
                let is_dir = entry.file_type().map_err(read)?.is_dir();
                if is_dir {
                    pending.push(child.clone());
                }
                out.push((child, is_dir));
            }
        }
        if rel != "." {
            out.push((rel.to_string(), true));
        }
        out.sort();
        Ok(out)
    }
}

/// A source or pattern as a path relative to the context: leading `/` and `./` dropped,
/// `..` resolved; None when it leaves the context.
fn clean(path: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for component in Path::new(path.trim_start_matches('/')).components() {
        match component {
            Component::Normal(p) => parts.push(p.to_str()?),
            Component::ParentDir => {
                parts.pop()?;
            }
            _ => {}
        }
    }
    Some(if parts.is_empty() {
        ".".to_string()
    } else {
        parts.join("/")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context() -> (tempfile::TempDir, Context) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for (path, text) in [
            ("app/main.py", "print(1)"),
            ("app/util.py", "x = 1"),
            ("app/cache/big.bin", "zz"),
            ("req.txt", "numpy"),
            ("secret.env", "K=V"),
            ("notes.md", "n"),
        ] {
            std::fs::create_dir_all(root.join(path).parent().unwrap()).unwrap();
            std::fs::write(root.join(path), text).unwrap();
        }
        std::os::unix::fs::symlink("/etc/shadow", root.join("app/link")).unwrap();
        std::fs::write(
            root.join(".dockerignore"),
            "# comment\n*.env\napp/cache\n*.md\n!notes.md\n",
        )
        .unwrap();
        let context = Context::open(root).unwrap();
        (dir, context)
    }

    #[test]
    fn sources_wildcards_and_ignore_rules() {
        let (_dir, c) = context();
        assert_eq!(
            c.select("./req.txt").unwrap(),
            [Selected {
                rel: "req.txt".into(),
                is_dir: false
            }]
        );
        assert_eq!(
            c.select("app/*.py")
                .unwrap()
                .iter()
                .map(|s| s.rel.as_str())
                .collect::<Vec<_>>(),
            ["app/main.py", "app/util.py"]
        );
        assert!(
            matches!(c.select("secret.env"), Err(ContextError::NotFound { .. })),
            "ignored files are not in the context"
        );
        assert_eq!(c.select("*.md").unwrap().len(), 1, "the exception re-includes notes.md");
        assert!(matches!(c.select("../outside"), Err(ContextError::Outside { .. })));
        assert!(matches!(c.select("*.rs"), Err(ContextError::NoMatch { .. })));
        assert_eq!(clean("/a/./b/../c").as_deref(), Some("a/c"));
    }

    #[test]
    fn a_folders_entries_leave_out_ignored_paths_and_keep_links_as_links() {
        let (_dir, c) = context();
        let entries = c.entries(&c.select("app").unwrap()[0]).unwrap();
        let names: Vec<&str> = entries.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(names, ["link", "main.py", "util.py"]);
        assert_eq!(
            entries[0].1,
            Entry::Symlink {
                target: "/etc/shadow".into()
            }
        );
        assert!(matches!(&entries[1].1, Entry::File { bytes, .. } if bytes == b"print(1)"));
    }
}
