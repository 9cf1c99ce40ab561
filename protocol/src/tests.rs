//! Round trips of every message, and frames refused as they should be.

use super::*;

fn exec_request() -> Request {
    Request::Exec(ExecRequest {
        program: Program::Argv(vec!["echo".into(), "hi".into()]),
        cwd: Some("/tmp".into()),
        env: BTreeMap::from([("A".into(), "1".into())]),
        timeout_ms: Some(1000),
        stdout_cap: 10,
        stderr_cap: 10,
        user: Some("farm".into()),
    })
}

#[test]
fn frame_round_trips_header_and_binary_body() {
    let body: Vec<u8> = (0..=255u8).collect();
    let envelope = Envelope {
        v: PROTOCOL_VERSION,
        id: 7,
        msg: exec_request(),
    };
    let bytes = encode_frame(&envelope, &body);
    let (header, read_body) = read_frame_blocking(&mut &bytes[..], DEFAULT_MAX_FRAME_BYTES).unwrap();
    let decoded: Envelope<Request> = decode_header(&header).unwrap();
    assert_eq!(decoded, envelope);
    assert_eq!(read_body, body);
}

#[test]
fn every_response_round_trips() {
    let responses = [
        Response::Pong(Pong {
            protocol_version: 1,
            agent_version: "x".into(),
            uptime_secs: 1.5,
        }),
        Response::Exec(ExecResult {
            exit_code: Some(3),
            signal: None,
            timed_out: false,
            stdout_len: 1,
            stderr_len: 2,
            stdout_truncated: true,
            stderr_truncated: false,
            duration_us: 9,
        }),
        Response::WriteFile { bytes: 4 },
        Response::ReadFile {
            size: 10,
            truncated: true,
        },
        Response::Quiesce,
        Response::Identity,
        Response::Handover { entries: 3 },
        Response::RemoveTree { entries: 2 },
        Response::Sweep {
            killed: 4,
            complete: true,
        },
        Response::RunTests(TestsResult {
            exec: ExecResult {
                exit_code: None,
                signal: Some(9),
                timed_out: true,
                stdout_len: 0,
                stderr_len: 0,
                stdout_truncated: false,
                stderr_truncated: false,
                duration_us: 5,
            },
            reward: Some("1".into()),
            junit_len: Some(3),
            junit_file_bytes: 3,
            swept: 2,
            sweep_complete: true,
            reset: Some(ResetResult {
                ready: false,
                problem: Some("the harness zygote is gone".into()),
            }),
        }),
        Response::Error(AgentError {
            kind: ErrorKind::Spawn,
            message: "nope".into(),
        }),
    ];
    for msg in responses {
        let envelope = Envelope {
            v: PROTOCOL_VERSION,
            id: 1,
            msg,
        };
        let bytes = encode_frame(&envelope, b"");
        let (header, _) = read_frame_blocking(&mut &bytes[..], DEFAULT_MAX_FRAME_BYTES).unwrap();
        assert_eq!(decode_header::<Response>(&header).unwrap(), envelope);
    }
}

#[test]
fn every_request_round_trips() {
    let requests = [
        Request::Ping,
        exec_request(),
        Request::WriteFile(WriteFileRequest {
            path: "a/b".into(),
            mode: 0o644,
            create_parents: true,
            beneath: Some("/workspace".into()),
            owner: Some("1000".into()),
        }),
        Request::ReadFile(ReadFileRequest {
            path: "a".into(),
            max_bytes: 9,
            beneath: Some("/workspace".into()),
            offset: 0,
        }),
        Request::RemoveFile {
            path: "a".into(),
            beneath: None,
        },
        Request::Handover(HandoverRequest {
            root: "/workspace".into(),
            user: "farm".into(),
        }),
        Request::RemoveTree {
            path: "/opt/farm-tests".into(),
        },
        Request::Sweep(SweepRequest {
            uids: vec![CANDIDATE_UID, CHECKER_UID],
        }),
        Request::RunTests(RunTestsRequest {
            program: Program::Shell("true".into()),
            cwd: "/workspace".into(),
            env: BTreeMap::from([("K".into(), "V".into())]),
            user: "999".into(),
            timeout_ms: 1000,
            stdout_cap: 10,
            stderr_cap: 10,
            tests_dir: "/opt/farm-tests".into(),
            private_tests: true,
            reward_file: "/opt/farm-tests/.reward-x".into(),
            junit_file: "/opt/farm-tests/junit.xml".into(),
            sweep_uids: vec![999, 1000],
            checker_view: true,
            shared: None,
        }),
        Request::RunTests(RunTestsRequest {
            program: Program::Argv(vec!["python3".into()]),
            cwd: "/opt/farm-tests".into(),
            env: BTreeMap::new(),
            user: "root".into(),
            timeout_ms: 1000,
            stdout_cap: 10,
            stderr_cap: 10,
            tests_dir: "/opt/farm-tests".into(),
            private_tests: true,
            reward_file: "/opt/farm-tests/.reward-y".into(),
            junit_file: "/opt/farm-tests/junit.xml".into(),
            sweep_uids: vec![999, 1000],
            checker_view: false,
            shared: Some(SharedCheck {
                workspace: "/workspace".into(),
            }),
        }),
    ];
    for msg in requests {
        let envelope = Envelope {
            v: PROTOCOL_VERSION,
            id: 2,
            msg,
        };
        let bytes = encode_frame(&envelope, b"stdin");
        let (header, body) = read_frame_blocking(&mut &bytes[..], DEFAULT_MAX_FRAME_BYTES).unwrap();
        assert_eq!(decode_header::<Request>(&header).unwrap(), envelope);
        assert_eq!(body, b"stdin");
    }
}

#[test]
fn resync_skips_garbage_before_the_next_frame() {
    let envelope = Envelope {
        v: PROTOCOL_VERSION,
        id: 3,
        msg: Request::Ping,
    };
    let frame = encode_frame(&envelope, b"xyz");
    // The tail of an earlier frame (including a partial magic), then a whole frame.
    let mut bytes = b"FRjunk\x00\x01FR".to_vec();
    bytes.extend_from_slice(&frame[5..]);
    bytes.extend_from_slice(&frame);
    let (header, body) = read_frame_resync(&mut &bytes[..], 1024).unwrap();
    assert_eq!(decode_header::<Request>(&header).unwrap(), envelope);
    assert_eq!(body, b"xyz");
    // The strict reader refuses the same stream.
    assert!(matches!(
        read_frame_blocking(&mut &bytes[..], 1024),
        Err(FrameError::Malformed(_))
    ));
}

#[test]
fn oversized_length_is_refused_before_allocation() {
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&u32::MAX.to_be_bytes());
    bytes.extend_from_slice(&4u32.to_be_bytes());
    let err = read_frame_blocking(&mut &bytes[..], 1024).unwrap_err();
    assert!(
        matches!(err, FrameError::TooLarge { len, max: 1024 } if len == u32::MAX as u64),
        "{err}"
    );
}

#[test]
fn oversized_header_is_refused() {
    let prefix = [
        &MAGIC[..],
        &(MAX_HEADER_BYTES + 8).to_be_bytes()[..],
        &(MAX_HEADER_BYTES + 1).to_be_bytes()[..],
    ]
    .concat();
    let err = check_prefix(prefix.try_into().unwrap(), u32::MAX).unwrap_err();
    assert!(matches!(err, FrameError::TooLarge { .. }), "{err}");
}

#[test]
fn header_longer_than_frame_is_malformed() {
    let prefix = [&MAGIC[..], &10u32.to_be_bytes()[..], &20u32.to_be_bytes()[..]].concat();
    let err = check_prefix(prefix.try_into().unwrap(), 1024).unwrap_err();
    assert!(matches!(err, FrameError::Malformed(_)), "{err}");
    let prefix = [&MAGIC[..], &2u32.to_be_bytes()[..], &0u32.to_be_bytes()[..]].concat();
    assert!(matches!(
        check_prefix(prefix.try_into().unwrap(), 1024),
        Err(FrameError::Malformed(_))
    ));
}

#[test]
fn truncated_frames_are_reported_as_truncated_not_closed() {
    let envelope = Envelope {
        v: PROTOCOL_VERSION,
        id: 1,
        msg: Request::Ping,
    };
    let bytes = encode_frame(&envelope, b"body");
    assert!(matches!(
        read_frame_blocking(&mut &bytes[..0], 1024),
        Err(FrameError::Closed)
    ));
    for cut in 1..bytes.len() {
        let err = read_frame_blocking(&mut &bytes[..cut], 1024).unwrap_err();
        assert!(matches!(err, FrameError::Truncated), "cut at {cut}: {err}");
    }
}

#[test]
fn garbage_header_is_a_clear_error() {
    for header in [
        &b"not json"[..],
        br#"{"v":1,"id":1,"msg":{"op":"launch_missiles"}}"#,
        br#"{"v":1}"#,
        br#"[]"#,
    ] {
        let err = decode_header::<Request>(header).unwrap_err();
        assert!(
            matches!(err, FrameError::BadHeader(_) | FrameError::Malformed(_)),
            "{err}"
        );
    }
}

#[test]
fn other_protocol_version_is_named_in_the_error() {
    let err = decode_header::<Request>(br#"{"v":99,"id":5,"msg":{"op":"ping"}}"#).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("99") && text.contains(&format!("supported version {PROTOCOL_VERSION}")),
        "{text}"
    );
}

#[test]
fn unknown_fields_are_rejected() {
    let err = decode_header::<Request>(br#"{"v":1,"id":5,"msg":{"op":"ping"},"extra":1}"#);
    assert!(err.is_err());
}
