use super::*;

const LEASE: Timers = Timers {
    idle: Duration::from_secs(10),
    lifetime: None,
};

fn opened(book: &mut Book<()>, id: &str, timers: Timers, at: Instant) {
    book.reserve(100).unwrap();
    book.open(id, Kind::Session, (), (), timers, at);
}

#[test]
fn slots_are_counted_from_reservation_to_the_end() {
    let mut book: Book<()> = Book::default();
    book.reserve(2).unwrap();
    book.reserve(2).unwrap();
    let full = book.reserve(2).unwrap_err();
    assert_eq!(full, Refusal::Full { taken: 2, max: 2 }, "two opening take both slots");
    assert!(full.retryable());
    // One never opens (its slot comes back), the other opens (its slot becomes it).
    book.release();
    book.open("s-1", Kind::Session, (), (), LEASE, Instant::now());
    assert_eq!(book.live_len(), 1);
    book.reserve(2).unwrap();
    assert!(book.reserve(2).is_err(), "one live and one opening");
    book.remove("s-1", Ending::Ended("deleted".into()));
    book.reserve(2).unwrap();
}

#[test]
fn a_fork_being_submitted_is_left_alone() {
    let mut book: Book<()> = Book::default();
    let start = Instant::now();
    opened(&mut book, "s-1", LEASE, start);
    assert!(book.usable("s-1", Kind::Session, start).is_ok());
    assert_eq!(
        book.usable("s-2", Kind::Session, start).unwrap_err(),
        Refusal::NoLive("s-2".into())
    );
    assert!(book.begin_submit("s-1"));
    assert!(!book.begin_submit("s-1"), "a second submit is refused");
    assert_eq!(
        book.usable("s-1", Kind::Session, start).unwrap_err(),
        Refusal::BeingSubmitted("s-1".into())
    );
    assert_eq!(
        book.endable("s-1", Kind::Session).unwrap_err(),
        Refusal::BeingSubmitted("s-1".into()),
        "no DELETE mid-scoring"
    );
    assert!(
        book.endable_ids(Kind::Session).is_empty(),
        "a shutdown leaves it to finish"
    );
    let later = start + Duration::from_secs(100);
    assert!(book.expired(Kind::Session, later).is_empty(), "nor does it expire");
    book.remove("s-1", Ending::Ended("submitted".into()));
    assert_eq!(
        book.endable("s-1", Kind::Session).unwrap_err(),
        Refusal::NoLive("s-1".into())
    );
}

#[test]
fn idle_forks_expire_after_their_lease_and_use_or_a_running_request_renews_it() {
    let mut book: Book<()> = Book::default();
    let start = Instant::now();
    for id in ["s-1", "s-2", "s-3"] {
        opened(&mut book, id, LEASE, start);
    }
    book.touch("s-2", start + Duration::from_secs(8));
    book.touch("s-gone", start + Duration::from_secs(8));
    // A request that started early and still runs keeps s-3 from being idle.
    book.begin("s-3", start + Duration::from_secs(1));
    let at = start + Duration::from_secs(12);
    assert_eq!(book.expired(Kind::Session, at), [("s-1".to_string(), Expiry::Idle)]);
    book.finish("s-3", at);
    assert_eq!(
        book.expired(Kind::Session, at + Duration::from_secs(5)),
        [("s-1".to_string(), Expiry::Idle)]
    );
    assert_eq!(book.endable_ids(Kind::Session).len(), 3);
}

#[test]
fn a_lifetime_ends_a_fork_however_busy_or_paused() {
    let mut book: Book<()> = Book::default();
    let start = Instant::now();
    let short = Timers {
        idle: Duration::from_secs(600),
        lifetime: Some(Duration::from_secs(60)),
    };
    opened(&mut book, "sb-1", short, start);
    opened(&mut book, "sb-2", short, start);
    book.begin("sb-1", start);
    book.pause("sb-2");
    assert!(book.expired(Kind::Session, start + Duration::from_secs(59)).is_empty());
    assert_eq!(
        book.expired(Kind::Session, start + Duration::from_secs(61)),
        [
            ("sb-1".to_string(), Expiry::Lifetime),
            ("sb-2".to_string(), Expiry::Lifetime)
        ]
    );
    assert_eq!(book.opened("sb-1"), Some(start));
    assert_eq!(book.timers("sb-1"), Some(short));
}

#[test]
fn a_fork_that_went_is_remembered_with_why() {
    let mut book: Book<()> = Book::default();
    opened(&mut book, "sb-1", LEASE, Instant::now());
    let died = Ending::Died("its guest stopped answering".into());
    assert!(book.remove("sb-1", died.clone()).is_some());
    assert_eq!(book.ending("sb-1"), Some(&died));
    assert!(
        book.remove("sb-1", Ending::Ended("deleted".into())).is_none(),
        "gone once"
    );
    assert_eq!(book.ending("sb-1"), Some(&died), "the first ending stays");
    assert_eq!(book.ending("sb-2"), None);
}

#[test]
fn a_paused_fork_frees_its_slot_never_idles_survives_shutdown_and_is_refused_mid_scoring() {
    let mut book: Book<()> = Book::default();
    let start = Instant::now();
    book.reserve(1).unwrap();
    book.open("s-1", Kind::Session, (), (), LEASE, start);
    assert!(book.reserve(1).is_err());
    book.pause("s-1");
    assert_eq!((book.live_len(), book.paused_len()), (0, 1));
    assert_eq!(
        book.usable("s-1", Kind::Session, start).unwrap_err(),
        Refusal::Paused("s-1".into()),
        "a paused fork takes no exec"
    );
    assert!(book.any("s-1", Kind::Session).is_ok());
    assert!(
        book.expired(Kind::Session, start + Duration::from_secs(100)).is_empty(),
        "no lease while paused"
    );
    assert!(book.endable_ids(Kind::Session).is_empty(), "a shutdown leaves it");
    // Its slot is free: another fork opens, and the resume must wait for a slot.
    book.reserve(1).unwrap();
    book.open("s-2", Kind::Session, (), (), LEASE, start);
    assert!(book.reserve(1).is_err(), "no slot to resume into");
    book.remove("s-2", Ending::Ended("deleted".into()));
    book.reserve(1).unwrap();
    book.resume("s-1", start);
    assert_eq!((book.live_len(), book.paused_len()), (1, 0));
    assert!(book.usable("s-1", Kind::Session, start).is_ok());
    // Being scored: a pause is refused.
    assert!(book.begin_submit("s-1"));
    assert_eq!(
        book.any("s-1", Kind::Session).unwrap_err(),
        Refusal::BeingScored("s-1".into())
    );
    // Taken up after a restart: paused, no slot.
    book.add_paused("s-9", Kind::Session, (), (), LEASE, start);
    assert!(book.is_paused("s-9"));
    assert_eq!(book.paused_ids(Kind::Session), ["s-9"]);
}

#[test]
fn each_front_end_sees_only_its_own_kind_while_slots_are_shared() {
    let mut book: Book<()> = Book::default();
    let start = Instant::now();
    book.reserve(2).unwrap();
    book.open("s-1", Kind::Session, (), (), LEASE, start);
    book.reserve(2).unwrap();
    book.open("sb-1", Kind::Sandbox, (), (), LEASE, start);
    assert!(book.reserve(2).is_err(), "a session and a sandbox take both slots");
    assert_eq!(
        book.usable("sb-1", Kind::Session, start).unwrap_err(),
        Refusal::NoLive("sb-1".into()),
        "a sandbox's id is no session's"
    );
    assert!(book.any("s-1", Kind::Sandbox).is_err());
    assert!(book.endable("s-1", Kind::Sandbox).is_err());
    assert_eq!(book.all(Kind::Sandbox).len(), 1);
    assert_eq!(book.count(Kind::Session), (1, 0));
    book.pause("sb-1");
    assert_eq!(book.count(Kind::Sandbox), (0, 1));
    assert_eq!(book.paused_ids(Kind::Session), Vec::<String>::new());
    assert_eq!(book.endable_ids(Kind::Sandbox), Vec::<String>::new());
    assert_eq!(book.expired(Kind::Sandbox, start + Duration::from_secs(60)), []);
    assert_eq!(
        book.expired(Kind::Session, start + Duration::from_secs(60)),
        [("s-1".to_string(), Expiry::Idle)]
    );
}

#[test]
fn new_timers_move_both_deadlines_and_the_lifetime_still_counts_from_the_opening() {
    let mut book: Book<()> = Book::default();
    let start = Instant::now();
    let short = Timers {
        idle: Duration::from_secs(10),
        lifetime: Some(Duration::from_secs(60)),
    };
    opened(&mut book, "sb-1", short, start);
    assert_eq!(
        book.expired(Kind::Session, start + Duration::from_secs(11)),
        [("sb-1".to_string(), Expiry::Idle)]
    );
    let longer = Timers {
        idle: Duration::from_secs(100),
        lifetime: Some(Duration::from_secs(120)),
    };
    assert!(book.set_timers("sb-1", longer));
    assert!(book.expired(Kind::Session, start + Duration::from_secs(99)).is_empty());
    assert_eq!(
        book.expired(Kind::Session, start + Duration::from_secs(121)),
        [("sb-1".to_string(), Expiry::Lifetime)]
    );
    assert!(!book.set_timers("sb-2", longer), "not open");
}

#[test]
fn a_card_is_read_without_the_fork_and_goes_with_it() {
    let mut book: Book<(), &str> = Book::default();
    let start = Instant::now();
    book.reserve(4).unwrap();
    book.open("s-1", Kind::Session, (), "tenant a", LEASE, start);
    book.add_paused("sb-2", Kind::Sandbox, (), "tenant b", LEASE, start);
    assert_eq!(book.card("s-1", Kind::Session), Some(&"tenant a"));
    // Another kind's id has no card for this kind, as it has no fork.
    assert_eq!(book.card("s-1", Kind::Sandbox), None);
    let mut cards: Vec<_> = book
        .cards()
        .map(|(id, kind, paused, c)| (id.to_string(), kind, paused, *c))
        .collect();
    cards.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        cards,
        [
            ("s-1".to_string(), Kind::Session, false, "tenant a"),
            ("sb-2".to_string(), Kind::Sandbox, true, "tenant b")
        ]
    );
    book.remove("s-1", Ending::Ended("deleted".into()));
    assert_eq!(book.card("s-1", Kind::Session), None);
}

#[test]
fn a_fork_ends_at_the_earlier_of_its_idle_end_and_its_lifetime_and_never_idles_in_use() {
    let mut book: Book<()> = Book::default();
    let start = Instant::now();
    let timers = Timers {
        idle: Duration::from_secs(30),
        lifetime: Some(Duration::from_secs(100)),
    };
    book.reserve(4).unwrap();
    book.open("sb-1", Kind::Sandbox, (), (), timers, start);
    let at = |book: &Book<()>, s| book.ends(Kind::Sandbox, start + Duration::from_secs(s));
    assert_eq!(
        at(&book, 10),
        [("sb-1".to_string(), Expiry::Idle, Duration::from_secs(20))]
    );
    assert_eq!(at(&book, 80), [("sb-1".to_string(), Expiry::Idle, Duration::ZERO)]);
    book.begin("sb-1", start + Duration::from_secs(80));
    assert_eq!(
        at(&book, 90),
        [("sb-1".to_string(), Expiry::Lifetime, Duration::from_secs(10))],
        "in use: only its lifetime ends it"
    );
    book.finish("sb-1", start + Duration::from_secs(90));
    assert_eq!(
        at(&book, 91),
        [("sb-1".to_string(), Expiry::Lifetime, Duration::from_secs(9))]
    );
    book.pause("sb-1");
    assert!(at(&book, 91).is_empty(), "a paused fork has no timer to warn of");
    assert!(book.ends(Kind::Session, start).is_empty());
}
