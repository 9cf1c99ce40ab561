//! `COPY` and `ADD`: what they copy (files and folders of the build context, here-documents,
//! archives `ADD` unpacks, paths of an earlier stage or image with `--from`), the step's key
//! over every byte copied, and placing it all in the step's fork.

use serde_json::json;
use sha2::{Digest, Sha256};
use vmm::ExecOptions;

use super::{check, earlier_stage, join, quote, Builder};
use crate::dockerfile::context::Entry;
use crate::dockerfile::parse::{Args, Raw};
use crate::dockerfile::{words, Stage, State, StepError};
use crate::fork::{Fork, ForkIdentity};

/// Most bytes a `COPY --from` source may have packed (it travels in one agent response).
const FROM_CAP: u64 = 64 << 20;

/// A source of `COPY`/`ADD`.
enum Source {
    Path(String),
    /// A here-document: its name and its text.
    Inline(String, String),
}

/// What a `COPY`/`ADD` line asks for, its variables expanded.
struct CopyArgs {
    chown: Option<String>,
    chmod: Option<u32>,
    sources: Vec<Source>,
    dest: String,
}

/// What the sources give: every entry with its guest path, and the archives ADD unpacks.
struct Gathered {
    entries: Vec<(String, Entry)>,
    archives: Vec<(String, Vec<u8>)>,
    /// A lone file copied to a path that may be a folder in the image: (entry, its name).
    lone_file: Option<(usize, String)>,
}

fn sha256(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

fn flag<'r>(raw: &'r Raw, name: &str) -> Option<&'r str> {
    raw.flags
        .iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, v)| v.as_deref())
}

impl Builder<'_> {
    pub(super) async fn copy(
        &self,
        state: &mut State,
        raw: &Raw,
        stages: &[Stage],
        built: &[Option<State>],
        pulled: &mut Vec<images::registry::Pulled>,
    ) -> Result<(), StepError> {
        let add = raw.keyword == "ADD";
        let CopyArgs {
            chown,
            chmod,
            sources,
            dest,
        } = copy_args(raw, state, add)?;
        let dest_path = join(&state.workdir, &dest);
        let many = sources.len() > 1
            || sources
                .iter()
                .any(|s| matches!(s, Source::Path(p) if p.contains(['*', '?', '['])));
        let dest_is_dir = dest.ends_with('/') || dest == "." || dest.ends_with("/.") || many;
        if let Some(from) = flag(raw, "from") {
            let from = words::word(from, &|n| self.globals.get(n).cloned()).map_err(|e| StepError::Invalid(e.0))?;
            let source = match earlier_stage(&from, stages, built) {
                Some(s) => s,
                None => self.base(&from, pulled).await?,
            };
            let paths = sources.iter().map(|s| match s {
                Source::Path(p) if !p.contains(['*', '?', '[']) => Ok(p.clone()),
                _ => Err(StepError::Unsupported(
                    "COPY --from takes plain paths (no wildcards or here-documents)".into(),
                )),
            });
            let paths = paths.collect::<Result<Vec<_>, _>>()?;
            return self
                .copy_from(state, &source, &paths, &dest_path, dest_is_dir, chown.as_deref())
                .await;
        }
        let mut gathered = self.gather(&sources, &dest_path, dest_is_dir, add)?;
        let described = described(&gathered, chmod);
        let key = json!({ "op": raw.keyword, "entries": described, "chown": chown, "workdir": state.workdir });
        let Some(step) = self.begin(state, &key).await? else {
            return Ok(());
        };
        let fork = &step.1;
        if let Some((index, name)) = gathered.lone_file.take() {
            // `COPY file /existing/folder` copies into the folder, as Docker does.
            let probe = ExecOptions::argv(&["test", "-d", &dest_path]);
            if fork.agent().exec(probe).await?.result.exit_code == Some(0) {
                gathered.entries[index].0 = join(&dest_path, &name);
            }
        }
        self.place(fork, &gathered, chmod, chown.as_deref()).await?;
        self.commit(state, step).await
    }

    /// Every entry the sources give, with its guest path; archives ADD unpacks.
    fn gather(&self, sources: &[Source], dest_path: &str, dest_is_dir: bool, add: bool) -> Result<Gathered, StepError> {
        let mut entries: Vec<(String, Entry)> = Vec::new();
        let mut archives: Vec<(String, Vec<u8>)> = Vec::new();
        let mut lone_file: Option<(usize, String)> = None;
        for source in sources {
            match source {
                Source::Inline(name, body) => {
                    let path = if dest_is_dir {
                        join(dest_path, name)
                    } else {
                        dest_path.to_string()
                    };
                    entries.push((
                        path,
                        Entry::File {
                            bytes: body.clone().into_bytes(),
                            mode: 0o644,
                        },
                    ));
                }
                Source::Path(p)
                    if add && (p.starts_with("http://") || p.starts_with("https://") || p.starts_with("git@")) =>
                {
                    return Err(StepError::Unsupported(format!("ADD {p}: sources from URLs are not supported; fetch them in a RUN through the template's allowlist")));
                }
                Source::Path(p) => {
                    let selected = self.context.select(p)?;
                    let one_file = selected.len() == 1 && !selected[0].is_dir;
                    for sel in &selected {
                        for (inside, entry) in self.context.entries(sel)? {
                            let base = sel.rel.rsplit('/').next().unwrap_or(&sel.rel).to_string();
                            let path = match (sel.is_dir, one_file && !dest_is_dir) {
                                (true, _) => join(dest_path, &inside),
                                (false, true) => {
                                    lone_file = Some((entries.len(), base.clone()));
                                    dest_path.to_string()
                                }
                                (false, false) => join(dest_path, &base),
                            };
                            match entry {
                                Entry::File { bytes, .. } if add && !sel.is_dir && is_archive(&base, &bytes) => {
                                    archives.push((dest_path.to_string(), bytes))
                                }
                                entry => entries.push((path, entry)),
                            }
                        }
                    }
                }
            }
        }
        Ok(Gathered {
            entries,
            archives,
            lone_file,
        })
    }

    /// Puts what the sources gave in the step's fork: folders and links by one script, files
    /// through the agent, archives unpacked, then `--chown` over every entry.
    async fn place(
        &self,
        fork: &Fork,
        gathered: &Gathered,
        chmod: Option<u32>,
        chown: Option<&str>,
    ) -> Result<(), StepError> {
        let entries = &gathered.entries;
        let mut script = String::from("set -e\n");
        for (path, entry) in entries {
            match entry {
                Entry::Dir { mode } => script.push_str(&format!(
                    "mkdir -p {p} && chmod {m:o} {p}\n",
                    p = quote(path),
                    m = chmod.unwrap_or(*mode)
                )),
                Entry::Symlink { target } => script.push_str(&format!(
                    "mkdir -p \"$(dirname {p})\" && ln -sfn {t} {p}\n",
                    p = quote(path),
                    t = quote(target)
                )),
                Entry::File { .. } => {}
            }
        }
        self.sh(fork, script, "creating folders and links").await?;
        for (path, entry) in entries {
            if let Entry::File { bytes, mode } = entry {
                fork.agent()
                    .write_file(path, bytes.clone(), chmod.unwrap_or(*mode))
                    .await?;
            }
        }
        self.unpack_archives(fork, &gathered.archives).await?;
        if let Some(owner) = chown {
            let paths: Vec<String> = entries.iter().map(|(p, _)| quote(p)).collect();
            for chunk in paths.chunks(200) {
                self.sh(
                    fork,
                    format!("chown -h {} -- {}", quote(owner), chunk.join(" ")),
                    "--chown",
                )
                .await?;
            }
        }
        Ok(())
    }

    /// Each archive ADD copies, unpacked by the image's tar into its destination.
    async fn unpack_archives(&self, fork: &Fork, archives: &[(String, Vec<u8>)]) -> Result<(), StepError> {
        for (i, (into, bytes)) in archives.iter().enumerate() {
            let tmp = format!("/tmp/.farm-add-{i}");
            fork.agent().write_file(&tmp, bytes.clone(), 0o600).await?;
            let z = if bytes.starts_with(&[0x1f, 0x8b]) {
                "z"
            } else if bytes.starts_with(b"BZh") {
                "j"
            } else if bytes.starts_with(&[0xfd, b'7']) {
                "J"
            } else {
                ""
            };
            self.sh(
                fork,
                format!(
                    "mkdir -p {d} && tar -x{z}f {t} -C {d} && rm -f {t}",
                    d = quote(into),
                    t = quote(&tmp)
                ),
                "unpacking an archive (ADD needs tar in the image)",
            )
            .await?;
        }
        Ok(())
    }

    /// `COPY --from`: each path packed with tar in a fork of the source, unpacked in this
    /// step's fork (both need tar, cp and mkdir).
    async fn copy_from(
        &self,
        state: &mut State,
        source: &State,
        paths: &[String],
        dest: &str,
        dest_is_dir: bool,
        chown: Option<&str>,
    ) -> Result<(), StepError> {
        let key = json!({ "op": "COPY --from", "source": source.snapshot.id(), "paths": paths, "dest": dest, "dest_is_dir": dest_is_dir, "chown": chown, "workdir": state.workdir });
        let Some(step) = self.begin(state, &key).await? else {
            return Ok(());
        };
        let fork = &step.1;
        let from = self.forker.fork(&source.snapshot, ForkIdentity::new(0)).await?;
        for (i, path) in paths.iter().enumerate() {
            let path = join("/", path).trim_end_matches('/').to_string();
            let (parent, name) = path
                .rsplit_once('/')
                .map(|(p, n)| (if p.is_empty() { "/" } else { p }, n))
                .unwrap_or(("/", path.as_str()));
            let options = ExecOptions {
                stdout_cap: FROM_CAP,
                stderr_cap: 64 << 10,
                ..ExecOptions::argv(&["tar", "-cf", "-", "-C", parent, name])
            };
            let out = from.agent().exec(options).await?;
            if out.result.stdout_truncated {
                return Err(StepError::Invalid(format!(
                    "{path} is more than {} MiB packed",
                    FROM_CAP >> 20
                )));
            }
            let out = check(&format!("packing {path} in the source stage"), out, 0)?;
            let tmp = format!("/tmp/.farm-from-{i}.tar");
            fork.agent().write_file(&tmp, out.stdout, 0o600).await?;
            let target = if dest_is_dir {
                join(dest, name)
            } else {
                dest.to_string()
            };
            // A folder's contents go into the destination; a file to it, or into it.
            let chown_line = chown.map(|o| format!("(cd \"$t\" && find {n} -mindepth 0) | while read -r p; do chown -h {o} \"$base/${{p#*/}}\" 2>/dev/null || chown -h {o} \"$base\"; done\n", n = quote(name), o = quote(o))).unwrap_or_default();
            let script = format!(
                "set -e\nt=$(mktemp -d)\ntar -xf {tmp} -C \"$t\"\nrm -f {tmp}\nif [ -d \"$t\"/{n} ] && [ ! -L \"$t\"/{n} ]; then mkdir -p {d} && cp -a \"$t\"/{n}/. {d}/; base={d}\nelse mkdir -p \"$(dirname {tg})\" && cp -a \"$t\"/{n} {tg}; base={tg}\nfi\n{chown_line}rm -rf \"$t\"\n",
                tmp = quote(&tmp),
                n = quote(name),
                d = quote(dest),
                tg = quote(&target),
            );
            self.sh(fork, script, &format!("placing {path}")).await?;
        }
        drop(from);
        self.commit(state, step).await
    }
}

/// The flags, owner, mode, sources and destination of a `COPY`/`ADD` line, checked, with the
/// stage's variables expanded (here-documents too, unless their delimiter was quoted).
fn copy_args(raw: &Raw, state: &State, add: bool) -> Result<CopyArgs, StepError> {
    for (name, _) in &raw.flags {
        if !matches!(name.as_str(), "from" | "chown" | "chmod" | "link") || (add && name == "from") {
            return Err(StepError::Unsupported(format!(
                "{} --{name} is not supported",
                raw.keyword
            )));
        }
    }
    let vars = {
        let s = state.clone();
        move |name: &str| s.lookup(name)
    };
    let chown = flag(raw, "chown")
        .map(|c| words::word(c, &vars))
        .transpose()
        .map_err(|e| StepError::Invalid(e.0))?;
    let chmod = match flag(raw, "chmod") {
        Some(m) => Some(
            u32::from_str_radix(m, 8)
                .ok()
                .filter(|m| *m <= 0o7777)
                .ok_or_else(|| StepError::Invalid(format!("--chmod={m} is not an octal mode")))?,
        ),
        None => None,
    };
    let mut items: Vec<String> = match &raw.args {
        Args::Json(list) => list
            .iter()
            .map(|w| words::word(w, &vars))
            .collect::<Result<_, _>>()
            .map_err(|e| StepError::Invalid(e.0))?,
        Args::Text(text) => words::words(text, &vars).map_err(|e| StepError::Invalid(e.0))?,
    };
    let dest = items
        .pop()
        .filter(|_| !items.is_empty())
        .ok_or_else(|| StepError::Syntax(format!("{} takes sources and a destination", raw.keyword)))?;
    let mut docs = raw.heredocs.iter();
    let sources: Vec<Source> = items
        .into_iter()
        .map(|item| match item.strip_prefix("<<") {
            Some(_) => {
                let doc = docs.next().expect("each <<WORD opened a here-document");
                let body = if doc.expand {
                    words::expand_only(&doc.body, &vars).map_err(|e| StepError::Invalid(e.0))?
                } else {
                    doc.body.clone()
                };
                Ok(Source::Inline(doc.delimiter.clone(), body))
            }
            None => Ok(Source::Path(item)),
        })
        .collect::<Result<_, StepError>>()?;
    Ok(CopyArgs {
        chown,
        chmod,
        sources,
        dest,
    })
}

/// What the step's key holds of the sources: each entry's path, kind and mode (a file's
/// SHA-256, a link's target) and each archive's SHA-256.
fn described(gathered: &Gathered, chmod: Option<u32>) -> Vec<serde_json::Value> {
    gathered
        .entries
        .iter()
        .map(|(path, entry)| match entry {
            Entry::File { bytes, mode } => json!([path, "file", sha256(bytes), chmod.unwrap_or(*mode)]),
            Entry::Dir { mode } => json!([path, "dir", chmod.unwrap_or(*mode)]),
            Entry::Symlink { target } => json!([path, "link", target]),
        })
        .chain(
            gathered
                .archives
                .iter()
                .map(|(into, bytes)| json!([into, "archive", sha256(bytes)])),
        )
        .collect()
}

/// Whether ADD unpacks this file: a tar, plain or compressed (gzip, bzip2, xz), by name or
/// by its first bytes.
fn is_archive(name: &str, bytes: &[u8]) -> bool {
    let by_name = [".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz"]
        .iter()
        .any(|ext| name.ends_with(ext));
    let compressed = bytes.starts_with(&[0x1f, 0x8b])
        || bytes.starts_with(b"BZh")
        || bytes.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]);
    let plain_tar = bytes.len() > 262 && &bytes[257..262] == b"ustar";
    plain_tar || (by_name && compressed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archives_by_name_and_first_bytes() {
        assert!(is_archive("x.tar.gz", &[0x1f, 0x8b, 8]));
        assert!(
            !is_archive("x.gz", &[0x1f, 0x8b, 8]),
            "a compressed file that is not named as a tar is copied"
        );
    }
}
