//! What every page of the report shares: the page shell (inline CSS and the one inline
//! script), [`Text`] for strings that came from a run, and text helpers (numbers, cut
//! output). Markup is written with `maud`, which escapes every spliced value; the only
//! unescaped text is this file's own constants.

use std::borrow::Cow;

use maud::{html, Markup, PreEscaped, Render, DOCTYPE};

const STYLE: &str = r#"
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px;overflow-wrap:anywhere}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0;max-width:100%}th,td{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f4f4f4;cursor:pointer}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.text,th.text,td code{overflow-wrap:anywhere}th.text{max-width:24em}td.text{min-width:4em}td.params{min-width:6em;max-width:20em}td.params code{font-size:11px}
#leaderboard{font-size:12px}#leaderboard th,#leaderboard td{padding:2px 4px}#leaderboard th{vertical-align:bottom}
.ci{color:#666;font-size:11px;white-space:normal}
tr.flipped td{background:#fff3cd}.pass{color:#1d7a3a}.fail{color:#b8423a}.mixed{color:#a06000}
.warn{color:#b8423a;font-weight:600}pre{background:#f7f7f7;padding:6px;white-space:pre-wrap;word-break:break-all;max-height:360px;overflow:auto;margin:4px 0}
.charts{display:flex;flex-wrap:wrap;gap:12px}figure.chart{margin:0}figcaption{font-weight:600;overflow-wrap:anywhere;max-width:560px}
.legend span{display:inline-block;margin-right:14px}.swatch{display:inline-block;width:10px;height:10px;margin-right:4px}
section.rollout{border:1px solid #ccc;padding:8px 12px;margin:12px 0}.step{border-left:3px solid #ccc;padding-left:8px;margin:8px 0}
code{background:#f1f1f1;padding:0 3px}
.badge,.mark{display:inline-block;border-radius:3px;padding:0 5px;font-size:12px}.badge.sound{background:#d9f2df;color:#1d7a3a}.badge.shared{background:#e3ecfa;color:#2a4f8a}.badge.hardened,.mark.hardened{background:#fde2c8;color:#8a4b00}
"#;

const SCRIPT: &str = r#"
function sortBy(th){const t=th.closest('table'),i=[...th.parentNode.children].indexOf(th),b=t.tBodies[0];
const dir=th.dataset.dir==='asc'?'desc':'asc';th.dataset.dir=dir;
const key=r=>{const c=r.children[i];const v=c.dataset.v!==undefined?c.dataset.v:c.textContent;const n=parseFloat(v);return isNaN(n)?v:n};
[...b.rows].sort((x,y)=>{const a=key(x),c=key(y);const r=a<c?-1:a>c?1:0;return dir==='asc'?r:-r}).forEach(r=>b.appendChild(r));}
document.addEventListener('DOMContentLoaded',()=>{document.querySelectorAll('table.sortable th').forEach(th=>th.addEventListener('click',()=>sortBy(th)));
const f=document.getElementById('only-flipped');if(f)f.addEventListener('change',()=>{document.querySelectorAll('#tasks tbody tr').forEach(r=>{r.style.display=f.checked&&!r.classList.contains('flipped')?'none':''})})});
"#;

/// The `<head>` of every page.
fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width";
            title { (Text(title)) }
            style { (PreEscaped(STYLE)) }
            script { (PreEscaped(SCRIPT)) }
        }
    }
}

/// A whole page.
pub fn page(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body { (body) }
        }
    }
}

/// The start of a page whose body is appended piece by piece (a task's rollouts are
/// written as they are read); [`PAGE_END`] closes it. The tags around the head are
/// constants: the only way to leave `<body>` open, which a `maud` template cannot.
pub fn page_start(title: &str) -> String {
    format!(
        "{}\n<html lang=\"en\">{}<body>\n",
        DOCTYPE.into_string(),
        head(title).into_string()
    )
}

/// What [`page_start`] leaves open.
pub const PAGE_END: &str = "</body></html>\n";

/// A string that came from a run. `maud` escapes it like any spliced string; before that,
/// its control characters (all but newline and tab) become visible text such as `\u{1b}`:
/// a browser would drop them silently, so a terminal escape, a NUL or a carriage return
/// that overwrites a line in a terminal would hide what the agent printed, and copied out
/// of the page they would act again. This is a text transform, not HTML escaping.
pub struct Text<'a>(pub &'a str);

impl Render for Text<'_> {
    fn render_to(&self, buffer: &mut String) {
        visible_controls(self.0).as_ref().render_to(buffer);
    }
}

/// `text` with its control characters but newline and tab written as `\u{..}`.
pub fn visible_controls(text: &str) -> Cow<'_, str> {
    let hidden = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(hidden) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.chars()
            .map(|c| {
                if hidden(c) {
                    format!("\\u{{{:x}}}", c as u32)
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

/// A number with `digits` decimals, or a dash when there is none.
pub fn num(value: Option<f64>, digits: usize) -> String {
    value.map(|v| format!("{v:.digits$}")).unwrap_or_else(|| "–".into())
}

/// The last `max` bytes of `text` (on a character boundary), marked when cut.
pub fn last_bytes(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    Cow::Owned(format!("[... {} bytes before ...]\n{}", start, &text[start..]))
}

/// The first `max` bytes of `text` (on a character boundary), marked when cut.
pub fn first_bytes(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}\n[... {} more bytes ...]", &text[..end], text.len() - end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_and_its_control_characters_shown() {
        let markup = html! { p title=(Text("\"><b>")) { (Text("<script>alert('x')</script> & a\u{1b}[2Jb\nc\r")) } };
        assert_eq!(
            markup.into_string(),
            "<p title=\"&quot;&gt;&lt;b&gt;\">&lt;script&gt;alert('x')&lt;/script&gt; &amp; a\\u{1b}[2Jb\nc\\u{d}</p>"
        );
        assert!(matches!(visible_controls("plain\ttext\n"), Cow::Borrowed(_)));
        assert_eq!(last_bytes("abcdef", 3), "[... 3 bytes before ...]\ndef");
        assert_eq!(first_bytes("héllo", 2), "h\n[... 5 more bytes ...]");
        let page = page_start("<t>") + PAGE_END;
        assert!(
            page.starts_with("<!DOCTYPE html>\n<html lang=\"en\"><head>")
                && page.contains("<title>&lt;t&gt;</title>")
                && page.ends_with("<body>\n</body></html>\n"),
            "{page}"
        );
    }
}
