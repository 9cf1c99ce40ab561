//! Template images from OCI and Docker archives, OCI layouts and root filesystem folders,
//! built here with Debian's real tools (umoci, skopeo) from a root filesystem the test
//! makes; and hostile archives, crafted with Python's tarfile, that must be refused or kept
//! inside the image.

mod common;
use common::{farm_run, repo, text};

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn sh(dir: &Path, script: &str) {
    let o = Command::new("sh")
        .arg("-ec")
        .arg(script)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{script}\n{}", text(&o));
}

/// A cache folder of the test's own, for what it converts, pulls and snapshots: the test's
/// images are made afresh each run, so none of it would be reused, and the user's cache
/// (`~/.cache/farm`) would grow by a dozen images and templates a run. The guest kernel,
/// the agent and the base images come from the shared cache through its `current/` links.
/// Removed when the test ends, passed or not.
struct TestCache(tempfile::TempDir);

impl TestCache {
    fn new() -> TestCache {
        let shared = std::env::var_os("FARM_CACHE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/farm"));
        assert!(
            shared.join("current").is_dir(),
            "no {}: run scripts/setup.sh first",
            shared.join("current").display()
        );
        // On the shared cache's file system, as the conversions would have been.
        std::fs::create_dir_all(shared.join("tmp")).unwrap();
        let dir = tempfile::Builder::new()
            .prefix("images-test-")
            .tempdir_in(shared.join("tmp"))
            .unwrap();
        std::os::unix::fs::symlink(shared.join("current"), dir.path().join("current")).unwrap();
        TestCache(dir)
    }

    /// `farm` with this cache.
    fn farm(&self) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_farm"));
        command.env("FARM_CACHE_DIR", self.0.path());
        command
    }
}

impl std::ops::Deref for TestCache {
    type Target = Path;
    fn deref(&self) -> &Path {
        self.0.path()
    }
}

fn vm_run(cache: &TestCache, image: &str, command: &str) -> Output {
    vm_run_with(cache, image, &[], command)
}

fn vm_run_with(cache: &TestCache, image: &str, flags: &[&str], command: &str) -> Output {
    cache
        .farm()
        .args(["vm", "run", "--image", image])
        .args(flags)
        .args(["--", "sh", "-c", command])
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// An OCI layout `L:t` of two layers made by umoci: busybox and some files, then a second
/// layer that deletes a file (a whiteout), replaces a folder (an opaque folder), adds a
/// symbolic and a hard link and a user; its config sets User, WorkingDir and Env. A file has
/// a time of its own (2017). Copied by skopeo into an OCI archive and a Docker archive.
fn build_images(dir: &Path) {
    sh(
        dir,
        r#"
umoci init --layout L
umoci new --image L:t
umoci unpack --image L:t B >/dev/null
R=B/rootfs
mkdir -p $R/bin $R/etc $R/data/opq
cp /bin/busybox $R/bin/busybox
for applet in $($R/bin/busybox --list-full); do mkdir -p "$R/$(dirname "$applet")"; [ -e "$R/$applet" ] || ln -s /bin/busybox "$R/$applet"; done
echo gone > $R/data/removed; echo keep > $R/data/kept; echo old > $R/data/opq/old
touch -d @1500000000 $R/data/kept
umoci repack --image L:t B >/dev/null
rm -rf B
umoci unpack --image L:t B >/dev/null
R=B/rootfs
rm $R/data/removed; rm -rf $R/data/opq; mkdir $R/data/opq; echo new > $R/data/opq/new
ln -s /data/kept $R/data/link; ln $R/data/kept $R/data/hard
echo 'app:x:1234:1234::/:/bin/sh' >> $R/etc/passwd
umoci repack --image L:t B >/dev/null
umoci config --image L:t --config.user 1234 --config.workingdir /data --config.env FOO=bar
skopeo copy -q oci:L:t oci-archive:img.tar
skopeo copy -q oci:L:t docker-archive:docker.tar:farm/t:1
"#,
    );
}

#[test]
fn oci_and_docker_archives_layouts_and_folders_become_images() {
    let dir = tempfile::tempdir().unwrap();
    let cache = TestCache::new();
    build_images(dir.path());
    let check = "ls /data; ls /data/opq; cat /data/link /data/hard; stat -c '%h links' /data/kept; grep -c '^farm:' /etc/passwd; grep '^app:' /etc/passwd; stat -c '%a %U' /usr/local/bin/farm-sandbox; echo \"config: $FOO $(id -u) $(pwd)\"; stat -c 'mtime %Y' /data/kept";
    for image in [
        format!("oci-archive:{}", dir.path().join("img.tar").display()),
        format!("docker-archive:{}", dir.path().join("docker.tar").display()),
        format!("oci:{}", dir.path().join("L").display()),
        format!("rootfs:{}", dir.path().join("B/rootfs").display()),
    ] {
        let o = vm_run(&cache, &image, check);
        let out = text(&o);
        assert!(o.status.success(), "{image}: {out}");
        let listing: Vec<&str> = out.lines().take(5).collect();
        assert_eq!(
            listing,
            ["hard", "kept", "link", "opq", "new"],
            "{image}: the whiteout and the opaque folder apply: {out}"
        );
        assert!(
            out.contains("keep\nkeep\n2 links\n1\napp:x:1234"),
            "{image}: links and users: {out}"
        );
        assert!(out.contains("4750 root"), "{image}: farm-sandbox: {out}");
        // `farm vm run` applies the image config's Env, User and WorkingDir, as `docker run`
        // does; a rootfs folder has no config.
        let expected = if image.starts_with("rootfs:") {
            "config:  0 /workspace"
        } else {
            "config: bar 1234 /data"
        };
        assert!(out.contains(expected), "{image}: {out}");
        // Files keep their times (Python trusts a .pyc only while its source's time is the
        // one it was compiled from).
        assert!(out.contains("mtime 1500000000"), "{image}: the file's time: {out}");
    }
    // The flags win over the image's config.
    let image = format!("oci-archive:{}", dir.path().join("img.tar").display());
    let o = vm_run_with(
        &cache,
        &image,
        &["--user", "root", "--workdir", "/", "--env", "FOO=baz"],
        "echo \"config: $FOO $(id -u) $(pwd)\"",
    );
    assert_eq!(text(&o).trim(), "config: baz 0 /", "{}", text(&o));
    // Converted once: the OCI layout and the OCI archive are the same image (same manifest
    // digest), so one conversion serves both.
    let conversions = |digest: &str| {
        std::fs::read_dir(cache.join("images"))
            .unwrap()
            .flatten()
            .filter(|e| std::fs::read_to_string(e.path().join("manifest.json")).is_ok_and(|m| m.contains(digest)))
            .count()
    };
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("L/index.json")).unwrap()).unwrap();
    let manifest_digest = index["manifests"][0]["digest"].as_str().unwrap();
    assert_eq!(conversions(manifest_digest), 1);
    // Its layers are in the blob store that registry pulls share.
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("L/blobs/sha256").join(&manifest_digest[7..])).unwrap())
            .unwrap();
    for layer in manifest["layers"].as_array().unwrap() {
        let hex = &layer["digest"].as_str().unwrap()[7..];
        assert!(
            cache.join("oci/blobs/sha256").join(hex).is_file(),
            "layer {hex} is not in the shared blob store"
        );
    }

    // A suite on the converted image: its template's setup and its rollouts see the image
    // config's Env (and setup its WorkingDir), rollouts run as its User (rollouts.user
    // unset); forks of it are scored as usual.
    std::fs::write(
        dir.path().join("trajectories.jsonl"),
        (0..2).map(|i| format!("{{\"task_id\": \"double\", \"sample_index\": {i}, \"actions\": [{{\"kind\": \"exec\", \"command\": \"test \\\"$FOO\\\" = bar && test \\\"$(id -u)\\\" = 1234 && echo 42 > out.txt\"}}]}}\n")).collect::<String>(),
    )
    .unwrap();
    let suite = dir.path().join("suite.toml");
    std::fs::write(
        &suite,
        format!(
            "[suite]\nname = \"on-oci\"\n[template]\nimage = \"oci-archive:img.tar\"\nsetup = [\"test \\\"$FOO\\\" = bar\", \"test \\\"$(pwd)\\\" = /data\"]\n\
             [dataset]\npath = \"{}\"\nformat = \"task_dirs\"\ntasks = [\"double\"]\n[policy]\nkind = \"replay\"\nsource = \"trajectories\"\ntrajectories_file = \"trajectories.jsonl\"\n[scoring]\ntimeout_secs = 300\n[output]\ndir = \"out\"\n",
            repo().join("configs/data/serve-tasks").display()
        ),
    )
    .unwrap();
    let o = farm_run(cache.farm(), &suite);
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("out/summary.json")).unwrap()).unwrap();
    assert_eq!(summary["counts"]["passed"], 2, "{summary}\n{}", text(&o));
}

/// An OCI layout with one layer made by `layer_py` (Python code that adds members to the
/// tarfile `t`); `corrupt` makes the layer's bytes differ from its digest.
fn hostile_layout(dir: &Path, layer_py: &str, corrupt: bool) -> PathBuf {
    let script = format!(
        r#"
import hashlib, io, json, os, sys, tarfile
out = sys.argv[1]
os.makedirs(out + "/blobs/sha256", exist_ok=True)
def blob(data):
    d = hashlib.sha256(data).hexdigest()
    open(out + "/blobs/sha256/" + d, "wb").write(data)
    return "sha256:" + d, len(data)
def member(t, name, kind=tarfile.REGTYPE, data=b"", link="", mode=0o644, pax=None):
    i = tarfile.TarInfo(name); i.type = kind; i.size = len(data) if kind == tarfile.REGTYPE else 0; i.linkname = link; i.mode = mode
    i.pax_headers = pax or {{}}
    t.addfile(i, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
    member(t, "bin", tarfile.DIRTYPE, mode=0o755)
    member(t, "bin/busybox", data=open("/bin/busybox", "rb").read(), mode=0o755)
    member(t, "bin/sh", tarfile.SYMTYPE, link="busybox")
    member(t, "bin/cat", tarfile.SYMTYPE, link="busybox")
{layer_py}
layer = buf.getvalue()
ld, ls = blob(layer)
if {corrupt}:
    open(out + "/blobs/sha256/" + ld[7:], "ab").write(b"tampered")
cd, cs = blob(json.dumps({{"architecture": "amd64", "os": "linux", "config": {{}}, "rootfs": {{"type": "layers", "diff_ids": [ld]}}}}).encode())
md, ms = blob(json.dumps({{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cs}},
    "layers": [{{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": ld, "size": ls}}]}}).encode())
json.dump({{"schemaVersion": 2, "manifests": [{{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": ms}}]}}, open(out + "/index.json", "w"))
open(out + "/oci-layout", "w").write('{{"imageLayoutVersion": "1.0.0"}}')
"#,
        corrupt = if corrupt { "True" } else { "False" }
    );
    let layout = dir.join(format!("layout-{}", std::fs::read_dir(dir).unwrap().count()));
    let o = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&layout)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    layout
}

#[test]
fn hostile_archives_are_refused_and_write_nothing_outside_the_image() {
    let dir = tempfile::tempdir().unwrap();
    let cache = TestCache::new();
    // A host folder outside /tmp (the guest mounts a fresh /tmp over the image's, which
    // would hide where the files land).
    std::fs::create_dir_all("/opt").unwrap();
    let host = tempfile::Builder::new()
        .prefix("farm-image-test-")
        .tempdir_in("/opt")
        .unwrap();
    let outside = host.path().join("host-target");
    std::fs::create_dir_all(&outside).unwrap();

    let refused = [
        ("    member(t, \"../escape\", data=b\"x\")", false, "`..`"),
        ("    member(t, \"/etc/abs\", data=b\"x\")", false, "absolute"),
        (
            "    member(t, \"opt/sda\", tarfile.BLKTYPE)",
            false,
            "device nodes are refused",
        ),
        ("    member(t, \"ok\", data=b\"x\")", true, "does not match its digest"),
    ];
    for (layer, corrupt, reason) in refused {
        let layout = hostile_layout(dir.path(), layer, corrupt);
        let o = vm_run(&cache, &format!("oci:{}", layout.display()), "true");
        assert!(!o.status.success(), "{layer} was accepted");
        assert!(text(&o).contains(reason), "{layer}: {}", text(&o));
    }
    assert!(!dir.path().join("escape").exists());

    // A link to an absolute host path, then a file through it: the file lands inside the
    // image (the link means the image's root there), never on the host.
    let layer = format!(
        "    member(t, \"evil\", tarfile.SYMTYPE, link=\"{}\")\n    member(t, \"evil/pwned\", data=b\"inside\")\n    member(t, \"up\", tarfile.SYMTYPE, link=\"../../../../../..\")\n    member(t, \"up{}/pwned2\", data=b\"inside too\")\n    member(t, \"tagged\", data=b\"x\", pax={{\"SCHILY.xattr.user.farm\": \"kept\"}})",
        outside.display(),
        outside.display()
    );
    let layout = hostile_layout(dir.path(), &layer, false);
    let o = vm_run(
        &cache,
        &format!("oci:{}", layout.display()),
        &format!("cat {0}/pwned {0}/pwned2", outside.display()),
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("insideinside too"), "{}", text(&o));
    assert!(
        std::fs::read_dir(&outside).unwrap().next().is_none(),
        "the archive wrote on the host: {:?}",
        std::fs::read_dir(&outside).unwrap().collect::<Vec<_>>()
    );

    // Extended attributes reach the image (read back with debugfs, without booting).
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(layout.join("index.json")).unwrap()).unwrap();
    let digest = index["manifests"][0]["digest"].as_str().unwrap().to_string();
    let image = std::fs::read_dir(cache.join("images"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|d| std::fs::read_to_string(d.join("manifest.json")).is_ok_and(|m| m.contains(&digest)))
        .expect("the converted image");
    let ea = Command::new("debugfs")
        .args(["-R", "ea_list /tagged"])
        .arg(image.join("rootfs.ext4"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&ea.stdout).contains("user.farm")
            && String::from_utf8_lossy(&ea.stdout).contains("kept"),
        "{}",
        text(&ea)
    );
}

/// A reference registry (Debian's docker-registry) on a loopback port, with htpasswd auth
/// when `user` is given; stopped when dropped.
struct Registry {
    child: std::process::Child,
    addr: String,
    storage: PathBuf,
    _dir: tempfile::TempDir,
}

impl Registry {
    fn start(user: Option<(&str, &str)>) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let storage = dir.path().join("data");
        let mut config = format!("version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n", storage.display());
        if let Some((name, password)) = user {
            let o = Command::new("htpasswd")
                .args(["-Bbn", name, password])
                .output()
                .unwrap();
            assert!(o.status.success(), "htpasswd (package apache2-utils): {}", text(&o));
            std::fs::write(dir.path().join("htpasswd"), &o.stdout).unwrap();
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: farm-test\n    path: {}\n",
                dir.path().join("htpasswd").display()
            ));
        }
        std::fs::write(dir.path().join("config.yml"), config).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(dir.path().join("config.yml"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("log")).unwrap())
            .spawn()
            .expect("docker-registry (package docker-registry)");
        let registry = Registry {
            child,
            addr,
            storage,
            _dir: dir,
        };
        for _ in 0..1200 {
            if std::net::TcpStream::connect(&registry.addr).is_ok() {
                return registry;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!(
            "the registry on {} did not start: {}",
            registry.addr,
            std::fs::read_to_string(registry._dir.path().join("log")).unwrap_or_default()
        );
    }

    /// Pushes the OCI layout `layout` (as `L:t`) to `name`, with credentials if given.
    fn push(&self, layout: &Path, name: &str, creds: Option<&str>) {
        let mut cmd = Command::new("skopeo");
        cmd.args(["copy", "-q", "--dest-tls-verify=false"]);
        if let Some(creds) = creds {
            cmd.args(["--dest-creds", creds]);
        }
        let o = cmd
            .arg(format!("oci:{}:t", layout.display()))
            .arg(format!("docker://{}/{name}", self.addr))
            .output()
            .unwrap();
        assert!(o.status.success(), "skopeo copy to {name}: {}", text(&o));
    }

    /// The manifest digest `name` has now.
    fn digest(&self, name: &str, creds: Option<&str>) -> String {
        let mut cmd = Command::new("skopeo");
        cmd.args(["inspect", "--raw", "--tls-verify=false"]);
        if let Some(creds) = creds {
            cmd.args(["--creds", creds]);
        }
        let o = cmd.arg(format!("docker://{}/{name}", self.addr)).output().unwrap();
        assert!(o.status.success(), "skopeo inspect {name}: {}", text(&o));
        format!("sha256:{}", sha256_hex(&o.stdout))
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    let o = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(bytes)?;
            c.wait_with_output()
        });
    String::from_utf8(o.unwrap().stdout)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// An OCI layout `DIR/NAME` (image `t`): busybox, `/etc/nonce` holding `nonce`, a config with
/// Env GREETING=yes and WorkingDir /etc. A fresh nonce makes blobs no earlier pull stored.
fn busybox_layout(dir: &Path, name: &str, nonce: &str) -> PathBuf {
    sh(
        dir,
        &format!(
            r#"
umoci init --layout {name}
umoci new --image {name}:t
umoci unpack --image {name}:t {name}.b >/dev/null
R={name}.b/rootfs
mkdir -p $R/bin $R/etc
cp /bin/busybox $R/bin/busybox
for applet in $($R/bin/busybox --list-full); do mkdir -p "$R/$(dirname "$applet")"; [ -e "$R/$applet" ] || ln -s /bin/busybox "$R/$applet"; done
echo {nonce} > $R/etc/nonce
umoci repack --image {name}:t {name}.b >/dev/null
rm -rf {name}.b
umoci config --image {name}:t --config.env GREETING=yes --config.workingdir /etc
"#
        ),
    );
    dir.join(name)
}

fn nonce(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{tag}-{nanos}-{}", std::process::id())
}

const SHOW: &str = "echo \"$(cat /etc/nonce) $GREETING $(pwd)\"";

/// Pulls from real registries (the reference registry, on loopback): by tag and by digest, a
/// tag moved, auth required and supplied (environment and Docker config), a tampered blob,
/// a multi-platform index, a mirror and an override recorded in the run's provenance.
#[test]
fn images_are_pulled_from_registries_by_tag_and_digest_with_auth_mirrors_and_overrides() {
    let dir = tempfile::tempdir().unwrap();
    let cache = TestCache::new();
    let open = Registry::start(None);
    let locked = Registry::start(Some(("amy", "s3cret")));
    let mirror = Registry::start(None);

    // By tag, then by digest; then the tag moves and the digest still names the first image.
    let first = nonce("first");
    open.push(&busybox_layout(dir.path(), "a", &first), "base:1", None);
    let pinned = format!("registry:{}/base@{}", open.addr, open.digest("base:1", None));
    let o = vm_run(&cache, &format!("registry:{}/base:1", open.addr), SHOW);
    assert_eq!(text(&o).trim(), format!("{first} yes /etc"), "by tag");
    let second = nonce("second");
    open.push(&busybox_layout(dir.path(), "b", &second), "base:1", None);
    let o = vm_run(&cache, &format!("registry:{}/base:1", open.addr), SHOW);
    assert_eq!(text(&o).trim(), format!("{second} yes /etc"), "the moved tag");
    let o = vm_run(&cache, &pinned, SHOW);
    assert_eq!(text(&o).trim(), format!("{first} yes /etc"), "by digest");
    let absent = format!("registry:{}/base@sha256:{}", open.addr, "0".repeat(64));
    let o = vm_run(&cache, &absent, SHOW);
    assert!(
        !o.status.success() && text(&o).contains("pulling the image failed"),
        "{}",
        text(&o)
    );

    // Auth: refused without credentials, with the reason; pulled with them.
    let private = nonce("private");
    locked.push(
        &busybox_layout(dir.path(), "c", &private),
        "private:1",
        Some("amy:s3cret"),
    );
    let image = format!("registry:{}/private:1", locked.addr);
    let o = vm_run(&cache, &image, SHOW);
    assert!(
        !o.status.success() && text(&o).contains("without valid credentials: set FARM_REGISTRY_USERNAME"),
        "{}",
        text(&o)
    );
    let with_env = cache
        .farm()
        .args(["vm", "run", "--image", &image, "--", "sh", "-c", SHOW])
        .env("FARM_REGISTRY_USERNAME", "amy")
        .env("FARM_REGISTRY_PASSWORD", "s3cret")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        text(&with_env).trim(),
        format!("{private} yes /etc"),
        "credentials from the environment"
    );
    let private2 = nonce("private2");
    locked.push(
        &busybox_layout(dir.path(), "d", &private2),
        "private:2",
        Some("amy:s3cret"),
    );
    std::fs::create_dir_all(dir.path().join("docker")).unwrap();
    let auth = std::process::Command::new("sh")
        .arg("-c")
        .arg("printf amy:s3cret | base64")
        .output()
        .unwrap();
    let auth = String::from_utf8(auth.stdout).unwrap();
    std::fs::write(
        dir.path().join("docker/config.json"),
        format!(r#"{{"auths": {{"{}": {{"auth": "{}"}}}}}}"#, locked.addr, auth.trim()),
    )
    .unwrap();
    let with_config = cache
        .farm()
        .args([
            "vm",
            "run",
            "--image",
            &format!("registry:{}/private:2", locked.addr),
            "--",
            "sh",
            "-c",
            SHOW,
        ])
        .env("DOCKER_CONFIG", dir.path().join("docker"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        text(&with_config).trim(),
        format!("{private2} yes /etc"),
        "credentials from a Docker config"
    );

    // A blob changed in the registry's storage is refused, and nothing of it is stored.
    open.push(&busybox_layout(dir.path(), "e", &nonce("tampered")), "tampered:1", None);
    let manifest: serde_json::Value = {
        let o = Command::new("skopeo")
            .args(["inspect", "--raw", "--tls-verify=false"])
            .arg(format!("docker://{}/tampered:1", open.addr))
            .output()
            .unwrap();
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let layer = manifest["layers"][0]["digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:")
        .to_string();
    let data = open
        .storage
        .join("docker/registry/v2/blobs/sha256")
        .join(&layer[..2])
        .join(&layer)
        .join("data");
    let mut bytes = std::fs::read(&data).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&data, bytes).unwrap();
    let o = vm_run(&cache, &format!("registry:{}/tampered:1", open.addr), SHOW);
    assert!(!o.status.success() && text(&o).contains(&layer), "{}", text(&o));
    assert!(
        !cache.join("oci/blobs/sha256").join(&layer).exists(),
        "a tampered blob was stored"
    );

    // A multi-platform index: linux/amd64's image is taken; an index without it is refused.
    let amd = nonce("amd64");
    open.push(&busybox_layout(dir.path(), "f", &amd), "multi:amd", None);
    open.push(&busybox_layout(dir.path(), "g", &nonce("arm64")), "multi:arm", None);
    let entry = |tag: &str, arch: &str| {
        let digest = open.digest(&format!("multi:{tag}"), None);
        let size = Command::new("skopeo")
            .args(["inspect", "--raw", "--tls-verify=false"])
            .arg(format!("docker://{}/multi:{tag}", open.addr))
            .output()
            .unwrap()
            .stdout
            .len();
        serde_json::json!({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest, "size": size, "platform": {"os": "linux", "architecture": arch}})
    };
    let put_index = |tag: &str, entries: Vec<serde_json::Value>| {
        let index = serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": entries});
        let path = dir.path().join(format!("index-{tag}.json"));
        std::fs::write(&path, index.to_string()).unwrap();
        let o = Command::new("curl")
            .args([
                "-sf",
                "-X",
                "PUT",
                "-H",
                "Content-Type: application/vnd.oci.image.index.v1+json",
                "--data-binary",
            ])
            .arg(format!("@{}", path.display()))
            .arg(format!("http://{}/v2/multi/manifests/{tag}", open.addr))
            .output()
            .unwrap();
        assert!(o.status.success(), "PUT index: {}", text(&o));
    };
    put_index("both", vec![entry("arm", "arm64"), entry("amd", "amd64")]);
    put_index("armonly", vec![entry("arm", "arm64")]);
    let o = vm_run(&cache, &format!("registry:{}/multi:both", open.addr), SHOW);
    assert_eq!(
        text(&o).trim(),
        format!("{amd} yes /etc"),
        "the index's linux/amd64 image"
    );
    let o = vm_run(&cache, &format!("registry:{}/multi:armonly", open.addr), SHOW);
    assert!(
        !o.status.success() && text(&o).contains("has no linux/amd64 image (it has linux/arm64)"),
        "{}",
        text(&o)
    );

    // A mirror answers for a registry that cannot be reached; an override maps a reference
    // to another, and the run records both.
    let mirrored = nonce("mirrored");
    mirror.push(&busybox_layout(dir.path(), "h", &mirrored), "team/tool:3", None);
    let settings = dir.path().join("registries.toml");
    std::fs::write(&settings, format!("[mirrors]\n\"unreachable.invalid:5000\" = [\"{}\"]\n[overrides]\n\"example.invalid/app:7\" = \"{}/base:1\"\n", mirror.addr, open.addr)).unwrap();
    let o = cache
        .farm()
        .args([
            "vm",
            "run",
            "--image",
            "registry:unreachable.invalid:5000/team/tool:3",
            "--",
            "sh",
            "-c",
            SHOW,
        ])
        .env("FARM_REGISTRIES", &settings)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(text(&o).trim(), format!("{mirrored} yes /etc"), "through the mirror");
    std::fs::write(
        dir.path().join("trajectories.jsonl"),
        "{\"task_id\": \"double\", \"sample_index\": 0, \"actions\": [{\"kind\": \"exec\", \"command\": \"echo 42 > /workspace/out.txt\"}]}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("suite.toml"),
        format!(
            "[suite]\nname = \"pulled\"\n[template]\nimage = \"registry:example.invalid/app:7\"\n[dataset]\npath = \"{}\"\nformat = \"task_dirs\"\ntasks = [\"double\"]\n\
             [policy]\nkind = \"replay\"\nsource = \"trajectories\"\ntrajectories_file = \"trajectories.jsonl\"\n[scoring]\ntimeout_secs = 300\n[output]\ndir = \"out\"\n",
            repo().join("configs/data/serve-tasks").display()
        ),
    )
    .unwrap();
    let o = cache
        .farm()
        .arg("run")
        .arg(dir.path().join("suite.toml"))
        .env("FARM_REGISTRIES", &settings)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("image example.invalid/app:7 is pulled as"),
        "the override is said: {}",
        text(&o)
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("out/summary.json")).unwrap()).unwrap();
    let pulled = &summary["provenance"]["image_pulled"];
    assert_eq!(pulled["overridden_from"], "example.invalid/app:7", "{summary}");
    assert_eq!(
        pulled["resolved"],
        format!("{}/base@{}", open.addr, open.digest("base:1", None)),
        "{summary}"
    );
    assert_eq!(summary["counts"]["passed"], 1, "{summary}");
}
