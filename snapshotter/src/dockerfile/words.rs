//! Words as Docker's builder reads them in `ENV`, `ARG`, `LABEL`, `COPY`, `WORKDIR`, `USER`
//! and `FROM`: quotes (single quotes are literal), the escape character, and variables
//! (`$NAME`, `${NAME}`, `${NAME:-default}`, `${NAME:+alternative}`). `RUN` is left to the
//! shell.

/// A word the builder cannot read: an unclosed quote or `${`, a variable form it does not
/// expand, a pair without `=`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct WordError(pub String);

/// Splits `text` into words and expands variables with `lookup` (unset: empty).
pub fn words(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<Vec<String>, WordError> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
                i += 1;
            }
            '\'' => {
                in_word = true;
                let end = chars[i + 1..]
                    .iter()
                    .position(|&c| c == '\'')
                    .ok_or_else(|| WordError("a single quote is not closed".into()))?;
                word.extend(&chars[i + 1..i + 1 + end]);
                i += end + 2;
            }
            '"' => {
                in_word = true;
                i += 1;
                loop {
                    match chars.get(i) {
                        None => return Err(WordError("a double quote is not closed".into())),
                        Some('"') => break,
                        Some('\\') if matches!(chars.get(i + 1), Some('"' | '\\' | '$')) => {
                            word.push(chars[i + 1]);
                            i += 2;
                        }
                        Some('$') => i = expand(&chars, i, lookup, &mut word)?,
                        Some(&c) => {
                            word.push(c);
                            i += 1;
                        }
                    }
                }
                i += 1;
            }
            '\\' => {
                in_word = true;
                if let Some(&next) = chars.get(i + 1) {
                    word.push(next);
                }
                i += 2;
            }
            '$' => {
                let before = word.len();
                i = expand(&chars, i, lookup, &mut word)?;
                in_word |= word.len() > before;
            }
            c => {
                in_word = true;
                word.push(c);
                i += 1;
            }
        }
    }
    if in_word {
        out.push(word);
    }
    Ok(out)
}

/// One word: `text` expanded, with whitespace kept (for `WORKDIR`, `USER`, paths).
pub fn word(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, WordError> {
    // Quote the whitespace so that it stays inside the word.
    let mut protected = String::new();
    for c in text.trim().chars() {
        if c.is_whitespace() {
            protected.push('\\');
        }
        protected.push(c);
    }
    Ok(words(&protected, lookup)?.join(" "))
}

/// `text` with its variables expanded and nothing else changed (quotes stay): an expanding
/// here-document's body.
pub fn expand_only(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, WordError> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '\\' if chars.get(i + 1) == Some(&'$') => {
                out.push('$');
                i += 2;
            }
            '$' => i = expand(&chars, i, lookup, &mut out)?,
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Ok(out)
}

/// Expands the variable at `chars[i]` (a `$`) into `out`; returns the index after it.
fn expand(
    chars: &[char],
    i: usize,
    lookup: &dyn Fn(&str) -> Option<String>,
    out: &mut String,
) -> Result<usize, WordError> {
    let name_char = |c: char| c.is_ascii_alphanumeric() || c == '_';
    match chars.get(i + 1) {
        Some('{') => {
            let end = chars[i + 2..]
                .iter()
                .position(|&c| c == '}')
                .ok_or_else(|| WordError("a ${ is not closed".into()))?
                + i
                + 2;
            let inner: String = chars[i + 2..end].iter().collect();
            let (name, op) = match inner.find(":-").or_else(|| inner.find(":+")) {
                Some(at) => (&inner[..at], Some((&inner[at..at + 2], &inner[at + 2..]))),
                None => (inner.as_str(), None),
            };
            if name.is_empty() || !name.chars().all(name_char) {
                return Err(WordError(format!(
                    "${{{inner}}} is not a variable this builder expands"
                )));
            }
            let value = lookup(name).filter(|v| !v.is_empty());
            match (op, value) {
                (Some((":-", default)), None) => out.push_str(&words(default, lookup)?.join(" ")),
                (Some((":+", alternative)), Some(_)) => out.push_str(&words(alternative, lookup)?.join(" ")),
                (Some((":+", _)), None) => {}
                (_, value) => out.push_str(&value.unwrap_or_default()),
            }
            Ok(end + 1)
        }
        Some(&c) if name_char(c) && !c.is_ascii_digit() => {
            let end = chars[i + 1..]
                .iter()
                .position(|&c| !name_char(c))
                .map_or(chars.len(), |p| p + i + 1);
            let name: String = chars[i + 1..end].iter().collect();
            out.push_str(&lookup(&name).unwrap_or_default());
            Ok(end)
        }
        _ => {
            out.push('$');
            Ok(i + 1)
        }
    }
}

/// `KEY=VALUE ...` pairs (or the legacy `KEY VALUE` form of `ENV`), values expanded.
pub fn pairs(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<Vec<(String, String)>, WordError> {
    let first = text.split_whitespace().next().unwrap_or_default();
    if !first.contains('=') {
        // `ENV KEY the rest of the line`
        let key = first.to_string();
        let rest = text.trim_start()[first.len()..].trim();
        return Ok(vec![(key, word(rest, lookup)?)]);
    }
    let mut out = Vec::new();
    for item in words(text, lookup)? {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| WordError(format!("{item:?} is not KEY=VALUE")))?;
        out.push((key.to_string(), value.to_string()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(name: &str) -> Option<String> {
        match name {
            "HOME" => Some("/root".into()),
            "EMPTY" => Some(String::new()),
            "V" => Some("1.2".into()),
            _ => None,
        }
    }

    #[test]
    fn quotes_escapes_and_variables() {
        assert_eq!(
            words(r#"a "b c" 'd $HOME' e\ f $HOME ${V}x"#, &vars).unwrap(),
            ["a", "b c", "d $HOME", "e f", "/root", "1.2x"]
        );
        assert_eq!(
            words("${MISSING:-fallback} ${EMPTY:-e} ${V:+set} ${MISSING:+no}", &vars).unwrap(),
            ["fallback", "e", "set"]
        );
        assert_eq!(word("/opt/my app/$V", &vars).unwrap(), "/opt/my app/1.2");
        assert_eq!(words("cost $5 \\$HOME", &vars).unwrap(), ["cost", "$5", "$HOME"]);
        assert!(words("\"open", &vars).unwrap_err().0.contains("double quote"));
        assert!(words("${a b}", &vars).is_err());
        assert_eq!(
            expand_only("print(\"$HOME\") \\$V '${V}'\n", &vars).unwrap(),
            "print(\"/root\") $V '1.2'\n"
        );
    }

    #[test]
    fn env_pairs_in_both_forms() {
        assert_eq!(
            pairs(r#"A=1 B="two words" C=$HOME/x D='$HOME'"#, &vars).unwrap(),
            [
                ("A".into(), "1".into()),
                ("B".into(), "two words".into()),
                ("C".into(), "/root/x".into()),
                ("D".into(), "$HOME".into())
            ]
        );
        assert_eq!(
            pairs("PATH_EXTRA the rest $V", &vars).unwrap(),
            [("PATH_EXTRA".to_string(), "the rest 1.2".to_string())]
        );
        assert!(pairs("A=1 junk", &vars)
            .unwrap_err()
            .0
            .contains("\"junk\" is not KEY=VALUE"));
    }
}
