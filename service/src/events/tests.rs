use super::webhooks::{check_url, sign};
use super::*;

fn events() -> (tempfile::TempDir, Arc<Events>, TenantId) {
    let dir = tempfile::tempdir().unwrap();
    let tenancy = crate::tenancy::Tenancy::open(&dir.path().join("t.db"), Some("tok"), 8).unwrap();
    let other = tenancy.db.add_tenant("other", 1).unwrap().id;
    let events = Arc::new(Events::new(Arc::new(tenancy), &EventsSection::default()));
    (dir, events, other)
}

fn created() -> Happened {
    Happened::sandbox(EventType::Created, ForkState::Running)
}

#[test]
fn a_tenant_lists_its_own_events_in_order_and_no_one_elses() {
    let (_dir, events, other) = events();
    let me = tenants::DEFAULT;
    events.emit(me, "sb-1", created());
    events.emit(other, "sb-2", created());
    let died = Happened::sandbox(EventType::Died, ForkState::Ended)
        .cause(Cause::QemuExited)
        .reason("exit status: 1");
    events.emit(me, "sb-1", died);
    let mine = events.list(me, 0, None, 100).unwrap();
    assert_eq!(mine.events.iter().map(|e| e.id).collect::<Vec<_>>(), [1, 3]);
    assert_eq!(mine.next_after, 3);
    let last = &mine.events[1];
    assert_eq!(
        (last.event, last.state, last.cause),
        (EventType::Died, ForkState::Ended, Some(Cause::QemuExited))
    );
    assert_eq!((last.tenant.as_str(), last.sandbox.as_str()), ("default", "sb-1"));
    assert!(
        events.list(me, 0, Some("sb-2"), 100).unwrap().events.is_empty(),
        "another's fork, by name"
    );
    assert_eq!(events.list(other, 0, None, 100).unwrap().events.len(), 1);
    assert_eq!(
        events.list(me, 3, None, 100).unwrap().next_after,
        3,
        "an empty page keeps the cursor"
    );
}

#[tokio::test]
async fn a_follower_gets_what_was_stored_then_what_happens_and_only_its_own() {
    let (_dir, events, other) = events();
    let me = tenants::DEFAULT;
    events.emit(me, "sb-1", created());
    events.emit(me, "sb-2", created());
    let mut all = events.follow(me, 0, None);
    let mut one = events.follow(me, 1, Some("sb-1".into()));
    assert_eq!(all.recv().await.unwrap().id, 1);
    assert_eq!(all.recv().await.unwrap().id, 2);
    events.emit(other, "sb-9", created());
    events.emit(me, "sb-1", Happened::sandbox(EventType::Paused, ForkState::Paused));
    let next = all.recv().await.unwrap();
    assert_eq!(
        (next.id, next.event),
        (4, EventType::Paused),
        "another tenant's event 3 is skipped"
    );
    let next = one.recv().await.unwrap();
    assert_eq!((next.id, next.sandbox.as_str()), (4, "sb-1"), "after 1, of sb-1 alone");
}

#[tokio::test]
async fn a_slow_follower_misses_nothing() {
    let (_dir, events, _) = events();
    let me = tenants::DEFAULT;
    let mut rx = events.follow(me, 0, None);
    // Far more than the live channel holds, while the follower reads nothing.
    for i in 0..3000 {
        events.emit(me, &format!("sb-{i}"), created());
    }
    for want in 1..=3000u64 {
        assert_eq!(rx.recv().await.unwrap().id, want);
    }
}

#[test]
fn a_webhook_may_only_call_an_allowed_host() {
    let allowed = vec!["127.0.0.1:8099".to_string(), "hooks.example.com".to_string()];
    assert!(check_url("http://127.0.0.1:8099/hook", &allowed).is_ok());
    assert!(check_url("https://HOOKS.example.com/x", &allowed).is_ok());
    for bad in [
        "http://127.0.0.1:8098/hook",
        "http://localhost:8099/",
        "http://169.254.169.254/latest",
        "ftp://hooks.example.com/",
        "http://user:pw@hooks.example.com/",
        "hooks.example.com",
    ] {
        let e = check_url(bad, &allowed).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("url"), "{bad}: {}", e.message);
    }
    let e = check_url("http://127.0.0.1:8099/", &[]).unwrap_err();
    assert!(e.message.contains("webhook_hosts"), "{}", e.message);
}

#[test]
fn a_signature_covers_the_time_and_the_body() {
    let s = sign(b"k", 10, "{}");
    assert_eq!(s.len(), 64);
    assert_ne!(s, sign(b"k", 11, "{}"));
    assert_ne!(s, sign(b"k", 10, "{ }"));
    assert_ne!(s, sign(b"j", 10, "{}"));
}
