//! `farm report` as a person sees it: two runs of the small serve-sample suite (one honest,
//! one with wrong answers and output that tries to be HTML), rendered by headless Chromium.
//! The leaderboard must say what summary.json says, the flipped tasks must be marked, and
//! the hostile output must show as text. Screenshots go to `target/tmp/report-*.png`.

mod common;
use common::{farm, repo, text};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A suite over configs/data/serve-tasks with `policy` lines, writing to `out`.
fn suite(dir: &Path, name: &str, policy: &str, out: &Path) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            "[suite]\nname = \"report-test\"\n[template]\nimage = \"minimal\"\n[dataset]\npath = \"{}\"\nformat = \"task_dirs\"\n\
             [policy]\nkind = \"replay\"\n{policy}\n[rollouts]\nsamples = 2\n[scoring]\ntimeout_secs = 300\n[output]\ndir = \"{}\"\n",
            repo().join("configs/data/serve-tasks").display(),
            out.display()
        ),
    )
    .unwrap();
    path
}

/// The page as Chromium renders it (after its scripts ran), as HTML.
fn chromium_dom(page: &Path, profile: &Path) -> String {
    let o = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=3000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .output()
        .expect("chromium (scripts/setup.sh installs Debian's chromium)");
    assert!(o.status.success(), "chromium: {}", text(&o));
    String::from_utf8(o.stdout).unwrap()
}

fn screenshot(page: &Path, profile: &Path, name: &str) {
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let o = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1300,2000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "chromium: {}", text(&o));
    assert!(
        std::fs::metadata(&shot).map(|m| m.len() > 1000).unwrap_or(false),
        "no screenshot at {}",
        shot.display()
    );
}

#[test]
fn a_report_of_two_runs_reads_as_summary_json_says_and_escapes_what_rollouts_printed() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("honest"), dir.path().join("hostile"));
    let trajectories = dir.path().join("hostile.jsonl");
    std::fs::write(
        &trajectories,
        [
            r#"{"task_id": "double", "sample_index": 0, "actions": [{"kind": "exec", "command": "echo '<script>document.title=\"PWNED\"</script><img src=x onerror=alert(1)>'; echo 41 > out.txt"}]}"#,
            r#"{"task_id": "double", "sample_index": 1, "actions": [{"kind": "exec", "command": "echo 42 > out.txt"}]}"#,
            r#"{"task_id": "answer", "sample_index": 0, "actions": [{"kind": "submit", "answer": "</pre><b id=injected>41</b>"}]}"#,
            r#"{"task_id": "answer", "sample_index": 1, "actions": [{"kind": "submit", "answer": "41"}]}"#,
        ]
        .join("\n"),
    )
    .unwrap();
    for (config, out) in [
        (suite(dir.path(), "honest", "", &a), &a),
        (
            suite(
                dir.path(),
                "hostile",
                &format!(
                    "source = \"trajectories\"\ntrajectories_file = \"{}\"",
                    trajectories.display()
                ),
                &b,
            ),
            &b,
        ),
    ] {
        let o = farm(&["run", config.to_str().unwrap()]);
        assert!(o.status.success(), "{}", text(&o));
        assert!(out.join("summary.json").exists());
    }

    let report = dir.path().join("report");
    let o = farm(&[
        "report",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--out",
        report.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let index = report.join("index.html");
    let profile = dir.path().join("chromium-profile");
    let dom = chromium_dom(&index, &profile);
    screenshot(&index, &profile, "report-index.png");

    // The leaderboard says what each summary.json says.
    let leaderboard = dom
        .split("id=\"leaderboard\"")
        .nth(1)
        .unwrap()
        .split("</table>")
        .next()
        .unwrap();
    for (out, label) in [(&a, "honest"), (&b, "hostile")] {
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
        let row = leaderboard
            .split("<tr>")
            .find(|r| r.contains(&format!("<td>{label}")))
            .unwrap_or_else(|| panic!("no leaderboard row for {label}: {leaderboard}"));
        let cells: Vec<String> = row
            .split("<td")
            .skip(1)
            .map(|c| c.split_once('>').unwrap().1.split("</td>").next().unwrap().to_string())
            .collect();
        assert_eq!(
            cells[6],
            summary["finished"].to_string(),
            "rollouts of {label}: {cells:?}"
        );
        assert_eq!(
            cells[7],
            format!("{:.3}", summary["pass_at_k"]["1"].as_f64().unwrap()),
            "pass@1 of {label}: {cells:?}"
        );
        assert_eq!(
            cells[8],
            format!("{:.3}", summary["pass_at_k"]["2"].as_f64().unwrap()),
            "pass@2 of {label}: {cells:?}"
        );
        assert_eq!(
            cells[9],
            format!("{:.3}", summary["pass_hat_k"]["2"].as_f64().unwrap()),
            "pass^2 of {label}: {cells:?}"
        );
        assert!(
            cells[10].starts_with(&format!("{:.3}", summary["mean_reward"].as_f64().unwrap())),
            "mean reward of {label}: {cells:?}"
        );
        for (i, status) in ["passed", "failed", "timeout", "env_error"].iter().enumerate() {
            assert_eq!(
                cells[11 + i],
                summary["counts"][status].to_string(),
                "{status} of {label}: {cells:?}"
            );
        }
    }
    // Both tasks flipped: every sample passed in one run, only some in the other.
    assert_eq!(dom.matches("class=\"flipped\"").count(), 2, "{dom}");
    for chart in [
        "pass@k against k",
        "reward distribution",
        "status breakdown",
        "fork time",
        "agent time",
        "score time",
        "throughput over the run",
    ] {
        assert!(dom.contains(&format!("<figcaption>{chart}")), "no chart {chart}");
    }
    assert!(dom.contains("id=\"provenance\""));

    // The hostile run's rollout pages show its output as text; none of it became markup.
    let pages: Vec<PathBuf> = std::fs::read_dir(report.join("tasks"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("r1-"))
        .collect();
    assert_eq!(pages.len(), 2);
    let mut seen = 0;
    for page in &pages {
        let dom = chromium_dom(page, &profile);
        assert!(
            !dom.contains("<img") && !dom.contains("id=\"injected\"") && !dom.contains("<title>PWNED"),
            "rollout output became markup in {}:\n{dom}",
            page.display()
        );
        if dom.contains("&lt;script&gt;document.title=\"PWNED\"&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;") {
            seen += 1;
            assert!(
                dom.contains("seed") && dom.contains("snapshot") && dom.contains("t-"),
                "{dom}"
            );
            screenshot(page, &profile, "report-rollouts.png");
        }
        if dom.contains("&lt;/pre&gt;&lt;b id=injected&gt;41&lt;/b&gt;") {
            seen += 1;
        }
    }
    assert_eq!(seen, 2, "both hostile outputs are shown, escaped");
}

#[test]
fn a_missing_folder_or_one_that_is_not_a_run_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let o = farm(&[
        "report",
        missing.to_str().unwrap(),
        "--out",
        dir.path().join("r").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).contains(&format!("{}: no such folder", missing.display())),
        "{}",
        text(&o)
    );
    let o = farm(&[
        "report",
        dir.path().to_str().unwrap(),
        "--out",
        dir.path().join("r").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("not a farm run (no manifest.json)"), "{}", text(&o));
}
