//! Dockerfile text into instructions: parser directives (`# escape=`), comments, line
//! continuations, flags, exec (JSON) and shell forms, and here-documents anywhere in a
//! `RUN`, `COPY` or `ADD` line, as BuildKit reads them.
//!
//! Hand-written rather than taken from a crate: parse-dockerfile 0.1.9 (the maintained
//! one) reads a here-document only at the very start of a `RUN` and only one, so
//! `RUN python3 <<EOF` and `RUN cat <<EOF > file`, common in real task images, fail there.

use std::fmt;

/// One instruction as written.
#[derive(Debug, Clone, PartialEq)]
pub struct Raw {
    /// 1-based line of the instruction's keyword.
    pub line: usize,
    /// Upper-cased keyword (`RUN`, `COPY`, ...).
    pub keyword: String,
    /// `--name=value` flags before the arguments, in order (`--link` has no value).
    pub flags: Vec<(String, Option<String>)>,
    pub args: Args,
    /// Here-documents the arguments open, in order.
    pub heredocs: Vec<HereDoc>,
}

/// An instruction's arguments.
#[derive(Debug, Clone, PartialEq)]
pub enum Args {
    /// A JSON array of strings (exec form).
    Json(Vec<String>),
    /// The rest of the instruction, continuation lines joined, comment lines inside it
    /// dropped.
    Text(String),
}

/// A here-document: `<<[-]WORD` (quoted `WORD`: no expansion), and its body.
#[derive(Debug, Clone, PartialEq)]
pub struct HereDoc {
    pub delimiter: String,
    /// False when the delimiter was quoted: the body is taken literally.
    pub expand: bool,
    /// `<<-`: leading tabs are stripped from the body's lines.
    pub strip_tabs: bool,
    pub body: String,
}

/// A syntax error, with its 1-based line.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct SyntaxError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for SyntaxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

const KEYWORDS: [&str; 18] = [
    "ADD",
    "ARG",
    "CMD",
    "COPY",
    "ENTRYPOINT",
    "ENV",
    "EXPOSE",
    "FROM",
    "HEALTHCHECK",
    "LABEL",
    "MAINTAINER",
    "ONBUILD",
    "RUN",
    "SHELL",
    "STOPSIGNAL",
    "USER",
    "VOLUME",
    "WORKDIR",
];

/// Parses a whole Dockerfile.
pub fn parse(text: &str) -> Result<Vec<Raw>, SyntaxError> {
    let lines: Vec<&str> = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)).collect();
    let escape = escape_directive(&lines)?;
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            i += 1;
            continue;
        }
        let line = i + 1;
        let logical = logical_line(&lines, &mut i, escape);
        let (keyword, rest) = split_word(&logical);
        let keyword = keyword.to_ascii_uppercase();
        if !KEYWORDS.contains(&keyword.as_str()) {
            return Err(SyntaxError {
                line,
                message: format!("unknown instruction {keyword:?}"),
            });
        }
        let (flags, rest) = if matches!(keyword.as_str(), "RUN" | "COPY" | "ADD" | "FROM" | "HEALTHCHECK") {
            take_flags(rest)
        } else {
            (Vec::new(), rest)
        };
        let args = arguments(&keyword, rest, line)?;
        let heredocs = match (&args, keyword.as_str()) {
            (Args::Text(text), "RUN" | "COPY" | "ADD") => here_documents(text, &lines, &mut i, line)?,
            _ => Vec::new(),
        };
        if matches!(&args, Args::Text(t) if t.is_empty()) && keyword != "RUN" {
            return Err(SyntaxError {
                line,
                message: format!("{keyword} needs arguments"),
            });
        }
        out.push(Raw {
            line,
            keyword,
            flags,
            args,
            heredocs,
        });
    }
    Ok(out)
}

/// The instruction that starts at `lines[*i]`, its continuation lines joined (comment lines
/// and blank lines inside are dropped); moves `*i` past it.
fn logical_line(lines: &[&str], i: &mut usize, escape: char) -> String {
    let mut logical = String::new();
    let mut current = lines[*i].trim_start().to_string();
    loop {
        let ends_escaped = current.trim_end().ends_with(escape);
        if !ends_escaped {
            logical.push_str(&current);
            break;
        }
        let kept = current.trim_end();
        logical.push_str(&kept[..kept.len() - escape.len_utf8()]);
        *i += 1;
        while *i < lines.len() && (lines[*i].trim_start().starts_with('#') || lines[*i].trim().is_empty()) {
            *i += 1;
        }
        if *i >= lines.len() {
            break;
        }
        current = lines[*i].to_string();
    }
    *i += 1;
    logical
}

/// An instruction's arguments after its flags: the exec form (a JSON array) where the
/// keyword takes one, else the text.
fn arguments(keyword: &str, rest: &str, line: usize) -> Result<Args, SyntaxError> {
    let rest = rest.trim();
    if keyword == "SHELL" && !rest.starts_with('[') {
        return Err(SyntaxError {
            line,
            message: "SHELL takes a JSON array of strings".into(),
        });
    }
    let args = if rest.starts_with('[')
        && matches!(
            keyword,
            "RUN" | "CMD" | "ENTRYPOINT" | "SHELL" | "COPY" | "ADD" | "VOLUME"
        ) {
        match serde_json::from_str::<Vec<String>>(rest) {
            Ok(list) => Args::Json(list),
            Err(_) if keyword == "SHELL" => {
                return Err(SyntaxError {
                    line,
                    message: "SHELL takes a JSON array of strings".into(),
                })
            }
            Err(_) => Args::Text(rest.to_string()),
        }
    } else {
        Args::Text(rest.to_string())
    };
    Ok(args)
}

/// The bodies of the here-documents `text` opens, read from `lines[*i]` on; moves `*i` past
/// the last one's delimiter. `line` is the instruction's, for errors.
fn here_documents(text: &str, lines: &[&str], i: &mut usize, line: usize) -> Result<Vec<HereDoc>, SyntaxError> {
    let mut heredocs = Vec::new();
    for (delimiter, expand, strip_tabs) in heredoc_openers(text) {
        let mut body = String::new();
        loop {
            if *i >= lines.len() {
                return Err(SyntaxError {
                    line,
                    message: format!("here-document {delimiter:?} is not closed"),
                });
            }
            let raw = lines[*i];
            *i += 1;
            let content = if strip_tabs { raw.trim_start_matches('\t') } else { raw };
            if content == delimiter {
                break;
            }
            body.push_str(content);
            body.push('\n');
        }
        heredocs.push(HereDoc {
            delimiter,
            expand,
            strip_tabs,
            body,
        });
    }
    Ok(heredocs)
}

/// `# escape=` among the leading comment lines (`\` or `` ` ``); `\` by default.
fn escape_directive(lines: &[&str]) -> Result<char, SyntaxError> {
    for (i, line) in lines.iter().enumerate() {
        let Some(comment) = line.trim().strip_prefix('#') else {
            break;
        };
        let Some((name, value)) = comment.split_once('=') else {
            break;
        };
        match name.trim().to_ascii_lowercase().as_str() {
            "escape" => {
                return match value.trim() {
                    "\\" => Ok('\\'),
                    "`" => Ok('`'),
                    other => Err(SyntaxError {
                        line: i + 1,
                        message: format!("escape must be \\ or `, not {other:?}"),
                    }),
                }
            }
            "syntax" | "check" => continue,
            _ => break,
        }
    }
    Ok('\\')
}

/// The first whitespace-separated word and the rest.
fn split_word(text: &str) -> (&str, &str) {
    let text = text.trim_start();
    match text.find(char::is_whitespace) {
        Some(at) => (&text[..at], &text[at..]),
        None => (text, ""),
    }
}

/// Leading `--name[=value]` flags.
fn take_flags(mut rest: &str) -> (Vec<(String, Option<String>)>, &str) {
    let mut flags = Vec::new();
    loop {
        let (word, after) = split_word(rest);
        let Some(flag) = word.strip_prefix("--") else {
            return (flags, rest);
        };
        match flag.split_once('=') {
            Some((name, value)) => flags.push((name.to_string(), Some(value.to_string()))),
            None => flags.push((flag.to_string(), None)),
        }
        rest = after;
    }
}

/// The here-documents a line opens: `<<WORD`, `<<-WORD`, `<<"WORD"`, `<<'WORD'`, outside
/// quotes (`<<<` is a here-string, not a document).
fn heredoc_openers(text: &str) -> Vec<(String, bool, bool)> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let (mut i, mut quote) = (0, None::<u8>);
    while i < bytes.len() {
        let b = bytes[i];
        match quote {
            Some(q) if b == q => quote = None,
            Some(_) => {}
            None if b == b'\'' || b == b'"' => quote = Some(b),
            None if b == b'\\' => i += 1,
            None if bytes[i..].starts_with(b"<<<") => {
                i += 3;
                continue;
            }
            None if bytes[i..].starts_with(b"<<") => {
                let mut j = i + 2;
                let strip_tabs = bytes.get(j) == Some(&b'-');
                if strip_tabs {
                    j += 1;
                }
                let quoted = matches!(bytes.get(j), Some(b'\'' | b'"'));
                let start = if quoted { j + 1 } else { j };
                let mut end = start;
                while end < bytes.len()
                    && (bytes[end].is_ascii_alphanumeric()
                        || bytes[end] == b'_'
                        || bytes[end] == b'-'
                        || bytes[end] == b'.')
                {
                    end += 1;
                }
                if end > start {
                    found.push((text[start..end].to_string(), !quoted, strip_tabs));
                    i = if quoted { end + 1 } else { end };
                    continue;
                }
            }
            None => {}
        }
        i += 1;
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_lines_continuations_and_forms() {
        let text = "# syntax=docker/dockerfile:1\n\nFROM base AS build\nRUN apt-get update && \\\n# a comment inside\n    apt-get install -y curl\nCMD [\"python3\", \"-c\", \"print(1)\"]\ncopy --from=build --chown=1:2 /a /b\nENV A=1 B=\"two words\"\n";
        let raws = parse(text).unwrap();
        assert_eq!(
            raws.iter().map(|r| (r.line, r.keyword.as_str())).collect::<Vec<_>>(),
            [(3, "FROM"), (4, "RUN"), (7, "CMD"), (8, "COPY"), (9, "ENV")]
        );
        assert_eq!(
            raws[1].args,
            Args::Text(
                "RUN apt-get update &&     apt-get install -y curl"
                    .trim_start_matches("RUN ")
                    .to_string()
            )
        );
        assert_eq!(
            raws[2].args,
            Args::Json(vec!["python3".into(), "-c".into(), "print(1)".into()])
        );
        assert_eq!(
            raws[3].flags,
            [
                ("from".to_string(), Some("build".to_string())),
                ("chown".to_string(), Some("1:2".to_string()))
            ]
        );
        assert_eq!(raws[3].args, Args::Text("/a /b".into()));
    }

    #[test]
    fn here_documents_anywhere_in_the_line_and_several() {
        let text = "FROM x\nRUN python3 <<'PY' > /out && cat <<-EOF >> /out\nprint('$HOME')\nPY\n\tline\n\tEOF\nCOPY <<EOF /etc/motd\nhello $USER\nEOF\nRUN echo done\n";
        let raws = parse(text).unwrap();
        assert_eq!(raws.iter().map(|r| r.line).collect::<Vec<_>>(), [1, 2, 7, 10]);
        let run = &raws[1];
        assert_eq!(run.heredocs.len(), 2);
        assert_eq!(
            (
                run.heredocs[0].delimiter.as_str(),
                run.heredocs[0].expand,
                run.heredocs[0].body.as_str()
            ),
            ("PY", false, "print('$HOME')\n")
        );
        assert_eq!(
            (
                run.heredocs[1].delimiter.as_str(),
                run.heredocs[1].strip_tabs,
                run.heredocs[1].body.as_str()
            ),
            ("EOF", true, "line\n")
        );
        assert_eq!(raws[2].heredocs[0].body, "hello $USER\n");
        assert!(heredoc_openers("echo '<<NOT' \"<<NOR\" <<<here").is_empty());
    }

    #[test]
    fn errors_name_the_line() {
        assert_eq!(
            parse("FROM x\nFETCH y\n").unwrap_err().to_string(),
            "line 2: unknown instruction \"FETCH\""
        );
        assert_eq!(
            parse("FROM x\nRUN cat <<EOF\nnever closed\n").unwrap_err().to_string(),
            "line 2: here-document \"EOF\" is not closed"
        );
        assert_eq!(
            parse("# escape=`\nFROM x\nRUN a `\n  b\n").unwrap()[1].args,
            Args::Text("a   b".into())
        );
        assert!(parse("FROM x\nSHELL bash -c\n")
            .unwrap_err()
            .to_string()
            .contains("JSON array"));
    }
}
