//! `farm template build` and `farm snapshot ls|rm|gc` through the binary, in a private
//! snapshot store.

use std::process::{Command, Output};

fn farm(store: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_farm"))
        .env("FARM_SNAPSHOT_DIR", store)
        .args(args)
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn build_reuse_list_and_remove_a_template() {
    let store = tempfile::tempdir().unwrap();
    let config_dir = tempfile::tempdir().unwrap();
    std::fs::write(config_dir.path().join("hello.txt"), "hi from the host\n").unwrap();
    let config = config_dir.path().join("t.toml");
    std::fs::write(
        &config,
        "[template]\nimage = \"minimal\"\nsetup = [\"cat /workspace/hello.txt > /workspace/copy\"]\n\
         [[template.files]]\nsrc = \"hello.txt\"\ndest = \"/workspace/hello.txt\"\n",
    )
    .unwrap();
    let config = config.to_str().unwrap();

    let first = farm(store.path(), &["template", "build", "--quiet", config]);
    assert!(first.status.success(), "{}", text(&first));
    let id = String::from_utf8_lossy(&first.stdout).trim().to_string();
    assert!(id.starts_with("t-"), "{id}");

    let second = farm(store.path(), &["template", "build", config]);
    assert!(second.status.success(), "{}", text(&second));
    assert!(
        text(&second).contains(&format!("reused existing snapshot {id}")),
        "{}",
        text(&second)
    );

    let verify = farm(store.path(), &["snapshot", "verify", &id]);
    assert!(
        verify.status.success() && text(&verify).contains(&format!("{id}: ok")),
        "{}",
        text(&verify)
    );

    let ls = farm(store.path(), &["snapshot", "ls"]);
    assert!(text(&ls).contains(&id) && text(&ls).contains(" ok"), "{}", text(&ls));

    // A failing setup command is reported with its output and leaves nothing behind.
    std::fs::write(
        config_dir.path().join("bad.toml"),
        "[template]\nimage = \"minimal\"\nsetup = [\"echo oops >&2; exit 3\"]\n",
    )
    .unwrap();
    let bad = farm(
        store.path(),
        &[
            "template",
            "build",
            config_dir.path().join("bad.toml").to_str().unwrap(),
        ],
    );
    assert!(!bad.status.success());
    assert!(
        text(&bad).contains("exit code 3") && text(&bad).contains("oops"),
        "{}",
        text(&bad)
    );

    let rm = farm(store.path(), &["snapshot", "rm", &id]);
    assert!(rm.status.success(), "{}", text(&rm));
    let leftovers: Vec<_> = std::fs::read_dir(store.path()).unwrap().collect();
    assert!(leftovers.is_empty(), "store not empty: {leftovers:?}");
}

#[test]
fn bad_template_configs_name_the_key() {
    let store = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("t.toml");
    std::fs::write(&config, "[template]\nimage = \"minimal\"\ncpu = 2\n").unwrap();
    let out = farm(store.path(), &["template", "build", config.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("cpu") && text(&out).contains("t.toml"),
        "{}",
        text(&out)
    );
}

/// Two processes building the same template into one store at once (shards starting together
/// on nodes that share a cache): one builds, the other waits for it and reuses its snapshot,
/// and the store holds that one snapshot and nothing half-made.
#[test]
fn two_processes_racing_on_one_store_build_the_template_once() {
    let store = tempfile::tempdir().unwrap();
    let config_dir = tempfile::tempdir().unwrap();
    let config = config_dir.path().join("t.toml");
    std::fs::write(
        &config,
        "[template]\nimage = \"minimal\"\nsetup = [\"echo raced > /workspace/raced\"]\n",
    )
    .unwrap();
    let start = || {
        Command::new(env!("CARGO_BIN_EXE_farm"))
            .env("FARM_SNAPSHOT_DIR", store.path())
            .args(["template", "build", config.to_str().unwrap()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (start(), start());
    let outputs = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()];
    for o in &outputs {
        assert!(o.status.success(), "{}", text(o));
    }
    let texts: Vec<String> = outputs.iter().map(text).collect();
    let built = texts.iter().filter(|t| t.contains("built snapshot")).count();
    let reused = texts.iter().filter(|t| t.contains("reused existing snapshot")).count();
    assert_eq!((built, reused), (1, 1), "{texts:#?}");
    let names: Vec<String> = std::fs::read_dir(store.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(
        names.len(),
        1,
        "one snapshot and no staging folder or lock left: {names:?}"
    );
    let verify = farm(store.path(), &["snapshot", "verify", &names[0]]);
    assert!(verify.status.success(), "{}", text(&verify));
}

/// More forks than the host's limits allow: the bench names each limit and the setting that
/// lifts it before it starts anything.
#[test]
fn a_bench_the_host_cannot_hold_names_the_limit_before_it_starts() {
    let store = tempfile::tempdir().unwrap();
    let o = farm(
        store.path(),
        &["bench", "fork", "--image", "minimal", "--alive", "100000000"],
    );
    assert!(!o.status.success());
    let t = text(&o);
    assert!(
        t.contains("cannot hold 100000000 forks alive")
            && t.contains("LimitNOFILE")
            && t.contains("kernel.threads-max"),
        "{t}"
    );
    assert_eq!(
        std::fs::read_dir(store.path()).unwrap().count(),
        0,
        "nothing was started or built"
    );
}
