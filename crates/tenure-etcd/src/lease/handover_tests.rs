//! The two-transaction handover (see `queue.rs`) stopped, lost or late at each point a
//! releaser or a `hand_over` caller can be, on a real etcd: the transactions are sent
//! one by one, as [`EtcdLeaseStore::end_term`] sends them, so a test can stop between
//! them, send the second again as a retry whose first answer was lost, or send it late
//! after the next contender finished the handover. Each must leave one term, under a
//! token that grew, held by the candidate the handover was for (or, when that one left,
//! the next live one), and the role never stuck.

use tenure_testkit::etcd::EtcdServer;
use tokio::time::Instant;

use super::queue::{Ended, Pending};
use super::*;
use tenure::lease::Handover;

const ROLE: &str = "handed";
const LONG: Duration = Duration::from_secs(20);

fn unique_prefix(tag: &str) -> String {
    static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("/unit/{tag}-{}-{nanos}-{seq}", std::process::id())
}

/// A store on the shared etcd: each call is another process's (its own client).
async fn store(prefix: &str) -> EtcdLeaseStore {
    let endpoint = EtcdServer::shared().expect("shared etcd server").endpoint();
    let client = Client::connect([endpoint], Some(crate::connect_options()))
        .await
        .unwrap();
    EtcdLeaseStore::new(client, prefix).unwrap()
}

/// The live holder and token, as `get` shows them.
async fn holder(store: &EtcdLeaseStore) -> Option<(String, FencingToken)> {
    let info = store.get(ROLE).await.unwrap()?;
    let token = info.fencing_token;
    info.live_holder().map(|holder| (holder.to_owned(), token))
}

/// A holder `node-a` and the candidates `queued` (owner, TTL), oldest first, all on
/// `store`; returns node-a's token.
async fn held_with_queue(store: &EtcdLeaseStore, queued: &[(&str, Duration)]) -> FencingToken {
    let a = store
        .try_acquire_or_queue(ROLE, "node-a", LONG, None)
        .await
        .unwrap();
    assert!(a.acquired);
    for (owner, ttl) in queued {
        let answer = store
            .try_acquire_or_queue(ROLE, owner, *ttl, None)
            .await
            .unwrap();
        assert!(!answer.acquired, "{owner} queues");
    }
    a.fencing_token
}

/// Step 1 of a handover (`how`) of node-a's term `token`, as `end_term` sends it; the
/// handover it began (step 2 is not sent).
async fn first_step(store: &EtcdLeaseStore, token: FencingToken, how: Handover<'_>) -> Pending {
    let revision = i64::try_from(token.get()).unwrap();
    let record = TermRecord {
        owner: "node-a".into(),
        token: Some(token.get()),
        expires_at_ns: to_ns(SystemTime::now()),
        ttl_secs: 20,
        lease_secs: 20,
        released: true,
    };
    let (txn, to) = match how {
        Handover::Release | Handover::ToSessionOf(_) => (
            release_txn(&store.keys, ROLE, "node-a", revision, &record).unwrap(),
            None,
        ),
        Handover::To(to) => (
            queue::handover_txn(&store.keys, ROLE, "node-a", revision, &record, to).unwrap(),
            to,
        ),
    };
    let response = store.conn.txn("a test's first step", txn).await.unwrap();
    assert!(response.succeeded(), "node-a's term ended");
    let pending = Ended::from(&response, to)
        .pending
        .expect("a candidate was queued: the role is reserved");
    let (seen, _, _) = store.read_role(ROLE).await.unwrap();
    assert!(matches!(seen, Seen::Handing), "reserved: {seen:?}");
    assert_eq!(
        holder(store).await,
        None,
        "between the steps nobody holds it"
    );
    pending
}

/// Setup: node-a holds, node-b then node-c queue; node-a's `hand_over` to node-c stops
/// after its first transaction. A plain contender finishes it for node-c (not node-b,
/// the oldest), under a larger token; node-a's retries end and hand nothing; node-b
/// keeps its place and node-c renews the term it was handed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_stopped_after_its_reservation_goes_to_the_named_candidate() {
    let prefix = unique_prefix("handover-stopped");
    let a_store = store(&prefix).await;
    let a = held_with_queue(&a_store, &[("node-b", LONG), ("node-c", LONG)]).await;
    first_step(&a_store, a, Handover::To(Some("node-c"))).await;

    let plain = store(&prefix).await;
    let p = plain
        .try_acquire_or_renew(ROLE, "node-p", LONG)
        .await
        .unwrap();
    assert!(!p.acquired, "{p:?}");
    assert_eq!(p.holder, "node-c", "the named candidate, not the oldest");
    assert!(p.fencing_token > a);
    for retry in [None, Some("node-c"), Some("node-b")] {
        assert!(!a_store.hand_over(ROLE, "node-a", a, retry).await.unwrap());
    }
    assert!(!a_store.release(ROLE, "node-a", a).await.unwrap());
    assert_eq!(
        holder(&plain).await,
        Some(("node-c".to_owned(), p.fencing_token))
    );
    assert_eq!(a_store.candidates(ROLE).await.unwrap(), ["node-b"]);
    let c = a_store
        .try_acquire_or_queue(ROLE, "node-c", LONG, None)
        .await
        .unwrap();
    assert!(c.acquired && c.fencing_token == p.fencing_token, "{c:?}");
}

/// Setup: for a release and for a `hand_over` to node-c, both steps applied, and the
/// second's answer lost: the releaser sends it again (and retries the whole call). The
/// second send changes nothing: the candidate's term, begun once, keeps its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_step_whose_answer_was_lost_begins_nothing_when_sent_again() {
    for how in [Handover::Release, Handover::To(Some("node-c"))] {
        let prefix = unique_prefix("handover-lost");
        let s = store(&prefix).await;
        let a = held_with_queue(&s, &[("node-b", LONG), ("node-c", LONG)]).await;
        let pending = first_step(&s, a, how).await;
        s.finish_handover(ROLE, Some(pending.clone()))
            .await
            .unwrap();
        let next = if matches!(how, Handover::Release) {
            "node-b"
        } else {
            "node-c"
        };
        let (holder_now, token) = holder(&s).await.expect("a term began");
        assert_eq!(holder_now, next, "{how:?}");
        assert!(token > a);

        s.finish_handover(ROLE, Some(pending)).await.unwrap();
        assert_eq!(
            holder(&s).await,
            Some((next.to_owned(), token)),
            "{how:?}: sent again, the second step began no other term"
        );
        assert!(!s.release(ROLE, "node-a", a).await.unwrap());
        assert!(!s.hand_over(ROLE, "node-a", a, None).await.unwrap());
        let other = if next == "node-b" { "node-c" } else { "node-b" };
        assert_eq!(s.candidates(ROLE).await.unwrap(), [other], "{how:?}");
        let renewed = s
            .try_acquire_or_queue(ROLE, next, LONG, None)
            .await
            .unwrap();
        assert!(renewed.acquired && renewed.fencing_token == token);
    }
}

/// Setup: node-a's release stops after its first step (reserved for node-b); a plain
/// contender finishes it; node-b hands on to node-c by an ordinary release. node-a's
/// second step then lands late: it changes nothing. node-c then releases with node-d
/// queued and stops after its own first step; node-a's old second step lands again: it
/// never begins node-b's term, and at most finishes node-d's handover for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_second_step_never_begins_the_term_it_was_for() {
    let prefix = unique_prefix("handover-late");
    let s = store(&prefix).await;
    let a = held_with_queue(&s, &[("node-b", LONG), ("node-c", LONG)]).await;
    let late = first_step(&s, a, Handover::Release).await;

    let plain = store(&prefix).await;
    let p = plain
        .try_acquire_or_renew(ROLE, "node-p", LONG)
        .await
        .unwrap();
    assert_eq!(p.holder, "node-b", "{p:?}");
    let b = p.fencing_token;
    assert!(b > a);
    assert!(s.release(ROLE, "node-b", b).await.unwrap());
    let (next, c) = holder(&s).await.expect("handed to node-c");
    assert_eq!(next, "node-c");
    assert!(c > b);

    s.finish_handover(ROLE, Some(late.clone())).await.unwrap();
    assert_eq!(
        holder(&s).await,
        Some(("node-c".to_owned(), c)),
        "a late second step leaves the newer term"
    );

    let d = s
        .try_acquire_or_queue(ROLE, "node-d", LONG, None)
        .await
        .unwrap();
    assert!(!d.acquired);
    let revision = i64::try_from(c.get()).unwrap();
    let record = TermRecord {
        owner: "node-c".into(),
        token: Some(c.get()),
        expires_at_ns: to_ns(SystemTime::now()),
        ttl_secs: 20,
        lease_secs: 20,
        released: true,
    };
    let txn = release_txn(&s.keys, ROLE, "node-c", revision, &record).unwrap();
    assert!(s
        .conn
        .txn("node-c's first step", txn)
        .await
        .unwrap()
        .succeeded());
    s.finish_handover(ROLE, Some(late)).await.unwrap();
    let (next, d_token) = holder(&s).await.expect("a term, not a stuck reservation");
    assert_eq!(next, "node-d", "never node-b's old place");
    assert!(d_token > c);
    assert!(s.candidates(ROLE).await.unwrap().is_empty());
}

/// Setup: node-a's release stops after its first step, reserved for node-b, whose
/// candidacy (1 s) then lapses (node-b died in the queue); node-c waits behind it. The
/// releaser's second step, sent late, begins node-c's term. With nobody left behind a
/// dead reserved candidate, a plain contender's attempt frees the role and takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserved_candidate_that_died_leaves_the_role_to_the_next_or_free() {
    let one = Duration::from_secs(1);
    let prefix = unique_prefix("handover-dead");
    let s = store(&prefix).await;
    let a = held_with_queue(&s, &[("node-b", one), ("node-c", LONG)]).await;
    let late = first_step(&s, a, Handover::Release).await;
    until_gone(&s, "node-b").await;
    s.finish_handover(ROLE, Some(late)).await.unwrap();
    let (next, c) = holder(&s).await.expect("a term, not a stuck reservation");
    assert_eq!(next, "node-c");
    assert!(c > a);

    let prefix = unique_prefix("handover-dead-alone");
    let s = store(&prefix).await;
    let a = held_with_queue(&s, &[("node-b", one)]).await;
    first_step(&s, a, Handover::Release).await;
    until_gone(&s, "node-b").await;
    let p = store(&prefix)
        .await
        .try_acquire_or_renew(ROLE, "node-p", LONG)
        .await
        .unwrap();
    assert!(p.acquired && p.fencing_token > a, "{p:?}");
}

/// Setup: node-a's `hand_over` to node-b stops after its first step; node-b withdraws
/// (answered `true`). The late second step begins node-c's term, the oldest left, and
/// never node-b's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_that_withdrew_after_the_reservation_is_never_handed_the_role() {
    let prefix = unique_prefix("handover-withdrawn");
    let s = store(&prefix).await;
    let a = held_with_queue(&s, &[("node-b", LONG), ("node-c", LONG)]).await;
    let late = first_step(&s, a, Handover::To(Some("node-b"))).await;
    assert!(s.withdraw(ROLE, "node-b").await.unwrap());
    s.finish_handover(ROLE, Some(late)).await.unwrap();
    let (next, c) = holder(&s).await.expect("a term, not a stuck reservation");
    assert_eq!(next, "node-c");
    assert!(c > a);
    assert!(s.candidates(ROLE).await.unwrap().is_empty());
}

/// Waits (at most 10 s: etcd expires a 1 s lease within about 1.5 s) until `owner`'s
/// candidacy is gone with its etcd lease.
async fn until_gone(s: &EtcdLeaseStore, owner: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.candidates(ROLE).await.unwrap().iter().any(|c| c == owner) {
        assert!(
            Instant::now() < deadline,
            "{owner}'s candidacy never lapsed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The revision that last wrote the role's term record (every renewal writes it).
async fn revision(store: &EtcdLeaseStore) -> i64 {
    let mut kv = store.client().kv_client();
    let answer = kv.get(store.keys.term(ROLE), None).await.unwrap();
    answer.kvs().first().map_or(0, |kv| kv.mod_revision())
}

/// Setup: node-a holds, node-b queues, node-a releases: the release begins node-b's term
/// on node-b's candidacy lease. Against an etcd whose keep-alive answers truly, node-b's
/// first call answers from that lease's last keep-alive with no request (nothing is
/// written); its next call renews (a write). Against one whose keep-alive may answer for
/// a lease it revokes, the first call renews too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_term_answers_its_successor_from_the_candidacy_lease() {
    for safe in [true, false] {
        let prefix = unique_prefix("handover-answered");
        let fixed = safe.then_some(crate::version::SAFE_KEEP_ALIVE_SINCE[0]);
        let store = store(&prefix).await.for_server(fixed);
        let a = held_with_queue(&store, &[("node-b", LONG)]).await;
        let queued_at = Instant::now();
        assert!(store.release(ROLE, "node-a", a).await.unwrap());
        let handed = holder(&store).await.expect("node-b leads");
        assert_eq!(handed.0, "node-b");

        let before = revision(&store).await;
        let sent = Instant::now();
        let b = store
            .try_acquire_or_queue(ROLE, "node-b", LONG, None)
            .await
            .unwrap();
        assert!(b.acquired && b.fencing_token == handed.1, "{b:?}");
        let first_wrote = revision(&store).await > before;
        assert_eq!(first_wrote, !safe, "safe server {safe}: first call wrote");
        // Answered from the candidacy: never past its TTL from when it queued.
        assert!(
            !safe || sent + b.remaining() <= queued_at + LONG,
            "{:?} left",
            b.remaining()
        );
        assert!(b.remaining() > LONG / 2, "{:?} left", b.remaining());

        let before = revision(&store).await;
        let again = store
            .try_acquire_or_queue(ROLE, "node-b", LONG, None)
            .await
            .unwrap();
        assert!(
            again.acquired && again.fencing_token == handed.1,
            "{again:?}"
        );
        assert!(revision(&store).await > before, "the second call renews");
    }
}
