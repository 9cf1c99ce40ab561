//! Template images from OCI and Docker archives, OCI layouts and root filesystem folders,
//! built here with Debian's real tools (umoci, skopeo) from a root filesystem the test
//! makes; and hostile archives, crafted with Python's tarfile, that must be refused or kept
//! inside the image.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn sh(dir: &Path, script: &str) {
    let o = Command::new("sh").arg("-ec").arg(script).current_dir(dir).output().unwrap();
    assert!(o.status.success(), "{script}\n{}", text(&o));
}

fn vm_run(image: &str, command: &str) -> Output {
    vm_run_with(image, &[], command)
}

fn vm_run_with(image: &str, flags: &[&str], command: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_farm")).args(["vm", "run", "--image", image]).args(flags).args(["--", "sh", "-c", command]).stdin(Stdio::null()).output().unwrap()
}

/// An OCI layout `L:t` of two layers made by umoci: busybox and some files, then a second
/// layer that deletes a file (a whiteout), replaces a folder (an opaque folder), adds a
/// symbolic and a hard link and a user; its config sets User, WorkingDir and Env. Copied by
/// skopeo into an OCI archive and a Docker archive.
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
    build_images(dir.path());
    let check = "ls /data; ls /data/opq; cat /data/link /data/hard; stat -c '%h links' /data/kept; grep -c '^farm:' /etc/passwd; grep '^app:' /etc/passwd; stat -c '%a %U' /usr/local/bin/farm-sandbox; echo \"config: $FOO $(id -u) $(pwd)\"";
    for image in [
        format!("oci-archive:{}", dir.path().join("img.tar").display()),
        format!("docker-archive:{}", dir.path().join("docker.tar").display()),
        format!("oci:{}", dir.path().join("L").display()),
        format!("rootfs:{}", dir.path().join("B/rootfs").display()),
    ] {
        let o = vm_run(&image, check);
        let out = text(&o);
        assert!(o.status.success(), "{image}: {out}");
        let listing: Vec<&str> = out.lines().take(5).collect();
        assert_eq!(listing, ["hard", "kept", "link", "opq", "new"], "{image}: the whiteout and the opaque folder apply: {out}");
        assert!(out.contains("keep\nkeep\n2 links\n1\napp:x:1234"), "{image}: links and users: {out}");
        assert!(out.contains("4750 root"), "{image}: farm-sandbox: {out}");
        // `farm vm run` applies the image config's Env, User and WorkingDir, as `docker run`
        // does; a rootfs folder has no config.
        let expected = if image.starts_with("rootfs:") { "config:  0 /workspace" } else { "config: bar 1234 /data" };
        assert!(out.contains(expected), "{image}: {out}");
    }
    // The flags win over the image's config.
    let image = format!("oci-archive:{}", dir.path().join("img.tar").display());
    let o = vm_run_with(&image, &["--user", "root", "--workdir", "/", "--env", "FOO=baz"], "echo \"config: $FOO $(id -u) $(pwd)\"");
    assert_eq!(text(&o).trim(), "config: baz 0 /", "{}", text(&o));
    // Converted once: the OCI layout and the OCI archive are the same image (same manifest
    // digest), so one conversion serves both.
    let cache = std::env::var_os("FARM_CACHE_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/farm"));
    let conversions = |digest: &str| {
        std::fs::read_dir(cache.join("images")).unwrap().flatten().filter(|e| std::fs::read_to_string(e.path().join("manifest.json")).is_ok_and(|m| m.contains(digest))).count()
    };
    let index: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("L/index.json")).unwrap()).unwrap();
    assert_eq!(conversions(index["manifests"][0]["digest"].as_str().unwrap()), 1);

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
             [dataset]\npath = \"{}\"\nformat = \"task_dirs\"\ntasks = [\"double\"]\n[policy]\nkind = \"replay\"\nsource = \"trajectories\"\ntrajectories_file = \"trajectories.jsonl\"\n[output]\ndir = \"out\"\n",
            repo().join("configs/data/serve-tasks").display()
        ),
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_farm")).arg("run").arg(&suite).stdin(Stdio::null()).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let summary: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("out/summary.json")).unwrap()).unwrap();
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
    let o = Command::new("python3").arg("-c").arg(script).arg(&layout).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    layout
}

#[test]
fn hostile_archives_are_refused_and_write_nothing_outside_the_image() {
    let dir = tempfile::tempdir().unwrap();
    // A host folder outside /tmp (the guest mounts a fresh /tmp over the image's, which
    // would hide where the files land).
    std::fs::create_dir_all("/opt").unwrap();
    let host = tempfile::Builder::new().prefix("farm-image-test-").tempdir_in("/opt").unwrap();
    let outside = host.path().join("host-target");
    std::fs::create_dir_all(&outside).unwrap();

    let refused = [
        ("    member(t, \"../escape\", data=b\"x\")", false, "`..`"),
        ("    member(t, \"/etc/abs\", data=b\"x\")", false, "absolute"),
        ("    member(t, \"opt/sda\", tarfile.BLKTYPE)", false, "device nodes are refused"),
        ("    member(t, \"ok\", data=b\"x\")", true, "does not match its digest"),
    ];
    for (layer, corrupt, reason) in refused {
        let layout = hostile_layout(dir.path(), layer, corrupt);
        let o = vm_run(&format!("oci:{}", layout.display()), "true");
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
    let o = vm_run(&format!("oci:{}", layout.display()), &format!("cat {0}/pwned {0}/pwned2", outside.display()));
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("insideinside too"), "{}", text(&o));
    assert!(std::fs::read_dir(&outside).unwrap().next().is_none(), "the archive wrote on the host: {:?}", std::fs::read_dir(&outside).unwrap().collect::<Vec<_>>());

    // Extended attributes reach the image (read back with debugfs, without booting).
    let index: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(layout.join("index.json")).unwrap()).unwrap();
    let digest = index["manifests"][0]["digest"].as_str().unwrap().to_string();
    let cache = std::env::var_os("FARM_CACHE_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/farm"));
    let image = std::fs::read_dir(cache.join("images")).unwrap().flatten().map(|e| e.path()).find(|d| std::fs::read_to_string(d.join("manifest.json")).is_ok_and(|m| m.contains(&digest))).expect("the converted image");
    let ea = Command::new("debugfs").args(["-R", "ea_list /tagged"]).arg(image.join("rootfs.ext4")).output().unwrap();
    assert!(String::from_utf8_lossy(&ea.stdout).contains("user.farm") && String::from_utf8_lossy(&ea.stdout).contains("kept"), "{}", text(&ea));
}
