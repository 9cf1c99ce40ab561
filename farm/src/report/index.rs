//! The report's front page, `index.html`: the leaderboard (one row per run), the per-task
//! table with the tasks whose verdict flipped between runs, the charts and where each run
//! came from. Every string from a run is spliced into a `maud` template as [`Text`].

use std::collections::BTreeSet;

use maud::{html, Markup};

use super::page::{first_bytes, num, page, Text};
use super::svg;
use super::{RunStats, PHASE_BINS_MS};
use engine::row::Status;

/// The report's front page.
pub fn index(runs: &[RunStats]) -> String {
    let labels: Vec<&str> = runs.iter().map(|r| r.label.as_str()).collect();
    let body = html! {
        h1 { "farm report: " (Text(&labels.join(" vs "))) }
        (leaderboard(runs))
        (task_table(runs))
        (charts(runs, &labels))
        (provenance(runs))
    };
    page("farm report", body).into_string()
}

/// The largest k of any run (at least 1).
fn largest_k(runs: &[RunStats]) -> u32 {
    runs.iter().map(RunStats::max_k).max().unwrap_or(1).max(1)
}

/// One row per run. Its columns by index: 0 run, 1 suite, 2 policy, 3 model, 4 params,
/// 5 tasks, 6 rollouts, 7 pass@1, then when some task has k > 1 scored rollouts 8 pass@k
/// and 9 pass^k (with k = 1 they would repeat pass@1), then mean reward, the four status
/// counts, env_error share, rollouts/s, wall time and trust.
fn leaderboard(runs: &[RunStats]) -> Markup {
    let k = largest_k(runs);
    let first: BTreeSet<&String> = runs.first().map(|r| r.tasks.keys().collect()).unwrap_or_default();
    html! {
        h2 { "Leaderboard" }
        table #leaderboard .sortable {
            thead {
                tr {
                    th { "run" } th { "suite" } th { "policy" } th { "model" } th { "params" } th { "tasks" } th { "rollouts" } th { "pass@1" }
                    @if k > 1 { th { "pass@" (k) } th { "pass^" (k) } }
                    th title="mean reward over rewarded rollouts, with its 95% bootstrap interval" { "mean reward" }
                    // `wbr`: where a header may wrap, so that the table fits a window.
                    th { "passed" } th { "failed" } th { "timeout" } th { "env_" wbr; "error" }
                    th title="share of rollouts that ended in env_error" { "env_" wbr; "error %" }
                    th { "rollouts" wbr; "/s" } th { "wall s" } th { "trust" }
                }
            }
            tbody {
                @for run in runs { (leaderboard_row(run, k, &first)) }
            }
        }
        p {
            "trust: " span.badge.sound { "sound" } " verdicts rest on checks the agent's code could not reach (the function-call harness, unit tests through the boundary, a checker using farm-sandbox, an answer compared on the host); "
            span.badge.shared { "shared" } " ones are sound checks in scoring VMs that had run other rollouts' checks before ([scoring] isolation = \"sandbox\"); "
            span.badge.hardened { "hardened" } " ones ran the agent's code where the verdict is made (test_user = candidate, final-state scoring), so a capable agent may have forged them. See docs/security.md."
        }
        p { "pass@k is the unbiased estimator over each task's scored rollouts (env_error left out), averaged over tasks with at least k; pass^k: all k pass. The interval resamples tasks (2,000 bootstrap resamples)." }
    }
}

fn leaderboard_row(run: &RunStats, k: u32, first: &BTreeSet<&String>) -> Markup {
    let tasks: BTreeSet<&String> = run.tasks.keys().collect();
    let (extra, missing) = (tasks.difference(first).count(), first.difference(&tasks).count());
    let count = |s: Status| run.counts.get(&s).copied().unwrap_or(0);
    let mean = run.mean_reward();
    html! {
        // The first cell has no attributes: the report's test finds a run's row by `<td>label`.
        tr {
            td {
                (Text(&run.label))
                @if tasks != *first {
                    " " span.warn title="not comparable to the first run's tasks" { "different tasks: " (extra) " not in the first run, " (missing) " of it missing" }
                }
            }
            td.text { (Text(&run.suite_name)) }
            td.text { (Text(&run.policy_name)) }
            td.text { (Text(&run.model)) }
            td.text.params { code { (Text(&first_bytes(&run.policy_params, 200))) } }
            td.num { (run.tasks.len()) }
            td.num { (run.rows) }
            td.num data-k="1" { (num(run.pass_at(1, false), 3)) }
            @if k > 1 {
                td.num { (num(run.pass_at(k, false), 3)) }
                td.num { (num(run.pass_at(k, true), 3)) }
            }
            td.num data-v=(mean.unwrap_or(f64::NAN)) {
                (num(mean, 3))
                @if let Some((low, high)) = run.reward_interval() { br; span.ci { "[" (format!("{low:.3}, {high:.3}")) "]" } }
            }
            @for status in Status::ALL { td.num { (count(status)) } }
            td.num { (format!("{:.1}%", run.env_error_rate() * 100.0)) }
            td.num { (num(run.rate(), 2)) }
            td.num { (num(run.wall(), 1)) }
            td { (trust_badge(run)) }
        }
    }
}

/// The leaderboard's trust cell: how many verdicts of each level. The counts are those of
/// summary.json's `trust`.
fn trust_badge(run: &RunStats) -> Markup {
    let count = |level| run.trust.get(&level).copied().unwrap_or(0);
    let (sound, shared, hardened) = (
        count(scorers::Trust::Sound),
        count(scorers::Trust::Shared),
        count(scorers::Trust::Hardened),
    );
    let total = sound + shared + hardened;
    html! {
        @match (total, shared, hardened) {
            (0, _, _) => "–",
            (_, 0, 0) => span.badge.sound data-sound=(sound) data-shared="0" data-hardened="0" { "sound" },
            (t, sh, 0) => span.badge.shared data-sound=(sound) data-shared=(sh) data-hardened="0" title={ (sh) " of " (t) " verdicts came from scoring VMs that had run other rollouts' checks" } {
                "shared: " (sh) " of " (t)
            },
            (t, sh, h) => span.badge.hardened data-sound=(sound) data-shared=(sh) data-hardened=(h) title={ (h) " of " (t) " verdicts ran the agent's code where the verdict is made" } {
                "hardened: " (h) " of " (t)
            },
        }
    }
}

fn task_table(runs: &[RunStats]) -> Markup {
    let all: BTreeSet<&String> = runs.iter().flat_map(|r| r.tasks.keys()).collect();
    html! {
        h2 { "Tasks" }
        @if runs.len() > 1 {
            p { label { input #only-flipped type="checkbox"; " only tasks that flipped (all samples passed in one run, none or only some in another, and so on)" } }
        }
        table #tasks .sortable {
            thead { tr { th { "task" } @for run in runs { th.text { (Text(&run.label)) " passed" } } } }
            tbody { @for task in all { (task_row(runs, task)) } }
        }
    }
}

fn task_row(runs: &[RunStats], task: &str) -> Markup {
    // A task flipped when its verdict (all samples passed, none, or some) differs between runs.
    let verdicts: BTreeSet<(bool, bool)> = runs
        .iter()
        .filter_map(|r| r.tasks.get(task))
        .filter(|t| t.scored > 0)
        .map(|t| (t.passed > 0, t.passed == t.scored))
        .collect();
    let flipped = verdicts.len() > 1;
    html! {
        tr.flipped[flipped] {
            td.text { (Text(task)) @if flipped { " " b { "flipped" } } }
            @for run in runs {
                @match run.tasks.get(task) {
                    Some(t) => {
                        @let class = if t.passed == t.scored && t.scored > 0 { "pass" } else if t.passed == 0 { "fail" } else { "mixed" };
                        @let rate = if t.scored > 0 { t.passed as f64 / t.scored as f64 } else { -1.0 };
                        td.num.(class) data-v=(format!("{rate:.4}")) title={ "task digest " (Text(&t.digest)) } {
                            a href=(t.page) { (t.passed) "/" (t.scored) }
                            @if t.rollouts > t.scored { " (+" (t.rollouts - t.scored) " env_error)" }
                            @if t.hardened > 0 {
                                " " span.mark.hardened title={ (t.hardened) " verdicts hardened, not sound" } { "hardened" }
                            }
                        }
                    }
                    None => td data-v="-2" { "–" },
                }
            }
        }
    }
}

fn charts(runs: &[RunStats], labels: &[&str]) -> Markup {
    let k_max = largest_k(runs);
    let pass_k: Vec<Vec<(f64, f64)>> = runs
        .iter()
        .map(|r| {
            (1..=k_max)
                .filter_map(|k| r.pass_at(k, false).map(|v| (k as f64, v)))
                .collect()
        })
        .collect();
    let reward_labels: Vec<String> = (0..10)
        .map(|i| {
            format!(
                "{}–{}",
                i as f64 / 10.0,
                if i == 9 {
                    "1".to_string()
                } else {
                    format!("{}", (i + 1) as f64 / 10.0)
                }
            )
            .replace("0.", ".")
        })
        .collect();
    let rewards: Vec<Vec<u64>> = runs.iter().map(|r| r.reward_bins.to_vec()).collect();
    let statuses: Vec<String> = Status::ALL.iter().map(|s| s.to_string()).collect();
    let counts: Vec<Vec<u64>> = runs
        .iter()
        .map(|r| Status::ALL.iter().map(|s| *r.counts.get(s).unwrap_or(&0)).collect())
        .collect();
    let mut phase_labels: Vec<String> = PHASE_BINS_MS
        .iter()
        .map(|ms| {
            format!(
                "<{}",
                if *ms >= 1000.0 {
                    format!("{}s", ms / 1000.0)
                } else {
                    format!("{ms}ms")
                }
            )
        })
        .collect();
    phase_labels.push(">100s".into());
    let throughput: Vec<Vec<(f64, f64)>> = runs.iter().map(throughput).collect();
    html! {
        h2 { "Charts" }
        (svg::legend(labels))
        div.charts {
            (svg::lines("pass@k against k", labels, &pass_k, "k", "pass@k", Some(1.0)))
            (svg::bars("reward distribution (bins of 0.1)", &reward_labels, labels, &rewards, "rollouts"))
            (svg::bars("status breakdown", &statuses, labels, &counts, "rollouts"))
            @for (i, phase) in ["fork", "agent", "score"].iter().enumerate() {
                @let series: Vec<Vec<u64>> = runs.iter().map(|r| r.phase_bins[i].to_vec()).collect();
                (svg::bars(&format!("{phase} time"), &phase_labels, labels, &series, "rollouts"))
            }
            (svg::lines("throughput over the run", labels, &throughput, "seconds since the first rollout started", "rollouts/s", None))
        }
    }
}

/// Rollouts finished per second in 20 equal slices of the run.
fn throughput(run: &RunStats) -> Vec<(f64, f64)> {
    let Some(start) = run.first_start_ms else {
        return Vec::new();
    };
    let end = run.ends_ms.iter().cloned().fold(start as f64, f64::max);
    let span = (end - start as f64).max(1.0);
    let slice = span / 20.0;
    let mut bins = [0u64; 20];
    for e in &run.ends_ms {
        bins[(((e - start as f64) / slice) as usize).min(19)] += 1;
    }
    bins.iter()
        .enumerate()
        .map(|(i, &n)| (((i as f64 + 0.5) * slice) / 1e3, n as f64 / (slice / 1e3)))
        .collect()
}

fn provenance(runs: &[RunStats]) -> Markup {
    let joined = |set: &BTreeSet<String>| set.iter().map(String::as_str).collect::<Vec<_>>().join(", ");
    html! {
        h2 { "Provenance" }
        table #provenance {
            thead { tr { th { "run" } th { "folder" } th { "run id" } th { "suite digest" } th { "farm version" } th { "host" } th { "snapshots" } } }
            tbody {
                @for run in runs {
                    @let snapshots: Vec<&str> = run.snapshot_ids.iter().take(8).map(String::as_str).collect();
                    @let more = run.snapshot_ids.len().saturating_sub(8);
                    tr {
                        td.text { (Text(&run.label)) }
                        td { code { (Text(&run.dir.display().to_string())) } }
                        td { code { (Text(&run.run_id)) } }
                        td { code { (Text(&joined(&run.suite_digests))) } }
                        td.text { (Text(&joined(&run.farm_versions))) }
                        td.text { (Text(&run.host)) }
                        td { code { (Text(&snapshots.join(" "))) } @if more > 0 { " and " (more) " more" } }
                    }
                }
            }
        }
        p { "Each task's digest is on its cell in the task table and at the top of its page; each rollout's seed and snapshot are on its page." }
        (environments(runs))
    }
}

/// What each task's environment was built from (Harbor tasks): the Dockerfile or image,
/// every image resolved (and the reference an override replaced), and a fallback's reason.
fn environments(runs: &[RunStats]) -> Markup {
    use engine::harbor::BuiltFrom;
    html! {
        @if runs.iter().any(|r| !r.environments.is_empty()) {
            h2 { "Environments" }
            table #environments {
                thead { tr { th { "run" } th { "task" } th { "built from" } th { "images resolved" } th { "fallback" } th { "snapshot" } } }
                tbody {
                    @for run in runs {
                        @for (task, env) in &run.environments {
                            tr {
                                td.text { (Text(&run.label)) }
                                td.text { (Text(task)) }
                                td.text {
                                    @match &env.built_from {
                                        BuiltFrom::Dockerfile => "environment/Dockerfile",
                                        BuiltFrom::Image { reference } => { "docker_image " code { (Text(reference)) } }
                                    }
                                }
                                td.text {
                                    @for image in &env.images {
                                        div {
                                            code { (Text(&image.resolved)) }
                                            @if let Some(from) = &image.overridden_from { " (override of " code { (Text(from)) } ")" }
                                            " via " (Text(&image.via))
                                        }
                                    }
                                }
                                td.text {
                                    @if let Some(fallback) = &env.fallback {
                                        code { (Text(&fallback.image)) } " could not be had: " (Text(&fallback.reason))
                                    }
                                }
                                td { code { (Text(&env.snapshot)) } }
                            }
                        }
                    }
                }
            }
        }
    }
}
