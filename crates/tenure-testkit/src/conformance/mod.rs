//! The conformance suite: the lease store and membership rules (`docs/semantics.md`) as
//! scenarios every backend must pass.
//!
//! Each `scenario_*` builds fresh storage from the backend and panics (with a message
//! saying which rule broke) on a violation. Backend crates call each one from a
//! `#[tokio::test]`; [`lease_scenarios!`](crate::lease_scenarios) and
//! [`registry_scenarios!`](crate::registry_scenarios) generate those tests.

use std::sync::Arc;
use std::time::Duration;

use tenure::{FencingToken, LeaseStore};
use tokio::task::JoinHandle;

use crate::{LeaseBackend, RegistryBackend};

mod contention;
mod input;
mod listing;
mod macros;
mod registry;
mod release;
mod terms;

pub use crate::observe::{
    scenario_observe_bad_role, scenario_observe_pushes_changes, scenario_observe_sees_expiry,
    scenario_value_bad_input, scenario_value_kept_with_term,
};
pub use contention::scenario_concurrent_contenders;
pub(crate) use input::assert_invalid;
pub use input::scenario_bad_input;
pub use listing::{scenario_get_and_list, scenario_list_prefix};
pub use registry::{
    scenario_heartbeat_boundary, scenario_heartbeat_liveness, scenario_leave,
    scenario_live_set_sorted, scenario_members_change_wakes_waiters, scenario_metadata_and_times,
    scenario_registry_bad_input, REGISTRY_TTL,
};
pub use release::{
    scenario_release_hands_over, scenario_stale_release_is_noop, scenario_token_survives_reopen,
    scenario_wait_wakes_on_release,
};
pub use terms::{
    scenario_expiry_boundary, scenario_first_acquire_gets_token_one,
    scenario_other_owner_refused_while_live, scenario_own_lapse_gets_new_token,
    scenario_renew_keeps_token_and_extends, scenario_takeover_after_expiry,
};

fn token(n: u64) -> FencingToken {
    FencingToken::from(n)
}

/// Spawns a task that waits (60 s at most) for the term `observed` of `role` to end,
/// and returns how long it waited.
pub(crate) fn spawn_term_waiter(
    store: &Arc<dyn LeaseStore>,
    role: &str,
    observed: FencingToken,
) -> JoinHandle<Duration> {
    let (store, role) = (Arc::clone(store), role.to_owned());
    tokio::spawn(async move {
        let start = tokio::time::Instant::now();
        store
            .wait_for_change(&role, observed, start + Duration::from_secs(60))
            .await;
        start.elapsed()
    })
}

/// Runs every lease scenario in sequence.
pub async fn all_lease_scenarios(backend: &dyn LeaseBackend) {
    scenario_first_acquire_gets_token_one(backend).await;
    scenario_renew_keeps_token_and_extends(backend).await;
    scenario_other_owner_refused_while_live(backend).await;
    scenario_takeover_after_expiry(backend).await;
    scenario_expiry_boundary(backend).await;
    scenario_own_lapse_gets_new_token(backend).await;
    scenario_release_hands_over(backend).await;
    scenario_stale_release_is_noop(backend).await;
    scenario_concurrent_contenders(backend).await;
    scenario_get_and_list(backend).await;
    scenario_token_survives_reopen(backend).await;
    scenario_wait_wakes_on_release(backend).await;
    scenario_bad_input(backend).await;
    scenario_value_kept_with_term(backend).await;
    scenario_value_bad_input(backend).await;
    scenario_observe_pushes_changes(backend).await;
    scenario_observe_sees_expiry(backend).await;
    scenario_observe_bad_role(backend).await;
}

/// Runs every registry scenario in sequence.
pub async fn all_registry_scenarios(backend: &dyn RegistryBackend) {
    scenario_heartbeat_liveness(backend).await;
    scenario_heartbeat_boundary(backend).await;
    scenario_live_set_sorted(backend).await;
    scenario_leave(backend).await;
    scenario_metadata_and_times(backend).await;
    scenario_registry_bad_input(backend).await;
}
