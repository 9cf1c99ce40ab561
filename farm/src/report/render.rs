//! The report's HTML. Every string that came from a run (task ids, commands, output, messages,
//! errors, even suite names) goes through [`escape`]; the only script is the page's own
//! (sorting and filtering the per-task table), inline.

use std::collections::BTreeSet;

use super::svg;
use super::{RunStats, PHASE_BINS_MS};
use engine::row::{Row, Status, StepKind};

/// Text for HTML element content and quoted attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() && c != '\n' && c != '\t' => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

fn step_kind(kind: StepKind) -> &'static str {
    match kind {
        StepKind::Exec => "exec",
        StepKind::WriteFile => "write_file",
        StepKind::Submit => "submit",
    }
}

/// The last `max` bytes of `text` (on a character boundary), marked when cut.
fn tail(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("[... {} bytes before ...]\n{}", start, &text[start..])
}

fn head(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n[... {} more bytes ...]", &text[..end], text.len() - end)
}

const STYLE: &str = r#"<style>
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0}th,td{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f4f4f4;cursor:pointer}td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.flipped td{background:#fff3cd}.pass{color:#1d7a3a}.fail{color:#b8423a}.mixed{color:#a06000}
.warn{color:#b8423a;font-weight:600}pre{background:#f7f7f7;padding:6px;white-space:pre-wrap;word-break:break-all;max-height:360px;overflow:auto;margin:4px 0}
.charts{display:flex;flex-wrap:wrap;gap:12px}figure.chart{margin:0}figcaption{font-weight:600}
.legend span{display:inline-block;margin-right:14px}.swatch{display:inline-block;width:10px;height:10px;margin-right:4px}
section.rollout{border:1px solid #ccc;padding:8px 12px;margin:12px 0}.step{border-left:3px solid #ccc;padding-left:8px;margin:8px 0}
code{background:#f1f1f1;padding:0 3px}
.badge,.mark{display:inline-block;border-radius:3px;padding:0 5px;font-size:12px}.badge.sound{background:#d9f2df;color:#1d7a3a}.badge.hardened,.mark.hardened{background:#fde2c8;color:#8a4b00}
</style>"#;

const SCRIPT: &str = r#"<script>
function sortBy(th){const t=th.closest('table'),i=[...th.parentNode.children].indexOf(th),b=t.tBodies[0];
const dir=th.dataset.dir==='asc'?'desc':'asc';th.dataset.dir=dir;
const key=r=>{const c=r.children[i];const v=c.dataset.v!==undefined?c.dataset.v:c.textContent;const n=parseFloat(v);return isNaN(n)?v:n};
[...b.rows].sort((x,y)=>{const a=key(x),c=key(y);const r=a<c?-1:a>c?1:0;return dir==='asc'?r:-r}).forEach(r=>b.appendChild(r));}
document.addEventListener('DOMContentLoaded',()=>{document.querySelectorAll('table.sortable th').forEach(th=>th.addEventListener('click',()=>sortBy(th)));
const f=document.getElementById('only-flipped');if(f)f.addEventListener('change',()=>{document.querySelectorAll('#tasks tbody tr').forEach(r=>{r.style.display=f.checked&&!r.classList.contains('flipped')?'none':''})})});
</script>"#;

fn page_head(title: &str) -> String {
    format!("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\"><title>{}</title>{STYLE}{SCRIPT}</head><body>\n", escape(title))
}

fn page(title: &str, body: &str) -> String {
    format!("{}{body}\n{}", page_head(title), task_page_tail())
}

fn num(v: Option<f64>, digits: usize) -> String {
    v.map(|v| format!("{v:.digits$}")).unwrap_or_else(|| "–".into())
}

fn legend(runs: &[RunStats]) -> String {
    let items: Vec<String> = runs.iter().enumerate().map(|(i, r)| format!(r#"<span><i class="swatch" style="background:{}"></i>{}</span>"#, svg::colour(i), escape(&r.label))).collect();
    format!(r#"<p class="legend">{}</p>"#, items.join(""))
}

/// The report's front page.
pub fn index(runs: &[RunStats]) -> String {
    let mut b = String::new();
    b.push_str(&format!("<h1>farm report: {}</h1>\n", runs.iter().map(|r| escape(&r.label)).collect::<Vec<_>>().join(" vs ")));
    b.push_str(&leaderboard(runs));
    b.push_str(&task_table(runs));
    b.push_str(&charts(runs));
    b.push_str(&provenance(runs));
    page("farm report", &b)
}

fn leaderboard(runs: &[RunStats]) -> String {
    let k = runs.iter().map(|r| r.max_k()).max().unwrap_or(1).max(1);
    let first: BTreeSet<&String> = runs.first().map(|r| r.tasks.keys().collect()).unwrap_or_default();
    let mut b = format!(
        "<h2>Leaderboard</h2>\n<table id=\"leaderboard\" class=\"sortable\"><thead><tr><th>run</th><th>suite</th><th>policy</th><th>model</th><th>params</th><th>tasks</th><th>rollouts</th>\
         <th>pass@1</th><th>pass@{k}</th><th>pass^{k}</th><th>mean reward [95% CI]</th><th>passed</th><th>failed</th><th>timeout</th><th>env_error</th><th>env_error rate</th><th>rollouts/s</th><th>wall s</th><th>trust</th></tr></thead><tbody>\n"
    );
    for run in runs {
        let tasks: BTreeSet<&String> = run.tasks.keys().collect();
        let flag = if tasks != first {
            let extra = tasks.difference(&first).count();
            let missing = first.difference(&tasks).count();
            format!(r#" <span class="warn" title="not comparable to the first run's tasks">different tasks: {extra} not in the first run, {missing} of it missing</span>"#)
        } else {
            String::new()
        };
        let ci = run.reward_interval().map(|(l, h)| format!(" [{l:.3}, {h:.3}]")).unwrap_or_default();
        let count = |s: Status| run.counts.get(&s).copied().unwrap_or(0);
        b.push_str(&format!(
            "<tr><td>{}{flag}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td><td class=num>{}</td><td class=num>{}</td>\
             <td class=num data-k=\"1\">{}</td><td class=num>{}</td><td class=num>{}</td><td class=num data-v=\"{}\">{}{ci}</td>\
             <td class=num>{}</td><td class=num>{}</td><td class=num>{}</td><td class=num>{}</td><td class=num>{:.1}%</td><td class=num>{}</td><td class=num>{}</td><td>{}</td></tr>\n",
            escape(&run.label),
            escape(&run.suite_name),
            escape(&run.policy_name),
            escape(&run.model),
            escape(&head(&run.policy_params, 200)),
            run.tasks.len(),
            run.rows,
            num(run.pass_at(1, false), 3),
            num(run.pass_at(k, false), 3),
            num(run.pass_at(k, true), 3),
            run.mean_reward().unwrap_or(f64::NAN),
            num(run.mean_reward(), 3),
            count(Status::Passed),
            count(Status::Failed),
            count(Status::Timeout),
            count(Status::EnvError),
            run.env_error_rate() * 100.0,
            num(run.rate(), 2),
            num(run.wall(), 1),
            trust_badge(run),
        ));
    }
    b.push_str("</tbody></table>\n<p>trust: <span class=\"badge sound\">sound</span> verdicts rest on checks the agent's code could not reach (the function-call harness, unit tests through the boundary, a checker using farm-sandbox, an answer compared on the host); <span class=\"badge hardened\">hardened</span> ones ran the agent's code where the verdict is made (test_user = candidate, final-state scoring), so a capable agent may have forged them. See docs/security.md.</p>\n");
    b.push_str("<p>pass@k is the unbiased estimator over each task's scored rollouts (env_error left out), averaged over tasks with at least k; pass^k: all k pass. The interval resamples tasks (2,000 bootstrap resamples).</p>\n");
    b
}

/// The leaderboard's trust cell: how many verdicts of each level. The counts are those of
/// summary.json's `trust`.
fn trust_badge(run: &RunStats) -> String {
    let sound = run.trust.get(&scorers::Trust::Sound).copied().unwrap_or(0);
    let hardened = run.trust.get(&scorers::Trust::Hardened).copied().unwrap_or(0);
    match (sound, hardened) {
        (0, 0) => "–".into(),
        (_, 0) => format!("<span class=\"badge sound\" data-sound=\"{sound}\" data-hardened=\"0\">sound</span>"),
        (s, h) => format!(
            "<span class=\"badge hardened\" data-sound=\"{s}\" data-hardened=\"{h}\" title=\"{h} of {} verdicts ran the agent's code where the verdict is made\">hardened: {h} of {}</span>",
            s + h,
            s + h
        ),
    }
}

fn task_table(runs: &[RunStats]) -> String {
    let all: BTreeSet<&String> = runs.iter().flat_map(|r| r.tasks.keys()).collect();
    let mut b = String::from("<h2>Tasks</h2>\n");
    if runs.len() > 1 {
        b.push_str("<p><label><input type=\"checkbox\" id=\"only-flipped\"> only tasks that flipped (all samples passed in one run, none or only some in another, and so on)</label></p>\n");
    }
    b.push_str("<table id=\"tasks\" class=\"sortable\"><thead><tr><th>task</th>");
    for run in runs {
        b.push_str(&format!("<th>{} passed</th>", escape(&run.label)));
    }
    b.push_str("</tr></thead><tbody>\n");
    for task in all {
        // A task flipped when its verdict (all samples passed, none, or some) differs
        // between runs.
        let verdicts: BTreeSet<(bool, bool)> = runs.iter().filter_map(|r| r.tasks.get(task)).filter(|t| t.scored > 0).map(|t| (t.passed > 0, t.passed == t.scored)).collect();
        let flipped = verdicts.len() > 1;
        b.push_str(&format!("<tr{}><td>{}{}</td>", if flipped { " class=\"flipped\"" } else { "" }, escape(task), if flipped { " <b>flipped</b>" } else { "" }));
        for run in runs {
            match run.tasks.get(task) {
                Some(t) => {
                    let class = if t.passed == t.scored && t.scored > 0 {
                        "pass"
                    } else if t.passed == 0 {
                        "fail"
                    } else {
                        "mixed"
                    };
                    let rate = if t.scored > 0 { t.passed as f64 / t.scored as f64 } else { -1.0 };
                    b.push_str(&format!(
                        "<td class=\"num {class}\" data-v=\"{rate:.4}\" title=\"task digest {}\"><a href=\"{}\">{}/{}</a>{}</td>",
                        escape(&t.digest),
                        escape(&t.page),
                        t.passed,
                        t.scored,
                        if t.rollouts > t.scored { format!(" (+{} env_error)", t.rollouts - t.scored) } else { String::new() }
                    ));
                    if t.hardened > 0 {
                        // Before the cell's end: a mark on the task's verdicts in that run.
                        b.truncate(b.len() - "</td>".len());
                        b.push_str(&format!(" <span class=\"mark hardened\" title=\"{} verdicts hardened, not sound\">hardened</span></td>", t.hardened));
                    }
                }
                None => b.push_str("<td data-v=\"-2\">–</td>"),
            }
        }
        b.push_str("</tr>\n");
    }
    b.push_str("</tbody></table>\n");
    b
}

fn charts(runs: &[RunStats]) -> String {
    let mut b = String::from("<h2>Charts</h2>\n");
    b.push_str(&legend(runs));
    b.push_str("<div class=\"charts\">\n");
    let k_max = runs.iter().map(|r| r.max_k()).max().unwrap_or(1).max(1);
    let pass_k: Vec<Vec<(f64, f64)>> = runs.iter().map(|r| (1..=k_max).filter_map(|k| r.pass_at(k, false).map(|v| (k as f64, v))).collect()).collect();
    b.push_str(&svg::lines("pass@k against k", &pass_k, "k", "pass@k", Some(1.0)));
    let reward_labels: Vec<String> = (0..10).map(|i| format!("{}–{}", i as f64 / 10.0, if i == 9 { "1".to_string() } else { format!("{}", (i + 1) as f64 / 10.0) }).replace("0.", ".")).collect();
    let rewards: Vec<Vec<f64>> = runs.iter().map(|r| r.reward_bins.iter().map(|&v| v as f64).collect()).collect();
    b.push_str(&svg::bars("reward distribution (bins of 0.1)", &reward_labels, &rewards, "rollouts"));
    let statuses: Vec<String> = Status::ALL.iter().map(|s| s.to_string()).collect();
    let counts: Vec<Vec<f64>> = runs.iter().map(|r| Status::ALL.iter().map(|s| *r.counts.get(s).unwrap_or(&0) as f64).collect()).collect();
    b.push_str(&svg::bars("status breakdown", &statuses, &counts, "rollouts"));
    let mut phase_labels: Vec<String> = PHASE_BINS_MS.iter().map(|ms| format!("<{}", if *ms >= 1000.0 { format!("{}s", ms / 1000.0) } else { format!("{ms}ms") })).collect();
    phase_labels.push(">100s".into());
    for (i, phase) in ["fork", "agent", "score"].iter().enumerate() {
        let series: Vec<Vec<f64>> = runs.iter().map(|r| r.phase_bins[i].iter().map(|&v| v as f64).collect()).collect();
        b.push_str(&svg::bars(&format!("{phase} time"), &phase_labels, &series, "rollouts"));
    }
    let throughput: Vec<Vec<(f64, f64)>> = runs.iter().map(throughput).collect();
    b.push_str(&svg::lines("throughput over the run", &throughput, "seconds since the first rollout started", "rollouts/s", None));
    b.push_str("</div>\n");
    b
}

/// Rollouts finished per second in 20 equal slices of the run.
fn throughput(run: &RunStats) -> Vec<(f64, f64)> {
    let Some(start) = run.first_start_ms else { return Vec::new() };
    let end = run.ends_ms.iter().cloned().fold(start as f64, f64::max);
    let span = (end - start as f64).max(1.0);
    let slice = span / 20.0;
    let mut bins = [0u64; 20];
    for e in &run.ends_ms {
        bins[(((e - start as f64) / slice) as usize).min(19)] += 1;
    }
    bins.iter().enumerate().map(|(i, &n)| (((i as f64 + 0.5) * slice) / 1e3, n as f64 / (slice / 1e3))).collect()
}

fn provenance(runs: &[RunStats]) -> String {
    let mut b = String::from("<h2>Provenance</h2>\n<table id=\"provenance\"><thead><tr><th>run</th><th>folder</th><th>run id</th><th>suite digest</th><th>farm version</th><th>host</th><th>snapshots</th></tr></thead><tbody>\n");
    for run in runs {
        let snapshots: Vec<String> = run.snapshot_ids.iter().take(8).map(|s| escape(s)).collect();
        let more = run.snapshot_ids.len().saturating_sub(8);
        b.push_str(&format!(
            "<tr><td>{}</td><td><code>{}</code></td><td><code>{}</code></td><td><code>{}</code></td><td>{}</td><td>{}</td><td><code>{}</code>{}</td></tr>\n",
            escape(&run.label),
            escape(&run.dir.display().to_string()),
            escape(&run.run_id),
            escape(&run.suite_digests.iter().cloned().collect::<Vec<_>>().join(", ")),
            escape(&run.farm_versions.iter().cloned().collect::<Vec<_>>().join(", ")),
            escape(&run.host),
            snapshots.join(" "),
            if more > 0 { format!(" and {more} more") } else { String::new() }
        ));
    }
    b.push_str("</tbody></table>\n<p>Each task's digest is on its cell in the task table and at the top of its page; each rollout's seed and snapshot are on its page.</p>\n");
    b
}

/// The top of a task's page (its rollouts follow, then [`task_page_tail`]).
pub fn task_page_head(run: &str, task: &str, digest: &str) -> String {
    let body = format!(
        "<p><a href=\"../index.html\">&larr; report</a></p><h1>{} &mdash; run {}</h1><p>task digest <code>{}</code></p>\n",
        escape(task),
        escape(run),
        escape(digest)
    );
    page_head(&format!("{task} ({run})")) + &body
}

pub fn task_page_tail() -> &'static str {
    "</body></html>\n"
}

/// One rollout, in full, as a section of its task's page.
pub fn rollout(row: &Row) -> String {
    let mut b = format!(
        "<section class=\"rollout\" id=\"sample-{}{}\"><h2>sample {} &mdash; <span class=\"{}\">{}</span>, reward {}</h2>\n<table>",
        row.sample_index,
        row.rollout_id.as_deref().map(|r| format!("-{}", escape(r))).unwrap_or_default(),
        row.sample_index,
        match row.status {
            Status::Passed => "pass",
            _ => "fail",
        },
        row.status,
        row.reward.map(|r| format!("{r}")).unwrap_or_else(|| "null".into())
    );
    let mut fact = |k: &str, v: String| b.push_str(&format!("<tr><th>{k}</th><td>{}</td></tr>", escape(&v)));
    fact("seed", row.seed.to_string());
    fact("snapshot", row.snapshot_id.clone());
    if let Some(id) = &row.rollout_id {
        fact("rollout id", id.clone());
    }
    if let Some(g) = &row.group_id {
        fact("group id", g.clone());
    }
    if let Some(v) = row.policy_version {
        fact("policy version", v.to_string());
    }
    fact("attempts", row.attempts.to_string());
    if let Some(trust) = row.trust {
        fact("trust", format!("{trust}: {}", row.trust_reason.as_deref().unwrap_or("")));
    }
    let t = &row.timings;
    fact("timings", format!("fork {:.0} ms, agent {:.0} ms, score {:.0} ms, total {:.0} ms", t.fork_ms, t.rollout_ms, t.score_ms, t.total_ms));
    fact("started at (ms since epoch)", row.started_at_ms.to_string());
    if let Some(e) = &row.error {
        fact("error", e.clone());
    }
    b.push_str("</table>\n<h3>steps</h3>\n");
    for step in &row.steps {
        b.push_str(&format!(
            "<div class=\"step\"><div>#{} {} &middot; exit {} &middot; {:.0} ms</div><pre class=\"text\">{}</pre>",
            step.index,
            step_kind(step.kind),
            step.exit_code.map(|c| c.to_string()).unwrap_or_else(|| "–".into()),
            step.duration_ms,
            escape(&head(&step.text, 8192))
        ));
        if !step.stdout.is_empty() {
            b.push_str(&format!("<div>stdout (tail)</div><pre class=\"stdout\">{}</pre>", escape(&tail(&step.stdout, 4096))));
        }
        if !step.stderr.is_empty() {
            b.push_str(&format!("<div>stderr (tail)</div><pre class=\"stderr\">{}</pre>", escape(&tail(&step.stderr, 4096))));
        }
        b.push_str("</div>\n");
    }
    let details: serde_json::Value = serde_json::from_str(&row.score_details).unwrap_or_default();
    let answer = details["artifacts"]["answer"].as_str().map(String::from).or_else(|| row.steps.iter().rev().find(|s| s.kind == StepKind::Submit).map(|s| s.text.clone()));
    b.push_str(&format!("<h3>answer</h3><pre class=\"answer\">{}</pre>\n", escape(answer.as_deref().unwrap_or("(none)"))));
    if row.messages != "[]" {
        let pretty = serde_json::from_str::<serde_json::Value>(&row.messages).ok().and_then(|v| serde_json::to_string_pretty(&v).ok()).unwrap_or_else(|| row.messages.clone());
        b.push_str(&format!("<h3>messages</h3><pre class=\"messages\">{}</pre>\n", escape(&head(&pretty, 32 * 1024))));
    }
    let pretty = serde_json::to_string_pretty(&details).unwrap_or_default();
    b.push_str(&format!("<h3>score details</h3><pre class=\"details\">{}</pre>\n</section>\n", escape(&head(&pretty, 16 * 1024))));
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_from_a_rollout_cannot_become_markup() {
        assert_eq!(escape("<script>alert('x')</script> & \"q\""), "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;");
        assert_eq!(escape("a\u{1b}[2Jb\nc"), "a\\u{1b}[2Jb\nc");
        assert_eq!(tail("abcdef", 3), "[... 3 bytes before ...]\ndef");
        assert_eq!(head("héllo", 2), "h\n[... 5 more bytes ...]");
    }
}
