use super::*;

fn store() -> (tempfile::TempDir, Workspaces, TenantId) {
    let dir = tempfile::tempdir().unwrap();
    let tenancy = crate::tenancy::Tenancy::open(&dir.path().join("t.db"), Some("tok"), 8).unwrap();
    let other = tenancy.db.add_tenant("other", 1).unwrap().id;
    let workspaces = Workspaces::open(Arc::new(tenancy), &dir.path().join("ws")).unwrap();
    (dir, workspaces, other)
}

fn tar_of(name: &str, data: &str) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(data.len() as u64);
    header.set_mode(0o644);
    header.set_path(name).unwrap();
    header.set_cksum();
    builder.append(&header, data.as_bytes()).unwrap();
    builder.into_inner().unwrap()
}

/// The files of an archive: (path, content).
fn files(archive: &[u8]) -> Vec<(String, String)> {
    use std::io::Read;
    let mut tar = tar::Archive::new(archive);
    let mut out = Vec::new();
    for entry in tar.entries().unwrap() {
        let mut entry = entry.unwrap();
        let mut data = String::new();
        entry.read_to_string(&mut data).unwrap();
        out.push((entry.path().unwrap().display().to_string(), data));
    }
    out
}

fn mount(name: &str, read_only: bool) -> MountRequest {
    MountRequest {
        name: name.into(),
        path: "/w".into(),
        read_only,
    }
}

#[test]
fn a_workspace_is_its_tenants_and_its_writes_come_from_its_holder_alone() {
    let (_dir, ws, other) = store();
    let me = tenants::DEFAULT;
    let request = |name: &str| WorkspaceRequest {
        name: name.into(),
        size_mib: 1,
        keep_days: None,
    };
    ws.create(me, request("data")).unwrap();
    assert_eq!(ws.create(me, request("data")).unwrap_err().kind, ErrorKind::Conflict);
    assert_eq!(
        ws.get(other, "data").unwrap_err().kind,
        ErrorKind::NotFound,
        "another tenant's"
    );
    assert_eq!(
        ws.claim(other, "sb-x", &[mount("data", false)]).unwrap_err().kind,
        ErrorKind::NotFound
    );

    let a = ws.claim(me, "sb-a", &[mount("data", false)]).unwrap().remove(0).0;
    assert_eq!((a.mode, a.generation), (Mode::Writable, 1));
    let e = ws.claim(me, "sb-b", &[mount("data", false)]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Conflict, "{}", e.message);
    let (reader, bytes) = ws.claim(me, "sb-r", &[mount("data", true)]).unwrap().remove(0);
    assert_eq!((reader.mode, bytes.len()), (Mode::ReadOnly, 0));
    assert_eq!(
        ws.commit("sb-r", &reader, tar_of("x", "r")).unwrap_err().kind,
        ErrorKind::Conflict
    );
    assert_eq!(
        ws.commit("sb-a", &a.for_branch(), tar_of("x", "b")).unwrap_err().kind,
        ErrorKind::Conflict
    );
    assert!(ws.commit("sb-a", &a, tar_of("x", "one")).unwrap().bytes > 0);

    // A lost holder, fenced; the next holder's generation; the old one's sync refused.
    ws.fence(me, "data").unwrap();
    let (b, bytes) = ws.claim(me, "sb-b", &[mount("data", false)]).unwrap().remove(0);
    assert_eq!(
        (b.generation, files(&bytes)),
        (2, vec![("x".to_string(), "one".to_string())]),
        "it starts from the last accepted sync"
    );
    assert_eq!(
        ws.commit("sb-a", &a, tar_of("x", "late")).unwrap_err().kind,
        ErrorKind::Conflict
    );
    ws.commit("sb-b", &b, tar_of("x", "two")).unwrap();
    let (_, bytes) = ws.claim(me, "sb-r2", &[mount("data", true)]).unwrap().remove(0);
    assert_eq!(
        files(&bytes),
        vec![("x".to_string(), "two".to_string())],
        "the fenced write never landed"
    );
    assert_eq!(ws.delete(me, "data").unwrap_err().kind, ErrorKind::Conflict, "held");
    ws.release("sb-b", [&b]);
    ws.delete(me, "data").unwrap();
}

#[test]
fn a_claim_of_several_is_all_or_none() {
    let (_dir, ws, _) = store();
    let me = tenants::DEFAULT;
    for name in ["one", "two"] {
        ws.create(
            me,
            WorkspaceRequest {
                name: name.into(),
                size_mib: 1,
                keep_days: None,
            },
        )
        .unwrap();
    }
    ws.claim(me, "sb-a", &[mount("two", false)]).unwrap();
    let both = [
        mount("one", false),
        MountRequest {
            path: "/v".into(),
            ..mount("two", false)
        },
    ];
    assert_eq!(ws.claim(me, "sb-b", &both).unwrap_err().kind, ErrorKind::Conflict);
    assert!(
        ws.get(me, "one").unwrap().holder.is_none(),
        "the first hold was given back"
    );
}

#[test]
fn mounts_are_checked() {
    let bad = |mounts: Vec<MountRequest>| check_mounts(&mounts).unwrap_err().field.unwrap();
    assert_eq!(
        bad(vec![MountRequest {
            path: "w".into(),
            ..mount("a", false)
        }]),
        "workspaces[0].path"
    );
    assert_eq!(
        bad(vec![MountRequest {
            path: "/".into(),
            ..mount("a", false)
        }]),
        "workspaces[0].path"
    );
    assert_eq!(
        bad(vec![MountRequest {
            path: "/a/../etc".into(),
            ..mount("a", false)
        }]),
        "workspaces[0].path"
    );
    assert_eq!(bad(vec![mount("../x", false)]), "workspaces[0].name");
    assert_eq!(bad(vec![mount("a", false), mount("a", true)]), "workspaces[1].path");
    assert_eq!(
        bad((0..9)
            .map(|i| MountRequest {
                path: format!("/{i}"),
                ..mount(&format!("w{i}"), true)
            })
            .collect()),
        "workspaces"
    );
}
