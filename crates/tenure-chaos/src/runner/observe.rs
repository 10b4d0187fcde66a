//! The orchestrator's own readings of the watched leases, the observations the checker
//! compares with the workers' histories.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::LeaseStore;
use tokio_util::sync::CancellationToken;

use crate::checker::Observation;
use crate::history::mono_ns;

/// How often the orchestrator reads the role's lease.
const OBSERVE_EVERY: Duration = Duration::from_millis(50);

/// What the orchestrator watches on the store.
#[derive(Clone, Debug)]
pub(super) enum Watched {
    /// One role, read with `get`.
    Role(String),
    /// Every shard of a group, read with one `list`.
    Group(String),
}

/// Reads the watched leases every [`OBSERVE_EVERY`]; publishes the worker names of
/// their live holders for the nemesis and returns every change seen, per role.
pub(super) async fn observe(
    leases: Arc<dyn LeaseStore>,
    watched: Watched,
    holders: Arc<Mutex<Vec<String>>>,
    stop: CancellationToken,
    ttl: Duration,
) -> BTreeMap<String, Vec<Observation>> {
    let mut seen: BTreeMap<String, Vec<Observation>> = BTreeMap::new();
    let mut tick = tokio::time::interval(OBSERVE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return seen,
            _ = tick.tick() => {}
        }
        let read = match &watched {
            Watched::Role(role) => tokio::time::timeout(ttl, leases.get(role))
                .await
                .map(|read| read.map(|lease| lease.into_iter().collect::<Vec<_>>())),
            Watched::Group(group) => {
                let prefix = format!("{group}/");
                tokio::time::timeout(ttl, leases.list_prefix(&prefix)).await
            }
        };
        // Errors while the server restarts are expected; the next tick retries.
        let Ok(Ok(read)) = read else { continue };
        let t = mono_ns();
        // A role's owner is `<worker>-<pid>`; a shard member's, the worker's name.
        let mut live: Vec<String> = read
            .iter()
            .filter_map(|lease| lease.live_holder())
            .map(|owner| {
                owner
                    .rsplit_once('-')
                    .map_or(owner, |(name, _)| name)
                    .to_owned()
            })
            .collect();
        live.sort_unstable();
        live.dedup();
        *holders.lock().unwrap_or_else(|e| e.into_inner()) = live;
        for lease in read {
            let observation = Observation {
                t,
                token: lease.fencing_token.get(),
                holder: lease.holder.clone(),
            };
            let history = seen.entry(lease.role).or_default();
            let changed = history.last().is_none_or(|last| {
                (last.token, &last.holder) != (observation.token, &observation.holder)
            });
            if changed {
                history.push(observation);
            }
        }
    }
}
