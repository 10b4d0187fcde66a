//! Unit tests of the watch's shared state: copies, sightings and own writes racing
//! the events that deliver them.

use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn version(name: &str, resource_version: &str, holder: Option<&str>) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            resource_version: Some(resource_version.to_owned()),
            uid: Some("uid-1".to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            ..Default::default()
        }),
    }
}

/// This process wrote `lease` and had the answer before the watch delivered it.
fn own_copy(shared: &Shared, lease: &Lease) {
    let name = lease.metadata.name.as_deref().unwrap_or_default();
    shared.fresher(lease, Instant::now(), &shared.sending(name));
}

fn cached_version(shared: &Shared, name: &str) -> Option<String> {
    shared
        .cached(name)
        .and_then(|(lease, _)| lease.metadata.resource_version)
}

/// Runs a relist that lists `listed` while this process holds `own`; the copies
/// it left to settle.
fn relist(shared: &Shared, own: &Lease, listed: &Lease) -> Vec<Contested> {
    own_copy(shared, own);
    shared.begin_relist();
    shared.event(listed, false);
    shared.end_relist()
}

/// The watch can deliver a write of this process before the write's own answer
/// arrives (two streams from the API server). That version must not then be kept as
/// an own copy newer than the watch's: no event of it would come again to drop it,
/// and every later event of the object would count as older and be lost. Seen in the
/// herd bench: a handover's event dropped this way left every waiter asleep until
/// its next refresh (3.3 s).
#[tokio::test]
async fn a_write_the_watch_delivered_before_its_answer_hides_no_later_event() {
    let shared = Shared::new();
    let notify = shared.notify_of("r");
    shared.event(&version("r", "6", Some("node-a")), false);
    // A release writes version 7; the watch delivers it, then the answer comes.
    let written = version("r", "7", Some("node-b"));
    let sending = shared.sending("r");
    shared.event(&written, false);
    shared.fresher(&written, Instant::now(), &sending);
    drop(sending);
    assert_eq!(cached_version(&shared, "r").as_deref(), Some("7"));
    // The successor renews from another process: version 8.
    let woken = notify.notified();
    let mut woken = std::pin::pin!(woken);
    woken.as_mut().enable();
    shared.event(&version("r", "8", Some("node-b")), false);
    assert_eq!(cached_version(&shared, "r").as_deref(), Some("8"));
    assert!(
        futures_util::FutureExt::now_or_never(woken).is_some(),
        "the event woke the role's waiters"
    );
}

/// A read answering the version the watch had already delivered before it was sent
/// is no newer either; a write's answer the watch has not delivered is kept until it
/// does.
#[tokio::test]
async fn an_answer_is_kept_only_while_newer_than_the_watch() {
    let shared = Shared::new();
    shared.event(&version("c", "7", Some("node-a")), false);
    let sending = shared.sending("c");
    shared.fresher(&version("c", "7", Some("node-a")), Instant::now(), &sending);
    drop(sending);
    shared.event(&version("c", "8", None), false);
    assert_eq!(cached_version(&shared, "c").as_deref(), Some("8"));

    own_copy(&shared, &version("c", "9", Some("node-b")));
    shared.event(&version("c", "8", None), false);
    assert_eq!(cached_version(&shared, "c").as_deref(), Some("9"));
    shared.event(&version("c", "9", Some("node-b")), false);
    shared.event(&version("c", "10", None), false);
    assert_eq!(cached_version(&shared, "c").as_deref(), Some("10"));
    assert!(
        shared.in_flight.lock().is_empty(),
        "every request's entry went"
    );
}

/// The initial list may come from the API server's cache, older than a write this
/// process made while it was on its way (a withdrawn candidacy listed as queued): the
/// copy does not go back to it, and the list is not done until a read settles it.
#[tokio::test]
async fn a_relist_older_than_an_own_write_does_not_take_its_place() {
    let shared = Shared::new();
    let (queued, withdrawn) = (version("c", "10", Some("node-b")), version("c", "12", None));
    let contested = relist(&shared, &withdrawn, &queued);
    assert_eq!(cached_version(&shared, "c").as_deref(), Some("12"));
    assert_eq!(contested.len(), 1);
    assert!(!shared.synced(), "done only once settled");

    // The read shows the own write: the watch will deliver it, and only then does
    // an event of another version count.
    for contested in contested {
        shared.settle(contested, Ok(Some(withdrawn.clone())));
    }
    shared.event(&version("c", "11", Some("node-b")), false);
    assert_eq!(cached_version(&shared, "c").as_deref(), Some("12"));
    shared.event(&withdrawn, false);
    shared.event(&version("c", "13", Some("node-d")), false);
    assert_eq!(cached_version(&shared, "c").as_deref(), Some("13"));
}

/// A relist newer than the own copy (the object changed since, elsewhere): the read
/// shows the listed version, which the watch will not deliver again, so it is taken.
#[tokio::test]
async fn a_relist_newer_than_an_own_write_is_taken_once_read() {
    let shared = Shared::new();
    let (own, listed) = (version("c", "12", None), version("c", "15", Some("node-e")));
    for contested in relist(&shared, &own, &listed) {
        shared.settle(contested, Ok(Some(listed.clone())));
    }
    assert_eq!(cached_version(&shared, "c").as_deref(), Some("15"));
    shared.event(&version("c", "16", Some("node-f")), false);
    assert_eq!(cached_version(&shared, "c").as_deref(), Some("16"));
}

/// Settling leaves a newer own write alone; a read that failed takes the listed copy;
/// a read that found nothing deletes the object; a relist showing the own version
/// leaves nothing to settle.
#[tokio::test]
async fn settling_a_relisted_copy() {
    let (own, listed) = (version("c", "12", None), version("c", "10", None));
    let shared = Shared::new();
    let contested = relist(&shared, &own, &listed);
    own_copy(&shared, &version("c", "14", Some("node-b")));
    for contested in contested {
        shared.settle(contested, Ok(Some(version("c", "13", None))));
    }
    assert_eq!(cached_version(&shared, "c").as_deref(), Some("14"));

    let shared = Shared::new();
    for contested in relist(&shared, &own, &listed) {
        shared.settle(contested, Err(()));
    }
    assert_eq!(cached_version(&shared, "c").as_deref(), Some("10"));

    let shared = Shared::new();
    for contested in relist(&shared, &own, &listed) {
        shared.settle(contested, Ok(None));
    }
    assert_eq!(cached_version(&shared, "c"), None);

    let shared = Shared::new();
    assert!(relist(&shared, &own, &own).is_empty());
    assert_eq!(cached_version(&shared, "c").as_deref(), Some("12"));
}
