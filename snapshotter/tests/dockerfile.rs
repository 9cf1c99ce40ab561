//! Templates built from Dockerfiles against real guests: every instruction farm supports,
//! multi-stage builds, build arguments, `.dockerignore`, errors that name the line, and the
//! step cache (changing one step re-runs it and the steps after it only).

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use snapshotter::{build_template, ForkIdentity, Forker, SnapshotStore, TemplateConfig};
use vmm::{AccelSetting, ExecOptions, VmSettings};

fn forker() -> Forker {
    let mut vm = VmSettings::detect(AccelSetting::Auto).expect("QEMU must be installed (scripts/setup.sh)");
    vm.boot_timeout = Duration::from_secs(300);
    Forker::new(vm).unwrap()
}

/// A context with an app folder (one file ignored), a script, a tar.gz and a Dockerfile.
fn context(dir: &Path, dockerfile: &str) {
    std::fs::create_dir_all(dir.join("app/sub")).unwrap();
    std::fs::write(dir.join("app/main.txt"), "main\n").unwrap();
    std::fs::write(dir.join("app/sub/deep.txt"), "deep\n").unwrap();
    std::fs::write(dir.join("app/debug.log"), "ignored\n").unwrap();
    std::fs::write(dir.join(".dockerignore"), "**/*.log\n").unwrap();
    std::fs::write(dir.join("run.sh"), "#!/bin/sh\necho running\n").unwrap();
    std::fs::create_dir_all(dir.join("bundle")).unwrap();
    std::fs::write(dir.join("bundle/inner.txt"), "from the archive\n").unwrap();
    let o = std::process::Command::new("tar")
        .args(["-czf", "bundle.tar.gz", "-C", "bundle", "inner.txt"])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(o.status.success());
    std::fs::write(dir.join("Dockerfile"), dockerfile).unwrap();
}

const DOCKERFILE: &str = r#"# syntax=docker/dockerfile:1
ARG BASE=farm:minimal
FROM ${BASE} AS tools
RUN mkdir -p /opt/tools && echo tool-v1 > /opt/tools/version

FROM ${BASE}
ARG GREETING=hello
ENV APP_HOME=/srv/app \
    GREETING="${GREETING} there"
WORKDIR $APP_HOME
COPY app/ ./
COPY --chmod=755 run.sh /usr/local/bin/run-app
COPY --from=tools /opt/tools/version /etc/tools-version
ADD bundle.tar.gz /opt/bundle/
COPY <<EOF /etc/motd
welcome $GREETING
EOF
RUN cat <<'X' > generated.txt && echo "$GREETING in $(pwd)" >> generated.txt
literal $HOME
X
USER 1000
EXPOSE 8080
CMD ["run-app"]
"#;

#[test]
fn a_dockerfile_builds_a_template_and_unchanged_steps_come_from_the_store() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store_dir = tempfile::tempdir().unwrap();
        let store = SnapshotStore::new(store_dir.path().to_path_buf());
        let dir = tempfile::tempdir().unwrap();
        context(dir.path(), DOCKERFILE);
        let mut template = TemplateConfig::of_image("");
        template.dockerfile = Some("Dockerfile".into());
        template.build_args.insert("GREETING".into(), "hi".into());
        template.setup = vec!["pwd > /tmp/setup-cwd".into()];
        let lines = Mutex::new(Vec::<String>::new());
        let log = |line: &str| lines.lock().unwrap().push(line.to_string());
        let built = build_template(&store, &forker(), &template, dir.path(), "df", &log).await.unwrap();
        let config = built.image_config.clone().unwrap();
        assert_eq!((config.working_dir.as_str(), config.user.as_str()), ("/srv/app", "1000"));
        assert!(config.env.contains(&"GREETING=hi there".to_string()), "{:?}", config.env);

        let fork = forker().fork(&built.snapshot, ForkIdentity::new(0)).await.unwrap();
        let check = "cd /srv/app && ls -R . | tr '\\n' ' '; echo; cat /etc/tools-version /opt/bundle/inner.txt /etc/motd generated.txt /tmp/setup-cwd; stat -c '%a' /usr/local/bin/run-app; run-app";
        let out = fork.agent().exec(ExecOptions::shell(check)).await.unwrap();
        let text = out.stdout_text();
        assert_eq!(out.result.exit_code, Some(0), "{text}{}", String::from_utf8_lossy(&out.stderr));
        let listing = text.lines().next().unwrap_or_default().split_whitespace().collect::<Vec<_>>().join(" ");
        assert_eq!(listing, ".: generated.txt main.txt sub ./sub: deep.txt", "the app folder's contents, without the ignored log: {text}");
        assert!(
            text.contains("tool-v1\nfrom the archive\nwelcome hi there\nliteral $HOME\nhi there in /srv/app\n/srv/app\n755\nrunning\n"),
            "COPY --from, ADD of an archive, here-documents (expanded and literal), WORKDIR, the template's setup in the WORKDIR, --chmod: {text}"
        );
        drop(fork);

        // Again, unchanged: every step from the store.
        lines.lock().unwrap().clear();
        let again = build_template(&store, &forker(), &template, dir.path(), "df", &log).await.unwrap();
        assert_eq!(again.snapshot.id(), built.snapshot.id());
        assert!(again.reused);

        // The RUN after the here-document changes: that step and the ones after it run again,
        // the ones before come from the store.
        std::fs::write(dir.path().join("Dockerfile"), DOCKERFILE.replace("literal $HOME", "literal $HOME, changed")).unwrap();
        lines.lock().unwrap().clear();
        let changed = build_template(&store, &forker(), &template, dir.path(), "df", &log).await.unwrap();
        assert_ne!(changed.snapshot.id(), built.snapshot.id());
        let lines = lines.lock().unwrap().clone();
        let cached = lines.iter().filter(|l| l.contains("cached")).count();
        let ran: Vec<&String> = lines.iter().filter(|l| l.starts_with("  done in")).collect();
        // Steps before the change: RUN (tools), COPY app, COPY run.sh, COPY --from, ADD, COPY motd.
        assert_eq!((cached, ran.len()), (6, 1), "{lines:#?}");
    });
}

#[test]
fn bad_dockerfiles_are_refused_with_the_file_and_line() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store_dir = tempfile::tempdir().unwrap();
        let store = SnapshotStore::new(store_dir.path().to_path_buf());
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            (
                "FROM farm:minimal\nRUN true\nFETCH x\n",
                "line 3: unknown instruction \"FETCH\"",
            ),
            (
                "FROM farm:minimal\nONBUILD RUN true\n",
                "line 2: ONBUILD RUN true: ONBUILD is not supported",
            ),
            ("FROM farm:minimal\nRUN --mount=type=cache,target=/x true\n", "line 2"),
            (
                "FROM farm:minimal\nCOPY missing.txt /x\n",
                "line 2: COPY missing.txt /x: \"missing.txt\" is not in the build context",
            ),
            (
                "FROM farm:minimal\nRUN echo to stderr >&2; exit 3\n",
                "line 2: RUN echo to stderr >&2; exit 3: the command exited with exit code 3: to stderr",
            ),
            ("FROM scratch\n", "line 1: FROM scratch"),
        ];
        for (dockerfile, expected) in cases {
            context(dir.path(), dockerfile);
            let mut template = TemplateConfig::of_image("");
            template.dockerfile = Some("Dockerfile".into());
            let err = match build_template(&store, &forker(), &template, dir.path(), "bad", &|_| {}).await {
                Ok(_) => panic!("{dockerfile:?} built"),
                Err(e) => {
                    let mut text = e.to_string();
                    let mut source = std::error::Error::source(&e);
                    while let Some(s) = source {
                        text.push_str(&format!(": {s}"));
                        source = s.source();
                    }
                    text
                }
            };
            assert!(
                err.contains("Dockerfile, ") && err.contains(expected),
                "{dockerfile:?}: {err}"
            );
        }
    });
}
