//! The session scenarios of the conformance suite: one renewable session that many roles
//! are held under (`docs/semantics.md`, "Sessions"). Every backend runs them through
//! [`session_scenarios!`](crate::session_scenarios).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tenure::{ChangeMark, ChangesRead, Error, LeaseCopy, LeaseStore, SessionGrant, SessionId};

use crate::conformance::{assert_invalid, spawn_term_waiter};
use crate::fixture::begin;
use crate::LeaseBackend;
use crate::{assert_refused, in_time, MustAnswer};

async fn open(store: &dyn LeaseStore, owner: &str, ttl: Duration) -> SessionGrant {
    let grant = store.open_session(owner, ttl).await.unwrap();
    assert_eq!(grant.owner, owner);
    assert!(
        grant.remaining() > Duration::ZERO && grant.remaining() <= ttl,
        "a new session has at most its TTL left: {grant:?}"
    );
    grant
}

/// Sessions get distinct ids; keeping one alive moves its expiry forward; once its TTL
/// passes it has ended for good: keep-alive answers `None` and acquiring under it is
/// `SessionEnded`.
pub async fn scenario_session_lives_while_kept_alive(backend: &dyn LeaseBackend) {
    let (fx, store, ttl) = begin(backend).await;
    let a = open(store.as_ref(), "node-a", ttl).await;
    let b = open(store.as_ref(), "node-b", ttl).await;
    assert_ne!(a.id, b.id, "session ids are never handed out twice");

    fx.pass_time(ttl.mul_f64(0.6)).await;
    let kept = store
        .keep_alive(a.id, ttl)
        .await
        .expect("a live session is kept alive");
    assert!(kept.expires_at > a.expires_at, "{kept:?} after {a:?}");
    assert_eq!(kept.id, a.id);

    fx.pass_time(ttl.mul_f64(0.6)).await;
    // b was not kept alive: it has ended; a still lives.
    assert_eq!(store.keep_alive(b.id, ttl).await, None);
    assert!(store.keep_alive(a.id, ttl).await.is_some());
    assert!(matches!(
        store.acquire_in_session("alpha", b.id).await,
        Err(Error::SessionEnded(id)) if id == b.id
    ));
    // Never revived.
    assert_eq!(store.keep_alive(b.id, ttl).await, None);
}

/// Roles held under a session live as long as the session, however many renewals of
/// the session pass; re-acquiring under the same session keeps the token; when the
/// session ends, every role is free and taking it starts a new term with a larger token.
pub async fn scenario_session_holds_roles(backend: &dyn LeaseBackend) {
    let (fx, store, ttl) = begin(backend).await;
    let session = open(store.as_ref(), "node-a", ttl).await;
    let roles = ["g/0", "g/1", "g/2"];
    let mut tokens = Vec::new();
    for role in roles {
        let held = store.acquire_in_session(role, session.id).await.unwrap();
        assert!(held.acquired, "{held:?}");
        assert_eq!(held.holder, "node-a");
        assert_eq!(
            held.expires_at, session.expires_at,
            "a role expires with its session"
        );
        tokens.push(held.fencing_token);
    }
    let again = store.acquire_in_session("g/1", session.id).await.unwrap();
    assert!(again.acquired);
    assert_eq!(again.fencing_token, tokens[1], "same session, same term");

    for _ in 0..2 {
        fx.pass_time(ttl.mul_f64(0.6)).await;
        store.keep_alive(session.id, ttl).await.expect("kept alive");
    }
    // 1.2 TTLs after the roles were taken: alive through the session alone.
    for (role, token) in roles.iter().zip(&tokens) {
        let other = store.try_acquire(role, "node-b", ttl).await;
        assert_refused(
            &other,
            "node-a",
            &format!("{role} is held under a live session"),
        );
        assert_eq!(other.fencing_token, *token);
        let info = store.get(role).await.unwrap().expect("lease");
        assert_eq!(info.live_holder(), Some("node-a"));
    }

    fx.pass_time(ttl).await;
    let taken = store.try_acquire("g/0", "node-b", ttl).await;
    assert!(
        taken.acquired,
        "the session ended, so its roles are free: {taken:?}"
    );
    assert!(taken.fencing_token > tokens[0]);
    let next = open(store.as_ref(), "node-a", ttl).await;
    let back = store.acquire_in_session("g/2", next.id).await.unwrap();
    assert!(back.acquired);
    assert!(
        back.fencing_token > tokens[2],
        "a lapsed term is never resumed"
    );
}

/// Closing a session releases its roles at once (a waiter wakes), keeps their tokens,
/// and ends the session; releasing one role ends only that term.
pub async fn scenario_session_close_releases_roles(backend: &dyn LeaseBackend) {
    let (fx, store, ttl) = begin(backend).await;
    let session = open(store.as_ref(), "node-a", ttl).await;
    let one = store.acquire_in_session("g/0", session.id).await.unwrap();
    let two = store.acquire_in_session("g/1", session.id).await.unwrap();
    assert!(store.release_term("g/0", "node-a", one.fencing_token).await);
    assert_eq!(
        store.get("g/0").await.unwrap().unwrap().live_holder(),
        None,
        "released"
    );
    assert_eq!(
        store.get("g/1").await.unwrap().unwrap().live_holder(),
        Some("node-a"),
        "the rest of the session is untouched"
    );

    let waiter = spawn_term_waiter(&store, "g/1", two.fencing_token);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let other = fx.reopen().await;
    assert!(
        other.close_session(session.id).await.unwrap(),
        "it was live"
    );
    let waited = in_time(
        Duration::from_secs(10),
        waiter,
        "a waiter must wake when the session closes",
    )
    .await;
    assert!(waited < Duration::from_secs(5), "woke after {waited:?}");
    let info = store.get("g/1").await.unwrap().unwrap();
    assert_eq!(info.live_holder(), None);
    assert_eq!(info.fencing_token, two.fencing_token, "the token survives");
    assert!(
        !store.close_session(session.id).await.unwrap(),
        "already closed"
    );
    assert_eq!(store.keep_alive(session.id, ttl).await, None);
    let next = store.try_acquire("g/1", "node-b", ttl).await;
    assert!(next.acquired && next.fencing_token > two.fencing_token);
}

/// A role held by someone else (a plain lease, or another session) is refused with the
/// holder's term; the holder renewing a session's role on its own keeps the token and
/// makes it a plain lease; a session opened through another instance of the store is
/// the same session; a term taken in a session advertises no value.
pub async fn scenario_session_meets_other_holders(backend: &dyn LeaseBackend) {
    let (fx, store, ttl) = begin(backend).await;
    let plain = store.try_acquire("g/0", "node-b", ttl).await;
    let a = open(store.as_ref(), "node-a", ttl).await;
    let c = open(store.as_ref(), "node-c", ttl).await;
    let refused = store.acquire_in_session("g/0", a.id).await.unwrap();
    assert!(!refused.acquired);
    assert_eq!(refused.holder, "node-b");
    assert_eq!(refused.fencing_token, plain.fencing_token);

    let held = store.acquire_in_session("g/1", a.id).await.unwrap();
    let other_session = store.acquire_in_session("g/1", c.id).await.unwrap();
    assert!(!other_session.acquired, "{other_session:?}");
    assert_eq!(other_session.holder, "node-a");

    // The same session through another instance (another process on durable stores).
    let reopened = fx.reopen().await;
    let same = reopened.acquire_in_session("g/1", a.id).await.unwrap();
    assert!(same.acquired);
    assert_eq!(same.fencing_token, held.fencing_token);
    assert!(reopened.keep_alive(a.id, ttl).await.is_some());

    let own = store.try_acquire("g/1", "node-a", ttl).await;
    assert!(own.acquired);
    assert_eq!(
        own.fencing_token, held.fencing_token,
        "a renewal keeps the token"
    );
    assert!(store.close_session(a.id).await.unwrap());
    let after = store.try_acquire("g/1", "node-c", ttl).await;
    assert!(
        !after.acquired,
        "g/1 became node-a's own lease, which outlives its old session: {after:?}"
    );

    // A term taken in a session advertises nothing, also over a lapsed term that did.
    let valued = store
        .try_acquire_with_value("g/2", "node-b", ttl, Some("http://b:1"))
        .await;
    assert!(valued.acquired);
    fx.pass_time(ttl + ttl / 4).await;
    let d = open(store.as_ref(), "node-d", ttl).await;
    let taken = store.acquire_in_session("g/2", d.id).await.unwrap();
    assert!(taken.acquired && taken.fencing_token > valued.fencing_token);
    let info = store.get("g/2").await.unwrap().expect("g/2");
    assert_eq!(info.value, None, "{info:?}");
}

/// Many sessions race for the same roles: each role has exactly one winner, and no
/// token is handed out twice.
pub async fn scenario_session_contention(backend: &dyn LeaseBackend) {
    let (fx, store, ttl) = begin(backend).await;
    let contenders = fx.contenders().min(16);
    let mut sessions = Vec::new();
    for i in 0..contenders {
        sessions.push(open(store.as_ref(), &format!("node-{i}"), ttl).await.id);
    }
    let tasks: Vec<_> = sessions
        .iter()
        .map(|&session| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let mut won = Vec::new();
                for role in ["g/0", "g/1", "g/2", "g/3"] {
                    let result = store.acquire_in_session(role, session).await.unwrap();
                    if result.acquired {
                        won.push((role, result.fencing_token));
                    }
                }
                won
            })
        })
        .collect();
    let mut winners = BTreeSet::new();
    let mut per_role = std::collections::BTreeMap::new();
    for task in tasks {
        for (role, token) in task.await.unwrap() {
            *per_role.entry(role).or_insert(0) += 1;
            assert!(
                winners.insert((role, token)),
                "token {token} twice for {role}"
            );
        }
    }
    assert_eq!(per_role.len(), 4, "every role has a winner: {per_role:?}");
    assert!(
        per_role.values().all(|&n| n == 1),
        "one winner each: {per_role:?}"
    );
}

/// Bad input to the session calls is `InvalidArgument` naming the field.
pub async fn scenario_session_bad_input(backend: &dyn LeaseBackend) {
    let (_fx, store, ttl) = begin(backend).await;
    assert_invalid(store.open_session("", ttl).await, "owner");
    assert_invalid(store.open_session("a\0b", ttl).await, "owner");
    assert_invalid(store.open_session(&"x".repeat(256), ttl).await, "owner");
    assert_invalid(store.open_session("node-a", Duration::ZERO).await, "ttl");
    assert_invalid(
        store
            .open_session("node-a", Duration::from_secs(u64::MAX))
            .await,
        "ttl",
    );
    let session = open(store.as_ref(), "node-a", ttl).await;
    assert_invalid(store.acquire_in_session("", session.id).await, "role");
    assert_invalid(store.acquire_in_session("a\0b", session.id).await, "role");
    assert_invalid(
        store.keep_alive_session(session.id, Duration::ZERO).await,
        "ttl",
    );
}

/// A batch answers each role as `acquire_in_session` would, in the order asked: free
/// roles are taken (token + 1 on a role that had a term), a role already held under this
/// session keeps its term, a role another live session or lease holds is refused naming
/// its holder, and a role named twice is answered twice alike.
pub async fn scenario_session_acquire_many(backend: &dyn LeaseBackend) {
    let (_fx, store, ttl) = begin(backend).await;
    let a = open(store.as_ref(), "node-a", ttl).await;
    let b = open(store.as_ref(), "node-b", ttl).await;
    let mine = store.acquire_in_session("g/1", a.id).await.unwrap();
    let theirs = store.acquire_in_session("g/2", b.id).await.unwrap();
    let plain = store.try_acquire("g/3", "node-c", ttl * 4).await;
    let ended = store.acquire_in_session("g/4", b.id).await.unwrap();
    store
        .release("g/4", "node-b", ended.fencing_token)
        .await
        .unwrap();
    let roles: Vec<String> = ["g/0", "g/1", "g/2", "g/3", "g/4", "g/0"]
        .map(String::from)
        .to_vec();
    let answers = store.acquire_many_in_session(&roles, a.id).await.unwrap();
    assert_eq!(answers.len(), roles.len(), "{answers:?}");
    let took = |i: usize| {
        let answer = &answers[i];
        assert!(answer.acquired, "{}: {answer:?}", roles[i]);
        assert_eq!(answer.holder, "node-a", "{}: {answer:?}", roles[i]);
        answer.fencing_token
    };
    took(0);
    assert_eq!(took(1), mine.fencing_token, "held here already: same term");
    assert!(took(4) > ended.fencing_token, "a released role: a new term");
    assert_eq!(took(5), took(0), "a role named twice is answered alike");
    for (i, holder, token) in [
        (2, "node-b", theirs.fencing_token),
        (3, "node-c", plain.fencing_token),
    ] {
        let answer = &answers[i];
        assert!(!answer.acquired, "{}: {answer:?}", roles[i]);
        assert_eq!(answer.holder, holder, "{answer:?}");
        assert_eq!(answer.fencing_token, token, "{answer:?}");
    }
    for role in ["g/0", "g/4"] {
        let info = store
            .get(role)
            .await
            .unwrap()
            .expect("a taken role has a row");
        assert_eq!(info.live_holder(), Some("node-a"), "{info:?}");
    }
}

/// An empty batch is answered with nothing; a batch under an ended session is
/// `SessionEnded`; a bad role anywhere in a batch is `InvalidArgument` naming `role`,
/// and no role of that batch is taken.
pub async fn scenario_session_acquire_many_rules(backend: &dyn LeaseBackend) {
    let (fx, store, ttl) = begin(backend).await;
    let a = open(store.as_ref(), "node-a", ttl).await;
    assert!(store
        .acquire_many_in_session(&[], a.id)
        .await
        .unwrap()
        .is_empty());
    let bad = ["g/0".to_owned(), "a\0b".to_owned(), "g/1".to_owned()];
    assert_invalid(store.acquire_many_in_session(&bad, a.id).await, "role");
    for role in ["g/0", "g/1"] {
        let info = store.get(role).await.unwrap();
        assert!(
            info.as_ref().is_none_or(|i| i.live_holder().is_none()),
            "a batch refused for bad input took {role}: {info:?}"
        );
    }
    let b = open(store.as_ref(), "node-b", ttl).await;
    fx.pass_time(ttl.mul_f64(1.2)).await;
    let roles = ["g/0".to_owned()];
    assert!(matches!(
        store.acquire_many_in_session(&roles, b.id).await,
        Err(Error::SessionEnded(id)) if id == b.id
    ));
}

/// Sessions race with batches naming the same roles in different orders: every role has
/// exactly one winner, every answer names the role's one holder, and the batches do not
/// fail each other (a store taking a batch's rows in the order asked could deadlock).
pub async fn scenario_session_acquire_many_contention(backend: &dyn LeaseBackend) {
    let (fx, store, ttl) = begin(backend).await;
    let contenders = fx.contenders().clamp(2, 8);
    let roles: Vec<String> = (0..40).map(|k| format!("g/{k}")).collect();
    let mut tasks = Vec::new();
    for i in 0..contenders {
        let owner = format!("node-{i}");
        let session = open(store.as_ref(), &owner, ttl).await.id;
        let mut asked = roles.clone();
        asked.rotate_left(i * 7 % roles.len());
        if i % 2 == 1 {
            asked.reverse();
        }
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let answers = store.acquire_many_in_session(&asked, session).await;
            (owner, asked, answers)
        }));
    }
    let mut holders = std::collections::BTreeMap::new();
    let mut tokens = std::collections::BTreeMap::new();
    let mut seen = Vec::new();
    for task in tasks {
        let (owner, asked, answers) = task.await.unwrap();
        let answers = answers.unwrap_or_else(|e| panic!("{owner}'s batch failed: {e}"));
        assert_eq!(answers.len(), asked.len());
        for (role, answer) in asked.into_iter().zip(answers) {
            if answer.acquired {
                assert_eq!(answer.holder, owner, "{role}: {answer:?}");
                if let Some(other) = holders.insert(role.clone(), owner.clone()) {
                    panic!("{role} won by {other} and {owner}");
                }
                tokens.insert(role.clone(), answer.fencing_token);
            }
            seen.push((role, answer.holder, answer.fencing_token));
        }
    }
    assert_eq!(
        holders.len(),
        roles.len(),
        "every role has a winner: {holders:?}"
    );
    for (role, holder, token) in seen {
        assert_eq!(
            holders[&role], holder,
            "{role}: every answer names its one holder"
        );
        assert_eq!(tokens[&role], token, "{role}: one term, one token");
    }
}

/// Brings `copy` up to the store through [`LeaseStore::list_prefix_changes`] and
/// asserts it shows what a complete `list_prefix` does: the same roles, live holders
/// and tokens; and that the read said it changed exactly when some lease's holder,
/// token, session or liveness did.
async fn assert_copy_matches(copy: &mut LeaseCopy<String>, store: &dyn LeaseStore, step: &str) {
    let terms = |copy: &LeaseCopy<String>| -> Vec<_> {
        copy.iter()
            .map(|(role, lease)| {
                let holder = lease.holder.map(str::to_owned);
                let live = !lease.left.is_zero();
                (
                    role.clone(),
                    holder,
                    lease.fencing_token,
                    lease.session,
                    live,
                )
            })
            .collect()
    };
    let before = terms(copy);
    let changed = copy
        .read(store, "q/", |role| Some(role.to_owned()))
        .await
        .unwrap();
    let after = terms(copy);
    assert_eq!(
        changed,
        after != before,
        "{step}: whether the read said the copy changed: {before:?} -> {after:?}"
    );
    let listed = store.list_prefix("q/").await.unwrap();
    let want: Vec<_> = listed
        .iter()
        .map(|l| {
            (
                l.role.clone(),
                l.live_holder().map(str::to_owned),
                l.fencing_token,
            )
        })
        .collect();
    let got: Vec<_> = copy
        .iter()
        .map(|(role, lease)| {
            let holder = lease.live_holder().map(str::to_owned);
            (format!("q/{role}"), holder, lease.fencing_token)
        })
        .collect();
    assert_eq!(
        got, want,
        "{step}: the copy kept by changes against a complete read"
    );
}

/// A copy of a prefix's leases kept by reading only what changed
/// ([`LeaseStore::list_prefix_changes`]) shows, after each read, what a complete read
/// shows: through new terms, releases, plain leases renewed and lapsing, sessions kept
/// alive, lapsing and closed, and writes through another instance of the store.
pub async fn scenario_session_changes_keep_a_copy(backend: &dyn LeaseBackend) {
    let fx = backend.create().await;
    let store = fx.store();
    let other = fx.reopen().await;
    let ttl = fx.ttl();
    let mut copy = LeaseCopy::default();
    assert_copy_matches(&mut copy, store.as_ref(), "empty").await;
    let a = open(store.as_ref(), "node-a", ttl).await;
    let b = open(store.as_ref(), "node-b", ttl).await;
    let roles: Vec<String> = (0..4).map(|k| format!("q/{k}")).collect();
    store.acquire_many_in_session(&roles, a.id).await.unwrap();
    store.acquire_in_session("q/4", b.id).await.unwrap();
    store.try_acquire("q/5", "node-c", ttl).await;
    store.try_acquire("r/0", "node-c", ttl).await;
    assert_copy_matches(&mut copy, store.as_ref(), "first read").await;
    assert_copy_matches(&mut copy, store.as_ref(), "nothing changed").await;

    let one = copy.get(&"1".to_owned()).unwrap().fencing_token;
    assert!(other.release_term("q/1", "node-a", one).await);
    store.try_acquire("q/5", "node-c", ttl).await;
    other.acquire_in_session("q/6", a.id).await.unwrap();
    store.keep_alive(b.id, ttl).await.unwrap();
    assert_copy_matches(&mut copy, store.as_ref(), "a release and a new term").await;

    fx.pass_time(ttl.mul_f64(0.6)).await;
    store.keep_alive(a.id, ttl).await.unwrap();
    fx.pass_time(ttl.mul_f64(0.6)).await;
    store.keep_alive(a.id, ttl).await.unwrap();
    assert_copy_matches(
        &mut copy,
        store.as_ref(),
        "b's session and c's lease lapsed",
    )
    .await;

    assert!(other.close_session(a.id).await.unwrap());
    let d = open(store.as_ref(), "node-d", ttl).await;
    other.acquire_in_session("q/2", d.id).await.unwrap();
    store.try_acquire("q/4", "node-c", ttl).await;
    assert_copy_matches(&mut copy, store.as_ref(), "a closed, d and c took roles").await;
    let reopened = copy.get(&"4".to_owned()).unwrap();
    assert_eq!(reopened.live_holder(), Some("node-c"));
}

/// A store whose keep-alives tell the latest change ([`SessionGrant::latest_change`])
/// tells it at open and at every keep-alive, and a read of changes whose mark is at or
/// past it saw everything: a keep-alive after a read tells nothing later than the read's
/// mark while no term changes (renewals, keep-alives and reads are no changes), and
/// something later once a term of any prefix begins or ends, through another instance
/// of the store too (a new term, a release, a session closed with its roles, a batch of
/// terms under a session, a release that hands the role to a queued candidate). A store
/// that does not tell says `None` at every step.
pub async fn scenario_session_tells_the_latest_change(backend: &dyn LeaseBackend) {
    let fx = backend.create().await;
    let store = fx.store();
    let other = fx.reopen().await;
    let ttl = fx.ttl();
    let a = open(store.as_ref(), "node-a", ttl).await;
    let b = open(store.as_ref(), "node-b", ttl).await;
    if a.latest_change.is_none() {
        assert_eq!(b.latest_change, None, "{b:?}");
        store.acquire_in_session("q/0", a.id).await.unwrap();
        let kept = store.keep_alive(a.id, ttl).await.expect("live");
        assert_eq!(kept.latest_change, None, "{kept:?}");
        return;
    }
    store.acquire_in_session("q/0", a.id).await.unwrap();
    store.acquire_in_session("q/1", b.id).await.unwrap();
    let c = store.try_acquire("r/0", "node-c", ttl).await;
    let told = || async { latest_told(store.as_ref(), a.id, ttl).await };

    let mark = read_mark(store.as_ref(), None).await;
    assert_seen(told().await, mark, "nothing changed");
    assert!(store.try_acquire("r/0", "node-c", ttl).await.acquired);
    store.keep_alive(b.id, ttl).await.expect("live");
    assert_seen(
        latest_told(other.as_ref(), a.id, ttl).await,
        mark,
        "a renewal and keep-alives",
    );
    let reread = read_mark(store.as_ref(), Some(mark)).await;
    assert_seen(told().await, reread, "a read");

    assert!(other.release_term("r/0", "node-c", c.fencing_token).await);
    let mark = changed_since(
        store.as_ref(),
        a.id,
        ttl,
        mark,
        "a release of another prefix",
    )
    .await;
    other.acquire_in_session("q/2", a.id).await.unwrap();
    let mark = changed_since(store.as_ref(), a.id, ttl, mark, "a new term elsewhere").await;
    assert!(other.close_session(b.id).await.unwrap());
    let mark = changed_since(
        store.as_ref(),
        a.id,
        ttl,
        mark,
        "a session closed with a role",
    )
    .await;
    let batch = ["q/3".to_owned(), "q/4".to_owned()];
    other.acquire_many_in_session(&batch, a.id).await.unwrap();
    let mark = changed_since(store.as_ref(), a.id, ttl, mark, "a batch of new terms").await;
    let held = store.try_acquire("r/1", "node-c", ttl).await;
    assert!(!other.acquire_or_queue("r/1", "node-e", ttl).await.acquired);
    let mark = read_mark(store.as_ref(), Some(mark)).await;
    assert!(
        store
            .release_term("r/1", "node-c", held.fencing_token)
            .await
    );
    let mark = changed_since(
        store.as_ref(),
        a.id,
        ttl,
        mark,
        "a release that handed the role to a queued candidate",
    )
    .await;
    let d = open(store.as_ref(), "node-d", ttl).await;
    assert_seen(d.latest_change.expect("told"), mark, "a session opened");
}

/// The latest change a keep-alive of live `session` tells.
async fn latest_told(store: &dyn LeaseStore, session: SessionId, ttl: Duration) -> ChangeMark {
    let kept = store.keep_alive(session, ttl).await.expect("live");
    kept.latest_change
        .unwrap_or_else(|| panic!("a keep-alive told no latest change: {kept:?}"))
}

/// The mark of a read of the changes of `q/` since `since` (all of it for `None`).
async fn read_mark(store: &dyn LeaseStore, since: Option<ChangeMark>) -> ChangeMark {
    let read = match since {
        Some(mark) => ChangesRead::since("q/", mark, &[]),
        None => ChangesRead::complete("q/"),
    };
    let changes = store.changes(read).await;
    changes
        .mark
        .expect("a store whose keep-alives tell the latest change marks its reads")
}

/// Asserts a read with `mark` saw every change a keep-alive told of (`latest`).
fn assert_seen(latest: ChangeMark, mark: ChangeMark, step: &str) {
    assert!(
        latest <= mark,
        "{step}: latest change {latest:?}, read's mark {mark:?}"
    );
}

/// After `what` changed a term: a keep-alive of `session` tells of a change the read
/// with `mark` did not see, and a read since `mark` sees it. Returns that read's mark.
async fn changed_since(
    store: &dyn LeaseStore,
    session: SessionId,
    ttl: Duration,
    mark: ChangeMark,
    what: &str,
) -> ChangeMark {
    let latest = latest_told(store, session, ttl).await;
    assert!(
        latest > mark,
        "{what}: latest change {latest:?}, read's mark {mark:?}"
    );
    let mark = read_mark(store, Some(mark)).await;
    assert_seen(latest_told(store, session, ttl).await, mark, what);
    mark
}

/// Runs every session scenario against one backend as `#[tokio::test]`s.
#[macro_export]
macro_rules! session_scenarios {
    ($backend:expr $(, $key:ident = $value:tt)*) => {
        $crate::scenario_tests!(sessions; $backend; [$($key = $value),*];
            scenario_session_lives_while_kept_alive,
            scenario_session_holds_roles,
            scenario_session_close_releases_roles,
            scenario_session_meets_other_holders,
            scenario_session_contention,
            scenario_session_acquire_many,
            scenario_session_acquire_many_rules,
            scenario_session_acquire_many_contention,
            scenario_session_bad_input,
            scenario_session_changes_keep_a_copy,
            scenario_session_tells_the_latest_change);
    };
}
