//! A task's page (`tasks/r{run}-t{task}.html`): its heading, then every rollout of the task
//! in full (facts, steps with their output, answer, messages, score details). Pages are
//! written piece by piece as rows are read ([`task_page_start`], [`rollout`] per row, then
//! [`PAGE_END`]); every string from a row is spliced into a `maud` template as [`Text`].

use maud::{html, Markup};

pub use super::page::PAGE_END;
use super::page::{first_bytes, last_bytes, page_start, Text};
use engine::row::{Row, Status, Step, StepKind};

/// The top of a task's page (its rollouts follow, then [`PAGE_END`]).
pub fn task_page_start(run: &str, task: &str, digest: &str) -> String {
    let top = html! {
        p { a href="../index.html" { "← report" } }
        h1 { (Text(task)) " — run " (Text(run)) }
        p { "task digest " code { (Text(digest)) } }
    };
    page_start(&format!("{task} ({run})")) + &top.into_string() + "\n"
}

fn step_kind(kind: StepKind) -> &'static str {
    match kind {
        StepKind::Exec => "exec",
        StepKind::WriteFile => "write_file",
        StepKind::Submit => "submit",
    }
}

/// What is known of a rollout besides its steps, as (name, value) rows.
fn facts(row: &Row) -> Vec<(&'static str, String)> {
    let mut facts = vec![("seed", row.seed.to_string()), ("snapshot", row.snapshot_id.clone())];
    if let Some(id) = &row.rollout_id {
        facts.push(("rollout id", id.clone()));
    }
    if let Some(group) = &row.group_id {
        facts.push(("group id", group.clone()));
    }
    if let Some(version) = row.policy_version {
        facts.push(("policy version", version.to_string()));
    }
    if let Some(metadata) = &row.metadata {
        facts.push(("metadata", first_bytes(metadata, 4096).into_owned()));
    }
    facts.push(("attempts", row.attempts.to_string()));
    if let Some(trust) = row.trust {
        facts.push((
            "trust",
            format!("{trust}: {}", row.trust_reason.as_deref().unwrap_or("")),
        ));
    }
    if row.rollout_vm.is_some() || row.scoring_vm.is_some() {
        let start = |s: Option<snapshotter::Start>| s.map_or("none", |s| s.as_str());
        facts.push((
            "VMs",
            format!("rollout: {}, scoring: {}", start(row.rollout_vm), start(row.scoring_vm)),
        ));
    }
    if let Some(error) = &row.reset_error {
        facts.push(("reset error", error.clone()));
    }
    let t = &row.timings;
    facts.push((
        "timings",
        format!(
            "fork {:.0} ms, agent {:.0} ms, score {:.0} ms, total {:.0} ms",
            t.fork_ms, t.rollout_ms, t.score_ms, t.total_ms
        ),
    ));
    facts.push(("started at (ms since epoch)", row.started_at_ms.to_string()));
    if let Some(error) = &row.error {
        facts.push(("error", error.clone()));
    }
    facts
}

fn step(step: &Step) -> Markup {
    let exit = step.exit_code.map(|c| c.to_string()).unwrap_or_else(|| "–".into());
    html! {
        div.step {
            div { "#" (step.index) " " (step_kind(step.kind)) " · exit " (exit) " · " (format!("{:.0}", step.duration_ms)) " ms" }
            pre.text { (Text(&first_bytes(&step.text, 8192))) }
            @if !step.stdout.is_empty() {
                div { "stdout (tail)" }
                pre.stdout { (Text(&last_bytes(&step.stdout, 4096))) }
            }
            @if !step.stderr.is_empty() {
                div { "stderr (tail)" }
                pre.stderr { (Text(&last_bytes(&step.stderr, 4096))) }
            }
        }
    }
}

/// JSON text pretty-printed, or as it is when it does not parse.
fn pretty_json(text: &str) -> String {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| text.to_string())
}

/// One rollout, in full, as a section of its task's page.
pub fn rollout(row: &Row) -> String {
    let id = match &row.rollout_id {
        Some(rollout) => format!("sample-{}-{rollout}", row.sample_index),
        None => format!("sample-{}", row.sample_index),
    };
    let class = if row.status == Status::Passed { "pass" } else { "fail" };
    let reward = row.reward.map(|r| r.to_string()).unwrap_or_else(|| "null".into());
    let parsed: Option<serde_json::Value> = serde_json::from_str(&row.score_details).ok();
    let answer = parsed
        .as_ref()
        .and_then(|d| d["artifacts"]["answer"].as_str())
        .or_else(|| {
            row.steps
                .iter()
                .rev()
                .find(|s| s.kind == StepKind::Submit)
                .map(|s| s.text.as_str())
        });
    let messages = (row.messages != "[]").then(|| pretty_json(&row.messages));
    let details = pretty_json(&row.score_details);
    let section = html! {
        section.rollout id=(Text(&id)) {
            h2 { "sample " (row.sample_index) " — " span.(class) { (row.status.as_str()) } ", reward " (reward) }
            table {
                @for (name, value) in facts(row) { tr { th { (name) } td { (Text(&value)) } } }
            }
            h3 { "steps" }
            @for s in &row.steps { (step(s)) }
            h3 { "answer" }
            pre.answer { (Text(answer.unwrap_or("(none)"))) }
            @if let Some(messages) = &messages {
                h3 { "messages" }
                pre.messages { (Text(&first_bytes(messages, 32 * 1024))) }
            }
            h3 { "score details" }
            pre.details { (Text(&first_bytes(&details, 16 * 1024))) }
        }
    };
    section.into_string() + "\n"
}
