//! The report without a VM: its numbers, its leaderboard's columns, summary.json as older
//! farms wrote it, and rows whose every string field is hostile markup, rendered into the
//! front page and task pages and checked for anything that became markup.

use engine::row::{Row, Status, Step, StepKind, Timings};

use super::*;

#[test]
fn pass_at_k_mean_reward_and_its_interval() {
    let mut run = RunStats::default();
    run.tasks.insert(
        "a".into(),
        TaskStats {
            rollouts: 2,
            scored: 2,
            passed: 1,
            reward_sum: 1.0,
            rewarded: 2,
            ..Default::default()
        },
    );
    run.tasks.insert(
        "b".into(),
        TaskStats {
            rollouts: 2,
            scored: 2,
            passed: 2,
            reward_sum: 2.0,
            rewarded: 2,
            ..Default::default()
        },
    );
    assert_eq!(run.pass_at(1, false), Some(0.75));
    assert_eq!(run.pass_at(2, false), Some(1.0));
    assert_eq!(run.pass_at(2, true), Some(0.5));
    assert_eq!(run.pass_at(3, false), None);
    assert_eq!(run.mean_reward(), Some(0.75));
    let (low, high) = run.reward_interval().unwrap();
    assert!(
        (0.5..=0.75).contains(&low) && (0.75..=1.0).contains(&high),
        "{low} {high}"
    );
    assert_eq!(
        run.reward_interval(),
        Some((low, high)),
        "the same run gives the same interval"
    );
}

/// A plain row of `task`, sample `sample`, with `status`.
fn row(task: &str, sample: u32, status: Status) -> Row {
    Row {
        run_id: "run-1".into(),
        suite_name: "suite".into(),
        policy_name: "replay".into(),
        policy_params: r#"{"model":"m"}"#.into(),
        reward: (status != Status::EnvError).then_some(if status == Status::Passed { 1.0 } else { 0.0 }),
        status,
        ..Row::blank(task, sample, 1)
    }
}

fn run_of(label: &str, rows: &[Row]) -> RunStats {
    let mut run = RunStats {
        label: label.into(),
        ..Default::default()
    };
    for r in rows {
        run.add(0, r);
    }
    run
}

/// The header and each run's cells of the front page's leaderboard, as text.
fn leaderboard(html: &str) -> Vec<Vec<String>> {
    let table = html
        .split("id=\"leaderboard\"")
        .nth(1)
        .unwrap()
        .split("</table>")
        .next()
        .unwrap();
    table
        .split("<tr>")
        .skip(1)
        .map(|row| {
            row.split("</tr>")
                .next()
                .unwrap()
                .split("<t")
                .skip(1)
                .map(|c| c.split_once('>').unwrap().1.split("</t").next().unwrap().to_string())
                .collect()
        })
        .collect()
}

#[test]
fn the_leaderboard_shows_pass_at_k_columns_only_for_k_above_one() {
    let once = run_of("once", &[row("a", 0, Status::Passed), row("b", 0, Status::Failed)]);
    let table = leaderboard(&index::index(&[once]));
    assert_eq!(table[0][7..9], ["pass@1", "mean reward"], "{table:?}");
    assert_eq!(
        table[0]
            .iter()
            .filter(|h| h.starts_with("pass@") || h.starts_with("pass^"))
            .count(),
        1,
        "{table:?}"
    );
    assert_eq!(
        (
            table[1][7].as_str(),
            &table[1][8][..5],
            table[1][9].as_str(),
            table[1][10].as_str()
        ),
        ("0.500", "0.500", "1", "1"),
        "{table:?}"
    );
    assert_eq!(table[0].len(), table[1].len());

    let twice = run_of(
        "twice",
        &[
            row("a", 0, Status::Passed),
            row("a", 1, Status::Failed),
            row("b", 0, Status::Passed),
            row("b", 1, Status::Passed),
        ],
    );
    let table = leaderboard(&index::index(&[twice]));
    assert_eq!(
        table[0][7..12],
        ["pass@1", "pass@2", "pass^2", "mean reward", "passed"],
        "{table:?}"
    );
    assert_eq!(table[1][7..10], ["0.750", "1.000", "0.500"], "{table:?}");
    assert!(table[1][10].starts_with("0.750"), "{table:?}");
    assert_eq!(table[1][11..15], ["3", "1", "0", "0"], "{table:?}");
    assert_eq!(table[0].len(), table[1].len());
}

#[test]
fn summary_json_of_any_age_loads() {
    let dir = tempfile::tempdir().unwrap();
    let write = |text: &str| std::fs::write(dir.path().join("summary.json"), text).unwrap();
    assert!(read_summary(dir.path()).performance.is_none(), "no summary.json");
    write(
        r#"{"finished": 3, "performance": {"wall_secs": 2.5, "rollouts_per_sec": 1.2, "fork": null}, "provenance": {"host": "h", "cores": 2}}"#,
    );
    let summary = read_summary(dir.path());
    let performance = summary.performance.unwrap();
    assert_eq!(
        (
            performance.wall_secs,
            performance.rollouts_per_sec,
            summary.provenance.unwrap().host.as_str()
        ),
        (2.5, 1.2, "h")
    );
    write(r#"{"finished": 3}"#);
    assert!(
        read_summary(dir.path()).performance.is_none(),
        "an older summary without performance"
    );
    write(r#"{"performance": null, "provenance": {}}"#);
    let summary = read_summary(dir.path());
    assert!(summary.performance.is_none() && summary.provenance.unwrap().host.is_empty());
    write("{not json");
    assert!(
        read_summary(dir.path()).performance.is_none(),
        "a corrupt summary is left out"
    );
}

/// Markup that must stay text, marked with the field it was put in.
fn hostile(field: &str) -> String {
    format!("<script>alert({field})</script>\"><img src=x onerror=alert({field})>\" onmouseover=\"alert({field})</pre></td></table>\u{1b}[2J\u{1b}]0;{field}\u{7}")
}

/// How [`hostile`] text of `field` reads in the page once escaped.
fn escaped(field: &str) -> String {
    format!("&lt;script&gt;alert({field})&lt;/script&gt;")
}

/// A row whose every string is hostile. `json` puts the JSON fields' hostile text inside
/// JSON (as the farm writes them), else they are hostile text that is not JSON at all.
fn hostile_row(json: bool) -> Row {
    let tag = if json { "json" } else { "raw" };
    let field = |name: &str| hostile(&format!("{name}_{tag}"));
    let as_json = |name: &str, shape: fn(String) -> serde_json::Value| {
        if json {
            shape(field(name)).to_string()
        } else {
            field(name)
        }
    };
    let step = |kind: StepKind, name: &str| Step {
        exit_code: Some(1),
        text: field(&format!("{name}_text")),
        stdout: field(&format!("{name}_stdout")),
        stderr: field(&format!("{name}_stderr")),
        ..Step::new(0, kind, "")
    };
    Row {
        run_id: field("run_id"),
        suite_name: field("suite_name"),
        suite_digest: field("suite_digest"),
        task_id: field("task_id"),
        task_digest: field("task_digest"),
        sample_index: 0,
        seed: 7,
        snapshot_id: field("snapshot_id"),
        policy_name: field("policy_name"),
        policy_params: as_json("model", |m| serde_json::json!({ "model": m })),
        steps: vec![
            step(StepKind::Exec, "exec"),
            step(StepKind::WriteFile, "write_file"),
            step(StepKind::Submit, "submit"),
        ],
        messages: as_json(
            "messages",
            |m| serde_json::json!([{ "role": "assistant", "content": m }]),
        ),
        usage: Default::default(),
        reward: Some(0.0),
        status: Status::Failed,
        error: Some(field("error")),
        score_details: as_json(
            "score_details",
            |d| serde_json::json!({ "basis": d.clone(), "artifacts": { "answer": d.replace("score_details", "answer") } }),
        ),
        trust: Some(scorers::Trust::Hardened),
        trust_reason: Some(field("trust_reason")),
        attempts: 1,
        timings: Timings {
            fork_ms: 5.0,
            rollout_ms: 50.0,
            score_ms: 500.0,
            total_ms: 555.0,
        },
        started_at_ms: 1_000,
        farm_version: field("farm_version"),
        rollout_id: Some(field("rollout_id")),
        group_id: Some(field("group_id")),
        policy_version: Some(3),
        metadata: Some(as_json("metadata", |m| serde_json::json!({ "item": m }))),
        rollout_vm: Some(snapshotter::Start::Reset),
        scoring_vm: Some(snapshotter::Start::ResetFailed),
        reset_error: Some(field("reset_error")),
        chain: None,
        attachments: Vec::new(),
    }
}

/// The tags a report page may hold: the report's own (a template that starts using another
/// adds it here). Any other, or a second `<script>`, came from a run.
const OUR_TAGS: &[&str] = &[
    "!DOCTYPE",
    "html",
    "head",
    "meta",
    "title",
    "style",
    "script",
    "body",
    "h1",
    "h2",
    "h3",
    "p",
    "a",
    "b",
    "i",
    "br",
    "wbr",
    "span",
    "code",
    "pre",
    "div",
    "section",
    "label",
    "input",
    "table",
    "thead",
    "tbody",
    "tr",
    "th",
    "td",
    "figure",
    "figcaption",
    "svg",
    "line",
    "text",
    "rect",
    "polyline",
    "circle",
];

/// Fails when anything in `page` (named `name`) is markup or a control character that a
/// run's text put there.
fn assert_nothing_became_markup(name: &str, page: &str) {
    assert!(
        !page.chars().any(|c| c.is_control() && c != '\n' && c != '\t'),
        "{name}: a control character reached the page:\n{page}"
    );
    assert_eq!(page.matches("<script").count(), 1, "{name}: a second script:\n{page}");
    assert!(
        !page.contains("onmouseover=\""),
        "{name}: an attribute broke out:\n{page}"
    );
    // The page's own style and script hold `<` and `>` as code; every other `<` opens or
    // closes one of the report's own tags.
    let (before, rest) = page.split_once("<style>").unwrap();
    let after = rest.split_once("</script>").unwrap().1;
    let mut open = std::collections::BTreeMap::<&str, i64>::new();
    for markup in [before, after] {
        for tag in markup.split('<').skip(1) {
            let (closing, tag) = tag.strip_prefix('/').map_or((false, tag), |t| (true, t));
            let name_end = tag
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '!' || c == '-'))
                .unwrap_or(tag.len());
            let tag_name = &tag[..name_end];
            assert!(
                OUR_TAGS.contains(&tag_name),
                "{name}: <{tag_name}> is not the report's:\n{page}"
            );
            *open.entry(tag_name).or_default() += if closing { -1 } else { 1 };
        }
    }
    for tag in ["pre", "td", "th", "table", "section", "span", "code", "title", "a"] {
        assert_eq!(
            open.get(tag).copied().unwrap_or(0),
            0,
            "{name}: <{tag}> opened and closed unevenly:\n{page}"
        );
    }
}

#[test]
fn hostile_text_in_any_field_of_a_row_stays_text() {
    let mut pages = Vec::new();
    let mut runs = Vec::new();
    for json in [true, false] {
        let row = hostile_row(json);
        let tag = if json { "json" } else { "raw" };
        let mut run = RunStats {
            label: hostile(&format!("label_{tag}")),
            dir: PathBuf::from(hostile(&format!("dir_{tag}"))),
            host: hostile(&format!("host_{tag}")),
            ..Default::default()
        };
        let page = run.add(runs.len(), &row).page.clone();
        pages.push((
            page,
            rollout::task_page_start(&run.label, &row.task_id, &row.task_digest)
                + &rollout::rollout(&row)
                + rollout::PAGE_END,
        ));
        runs.push(run);
    }
    pages.push(("index.html".into(), index::index(&runs)));
    for (name, page) in &pages {
        assert_nothing_became_markup(name, page);
    }

    // Every field is on a page, escaped: a field left out would hide from the checks above.
    let all: String = pages.iter().map(|(_, page)| page.as_str()).collect();
    let fields = [
        "label",
        "dir",
        "host",
        "run_id",
        "suite_name",
        "suite_digest",
        "task_id",
        "task_digest",
        "snapshot_id",
        "policy_name",
        "model",
        "exec_text",
        "exec_stdout",
        "exec_stderr",
        "write_file_text",
        "write_file_stdout",
        "write_file_stderr",
        "submit_text",
        "submit_stdout",
        "submit_stderr",
        "messages",
        "error",
        "score_details",
        "trust_reason",
        "farm_version",
        "rollout_id",
        "group_id",
        "metadata",
        "reset_error",
    ];
    for field in fields {
        for tag in ["json", "raw"] {
            let marked = format!("{field}_{tag}");
            assert!(all.contains(&escaped(&marked)), "{marked} is on no page");
            // Shown by the report, or by JSON's own escaping inside a JSON field.
            let shown = [
                format!("\\u{{1b}}]0;{marked}\\u{{7}}"),
                format!("\\u001b]0;{marked}\\u0007"),
            ];
            assert!(
                shown.iter().any(|s| all.contains(s.as_str())),
                "{marked}'s terminal escape is not shown as text"
            );
        }
    }
    assert!(
        all.contains(&escaped("answer_json")),
        "the answer from score details is on no page"
    );
    assert!(
        pages[0]
            .1
            .contains("&quot;&gt;&lt;img src=x onerror=alert(rollout_id_json)&gt;"),
        "the rollout id in the section's id attribute"
    );
}
