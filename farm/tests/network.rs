//! Egress by allowlist: a template's setup installs a package with pip from a package index
//! the test serves on the host's loopback (`python3 -m http.server`), reached from the guest as
//! `host.farm.internal`, through farm's proxy;
//! a host not on the list is refused with a clear error, at once; a VM without an allowlist
//! gets nothing. Nothing comes from outside the machine: the wheel is written here and pip
//! is the host Python's own bundled wheel.

mod common;
use common::{farm_run, journal_rows, text};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A package index on 127.0.0.1 serving `farmtestpkg` 1.0; its port.
fn package_index(dir: &Path) -> (Server, u16) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/package_index.py");
    let o = Command::new("python3").arg(script).arg(dir).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = Server(
        Command::new("python3")
            .args([
                "-m",
                "http.server",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--directory",
            ])
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    for _ in 0..600 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return (server, port);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("the package index did not start");
}

/// The host Python's bundled pip wheel (runnable as `python3 pip.whl/pip`).
fn pip_wheel() -> PathBuf {
    let o = Command::new("python3")
        .args(["-c", "import ensurepip, glob, os; print(sorted(glob.glob(os.path.join(os.path.dirname(ensurepip.__file__), '_bundled', 'pip-*.whl')))[-1])"])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "the host Python has no bundled pip wheel: {}",
        text(&o)
    );
    PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())
}

fn build(store: &Path, config: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_farm"))
        .env("FARM_SNAPSHOT_DIR", store)
        .args(["template", "build"])
        .arg(config)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn setup_reaches_only_the_allowed_index_and_everything_else_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = tempfile::tempdir().unwrap();
    let (_index, port) = package_index(&dir.path().join("index"));
    std::fs::copy(pip_wheel(), dir.path().join("pip.whl")).unwrap();
    let fetch_denied = "import urllib.request as u\ntry:\n    u.urlopen('http://10.1.2.3:8080/x', timeout=60)\nexcept Exception as e:\n    print(e.read().decode() if hasattr(e, 'read') else e)\n    raise SystemExit(3)";

    // Allowed: pip installs from the index through the proxy.
    let config = dir.path().join("allowed.toml");
    std::fs::write(
        &config,
        format!(
            "[template]\nimage = \"python\"\nsetup = [\n  \"python3 /opt/pip.whl/pip install --no-cache-dir --break-system-packages --trusted-host host.farm.internal --index-url http://host.farm.internal:{port}/simple/ farmtestpkg\",\n  \
             \"python3 -c 'import farmtestpkg; assert farmtestpkg.VALUE == 42'\",\n]\n\
             [[template.files]]\nsrc = \"pip.whl\"\ndest = \"/opt/pip.whl\"\n[template.network]\nallow = [\"host.farm.internal:{port}\"]\n"
        ),
    )
    .unwrap();
    let o = build(store.path(), &config);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("network: allowed host.farm.internal:{port}")),
        "every attempt is logged: {}",
        text(&o)
    );

    // Denied: a host off the list gets a 403 that says why, not a hang; and it is logged.
    let config = dir.path().join("denied.toml");
    std::fs::write(
        &config,
        format!("[template]\nimage = \"python\"\nsetup = [{:?}]\n[template.network]\nallow = [\"host.farm.internal:{port}\"]\n", format!("python3 -c \"{fetch_denied}\"")),
    )
    .unwrap();
    let o = build(store.path(), &config);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("farm: egress to 10.1.2.3:8080 is not allowed"),
        "{}",
        text(&o)
    );
    assert!(text(&o).contains("network: denied 10.1.2.3:8080"), "{}", text(&o));

    // No allowlist: no proxy settings, and the proxy itself refuses everything (as it does
    // for every scoring VM).
    let via_proxy = format!(
        "import urllib.request as u\nopener = u.build_opener(u.ProxyHandler({{'http': 'http://127.0.0.1:3128'}}))\ntry:\n    opener.open('http://127.0.0.1:{port}/simple/', timeout=60)\nexcept Exception as e:\n    print(e.read().decode() if hasattr(e, 'read') else e)\n    raise SystemExit(3)"
    );
    let config = dir.path().join("none.toml");
    std::fs::write(
        &config,
        format!(
            "[template]\nimage = \"python\"\nsetup = [{:?}]\n",
            format!("python3 -c \"{via_proxy}\"")
        ),
    )
    .unwrap();
    let o = build(store.path(), &config);
    assert!(
        !o.status.success(),
        "a template without an allowlist reached the host: {}",
        text(&o)
    );
    assert!(
        text(&o).contains(&format!("egress to 127.0.0.1:{port} is not allowed (allowlist: none)")),
        "{}",
        text(&o)
    );
}

#[test]
fn rollouts_reach_their_allowlist_through_the_proxy_and_are_refused_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let (_index, port) = package_index(&dir.path().join("index"));
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    // busybox wget honours http_proxy: sample 0 fetches the index page, sample 1 tries a host
    // off the list.
    let lines = [
        format!("wget -q -O index.html http://host.farm.internal:{port}/simple/farmtestpkg/ && grep -q farmtestpkg index.html && echo 42 > out.txt"),
        "wget -O - http://10.1.2.3:8080/ 2>&1; echo 42 > out.txt".to_string(),
    ];
    let trajectories: String = lines
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{}\n", serde_json::json!({ "task_id": "double", "sample_index": i, "actions": [ { "kind": "exec", "command": c } ] })))
        .collect();
    std::fs::write(dir.path().join("t.jsonl"), trajectories).unwrap();
    let suite = dir.path().join("suite.toml");
    std::fs::write(
        &suite,
        format!(
            "[suite]\nname = \"net-rollouts\"\n[template]\nimage = \"minimal\"\n[dataset]\npath = \"{}\"\nformat = \"task_dirs\"\ntasks = [\"double\"]\n\
             [policy]\nkind = \"replay\"\nsource = \"trajectories\"\ntrajectories_file = \"t.jsonl\"\n[rollouts.network]\nallow = [\"host.farm.internal:{port}\"]\n[scoring]\ntimeout_secs = 300\n[output]\ndir = \"out\"\n",
            repo.join("configs/data/serve-tasks").display()
        ),
    )
    .unwrap();
    farm_run(Command::new(env!("CARGO_BIN_EXE_farm")), &suite);
    let rows = journal_rows(&dir.path().join("out"));
    let row = |i: u64| rows.iter().find(|r| r["sample_index"] == i).unwrap();
    assert_eq!(
        row(0)["status"],
        "passed",
        "the allowed index was reachable: {}",
        row(0)
    );
    let denied = row(1)["steps"][0]["stdout"].as_str().unwrap();
    assert!(denied.contains("403"), "a host off the list is refused: {denied}");
}
