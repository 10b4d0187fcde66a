//! The checker's unit tests: hand-made histories and logs, each with the violations or
//! recovery times it must yield.

use super::*;

/// A history line at `t` ns; the timeline's tests make theirs with it too.
pub(crate) fn ev(t: u64, worker: &str, ev: EventKind, token: u64, seq: u64) -> Event {
    Event {
        t,
        worker: worker.to_owned(),
        ev,
        token,
        seq,
        shard: None,
        note: None,
    }
}

fn row(id: i64, worker: &str, token: u64, seq: u64) -> LogRow {
    LogRow {
        id,
        worker: worker.to_owned(),
        token,
        seq,
    }
}

/// A clean handover: a leads with 1, b takes over with 2, a's late write is fenced.
fn clean() -> (Vec<Event>, Vec<LogRow>) {
    use EventKind::*;
    let events = vec![
        ev(10, "a", Lead, 1, 0),
        ev(11, "a", Invoke, 1, 1),
        ev(12, "a", Ok, 1, 1),
        ev(20, "a", Invoke, 1, 2),
        ev(30, "b", Lead, 2, 0),
        ev(31, "b", Invoke, 2, 1),
        ev(32, "b", Ok, 2, 1),
        ev(40, "a", Fenced, 1, 2),
        ev(41, "a", Unlead, 1, 0),
    ];
    (events, vec![row(1, "a", 1, 1), row(2, "b", 2, 1)])
}

#[test]
fn a_clean_handover_passes_and_counts_the_refusal() {
    let (events, log) = clean();
    let a = check(&events, &log, &[], &[]);
    assert_eq!(a.violations, vec![]);
    assert_eq!((a.writes.admitted, a.writes.refused, a.terms), (2, 1, 2));
    // a believed it led from 10 to 41, b from 30 to its last event at 32.
    assert_eq!(a.overlap_ms, 2.0 / 1e6);
}

#[test]
fn a_stale_write_admitted_after_a_newer_one_is_caught() {
    use EventKind::*;
    let (mut events, _) = clean();
    // a's late write went through unfenced, after b's.
    events.retain(|e| e.ev != Fenced);
    events.push(ev(40, "a", Ok, 1, 2));
    let log = vec![row(1, "a", 1, 1), row(2, "b", 2, 1), row(3, "a", 1, 2)];
    let a = check(&events, &log, &[], &[]);
    let kinds: Vec<_> = a.violations.iter().map(|v| v.kind.as_str()).collect();
    assert_eq!(kinds, ["log_order"]);
    // Invoked at 20, before b's ack at 32: not a real-time stale ack. Invoked after:
    events.retain(|e| !(e.worker == "a" && e.seq == 2));
    events.push(ev(33, "a", Invoke, 1, 2));
    events.push(ev(40, "a", Ok, 1, 2));
    events.sort_by_key(|e| e.t);
    let a = check(&events, &log, &[], &[]);
    let kinds: Vec<_> = a.violations.iter().map(|v| v.kind.as_str()).collect();
    assert_eq!(kinds, ["log_order", "stale_ack"]);
}

#[test]
fn lost_refused_phantom_and_reused_are_caught() {
    use EventKind::*;
    let (mut events, mut log) = clean();
    log.retain(|r| r.worker != "b"); // b's acknowledged write is gone
    log.push(row(3, "a", 1, 2)); // a's refused write is there
    log.push(row(4, "c", 2, 9)); // nobody wrote this
    events.push(ev(50, "c", Lead, 2, 0)); // token 2 led twice
    let observations = [
        Observation {
            t: 1,
            token: 2,
            holder: Some("b".into()),
        },
        Observation {
            t: 2,
            token: 1,
            holder: Some("a".into()),
        },
    ];
    let a = check(&events, &log, &observations, &[]);
    let kinds: Vec<_> = a.violations.iter().map(|v| v.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "lost_write",
            "phantom_write",
            "refused_committed",
            "token_regressed",
            "token_reused"
        ]
    );
}

#[test]
fn recovery_runs_from_the_fault_to_the_next_write_invoked_after_it() {
    let (events, log) = clean();
    let faults = [
        FaultRecord {
            kind: FaultKind::Pause,
            flavour: None,
            target: None,
            at: 15_000_000,
            healed: 50,
        },
        FaultRecord {
            kind: FaultKind::Kill,
            flavour: None,
            target: None,
            at: 99_000_000,
            healed: 99,
        },
        // A blackhole from 5 ms to 25 ms is measured from its heal: b's write
        // invoked at 31 ms, acknowledged at 32.
        FaultRecord {
            kind: FaultKind::Cut,
            flavour: Some("blackhole"),
            target: None,
            at: 5_000_000,
            healed: 25_000_000,
        },
    ];
    let events: Vec<Event> = events
        .into_iter()
        .map(|mut e| {
            e.t *= 1_000_000;
            e
        })
        .collect();
    let a = check(&events, &log, &[], &faults);
    let pause = &a.recovery["pause"];
    assert_eq!((pause.recovered, pause.p50_ms), (1, Some(17.0)));
    // The pause (15 ms) struck inside the blackhole's window (5 -> 32 ms), so that
    // sample is not the blackhole's alone; nothing struck inside the pause's.
    assert_eq!(pause.isolated, 1);
    assert_eq!(a.recovery["cut/blackhole"].isolated, 0);
    assert_eq!(a.recovery["kill"].unrecovered, 1);
    let cut = &a.recovery["cut/blackhole"];
    assert_eq!((cut.recovered, cut.p50_ms), (1, Some(7.0)));
}

/// A wedge (one worker cut off, the others reaching the store) is measured from its
/// strike, not its heal: the others must take over within a term meanwhile.
#[test]
fn a_wedge_is_measured_from_its_strike() {
    let (events, log) = clean();
    let events: Vec<Event> = events
        .into_iter()
        .map(|mut e| {
            e.t *= 1_000_000;
            e
        })
        .collect();
    let wedge = FaultRecord {
        kind: FaultKind::Cut,
        flavour: Some(CutFlavour::Wedge.name()),
        target: Some("a".to_owned()),
        at: 15_000_000,
        healed: 35_000_000,
    };
    let a = check(&events, &log, &[], &[wedge]);
    // a's write invoked at 20 ms is never acknowledged (fenced); b's, invoked at 31 ms,
    // is at 32: 17 ms after the strike (from the heal it would be none at all).
    let cut = &a.recovery["cut/wedge"];
    assert_eq!((cut.recovered, cut.p50_ms), (1, Some(17.0)));
}

fn on(shard: u32, mut e: Event) -> Event {
    e.shard = Some(shard);
    e
}

fn kill(at: u64, target: &str) -> FaultRecord {
    FaultRecord {
        kind: FaultKind::Kill,
        flavour: None,
        target: Some(target.to_owned()),
        at,
        healed: at,
    }
}

/// Two shards, each with the clean handover of [`clean`] (the same tokens on both:
/// tokens are per shard), and what the store holds.
fn two_shards() -> (Vec<Event>, BTreeMap<u32, ShardRecord>) {
    let (events, log) = clean();
    let mut all: Vec<Event> = events.iter().cloned().map(|e| on(0, e)).collect();
    // Shard 1: the same story with workers swapped and later seqs (seq is per
    // incarnation, shared by its shards).
    for e in &events {
        let mut e = on(1, e.clone());
        e.worker = if e.worker == "a" { "b" } else { "a" }.to_owned();
        if e.seq != 0 {
            e.seq += 10;
        }
        all.push(e);
    }
    all.sort_by_key(|e| e.t);
    let log1 = log
        .iter()
        .map(|r| {
            row(
                r.id + 10,
                if r.worker == "a" { "b" } else { "a" },
                r.token,
                r.seq + 10,
            )
        })
        .collect();
    let records = BTreeMap::from([
        (
            0,
            ShardRecord {
                log,
                observations: vec![],
            },
        ),
        (
            1,
            ShardRecord {
                log: log1,
                observations: vec![],
            },
        ),
    ]);
    (all, records)
}

#[test]
fn shards_are_checked_each_on_its_own() {
    let (events, records) = two_shards();
    let a = check_shards(&events, &records, &[]);
    // Token 1 led by a on shard 0 and by b on shard 1 is no reuse.
    assert_eq!(a.violations, vec![]);
    assert_eq!((a.writes.admitted, a.writes.refused, a.terms), (4, 2, 4));
    let shards = a.shard_moves.expect("a shard analysis");
    // Each shard moved once (a -> b, b -> a).
    assert_eq!(shards.moved, 2);
}

#[test]
fn a_stale_write_on_one_shard_is_caught_and_named() {
    use EventKind::*;
    let (mut events, mut records) = two_shards();
    // On shard 1, b's late write went through unfenced after a's, and a third
    // worker's row carries a's token.
    events.retain(|e| !(e.shard == Some(1) && e.ev == Fenced));
    events.push(on(1, ev(40, "b", Ok, 1, 12)));
    events.push(on(1, ev(42, "c", Invoke, 2, 1)));
    events.push(on(1, ev(43, "c", Ok, 2, 1)));
    let log = &mut records.get_mut(&1).expect("shard 1").log;
    log.push(row(13, "b", 1, 12));
    log.push(row(14, "c", 2, 1));
    let a = check_shards(&events, &records, &[]);
    let kinds: Vec<_> = a.violations.iter().map(|v| v.kind.as_str()).collect();
    assert_eq!(kinds, ["log_order", "token_shared"]);
    assert!(
        a.violations[0].examples[0].starts_with("shard 1: "),
        "{a:?}"
    );
    // Events about a shard the group does not have are a violation too.
    events.push(on(7, ev(50, "a", Lead, 1, 0)));
    let a = check_shards(&events, &records, &[]);
    assert!(a.violations.iter().any(|v| v.kind == "unknown_shard"));
}

#[test]
fn reown_runs_from_a_kill_to_the_last_of_the_victims_shards_taken() {
    use EventKind::*;
    let ms = 1_000_000;
    let events = vec![
        on(0, ev(ms, "a", Lead, 1, 0)),
        on(1, ev(2 * ms, "a", Lead, 1, 0)),
        on(2, ev(3 * ms, "b", Lead, 1, 0)),
        // a is killed at 10 ms holding shards 0 and 1; b takes 0 at 900 ms, c
        // takes 1 at 1100 ms.
        on(0, ev(900 * ms, "b", Lead, 2, 0)),
        on(1, ev(1100 * ms, "c", Lead, 2, 0)),
        // b hands both its shards over (2 to c, 0 to d) and holds nothing when it
        // is killed at 1300 ms; c, killed at 3000 ms holding 1 and 2, never sees
        // them taken.
        on(2, ev(1200 * ms, "b", Unlead, 1, 0)),
        on(2, ev(1210 * ms, "c", Lead, 2, 0)),
        on(0, ev(1240 * ms, "b", Unlead, 2, 0)),
        on(0, ev(1250 * ms, "d", Lead, 3, 0)),
    ];
    let records = (0..3).map(|k| (k, ShardRecord::default())).collect();
    // d, paused, its shard 0 taken by e at 3500 ms, is killed at 4000 ms: it held
    // nothing any more.
    let mut events = events;
    events.push(on(0, ev(3500 * ms, "e", Lead, 4, 0)));
    let faults = [
        kill(10 * ms, "a"),
        kill(1300 * ms, "b"),
        kill(3000 * ms, "c"),
        kill(4000 * ms, "d"),
        // e, holding shard 0, is paused at 3600 ms and killed while paused: the
        // pause is the sample (shard 0 never moves again: unrecovered), not the
        // kill.
        FaultRecord {
            kind: FaultKind::Pause,
            flavour: None,
            target: Some("e".to_owned()),
            at: 3600 * ms,
            healed: 4500 * ms,
        },
        kill(4500 * ms, "e"),
    ];
    let a = check_shards(&events, &records, &faults);
    let shards = a.shard_moves.expect("a shard analysis");
    let reown = &shards.reown["kill"];
    assert_eq!((reown.recovered, reown.unrecovered), (1, 1));
    assert_eq!(reown.max_ms, Some(1090.0));
    assert_eq!(shards.reown["pause"].unrecovered, 1);
    // The kills of b and d (holding nothing then) and of e (paused) are no
    // samples.
    assert_eq!(shards.not_sampled, 3);
    // 0: a -> b -> d -> e, 1: a -> c, 2: b -> c.
    assert_eq!(shards.moved, 5);
}
