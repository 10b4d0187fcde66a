//! The macros that turn every scenario into a `#[tokio::test]` of a backend's crate.

/// Generates one `#[tokio::test]` per scenario `$name`, each building the backend with
/// `$backend` and calling `$crate::$module::$name(&backend)`; `[key = value, ...]` is
/// passed to `tokio::test`. The shape every `*_scenarios!` macro shares.
#[doc(hidden)]
#[macro_export]
macro_rules! scenario_tests {
    (@one $module:ident; $backend:expr; [$($key:ident = $value:tt),*]; $name:ident) => {
        #[tokio::test($($key = $value),*)]
        async fn $name() {
            let backend = $backend;
            $crate::$module::$name(&backend).await;
        }
    };
    ($module:ident; $backend:expr; $attrs:tt; $($name:ident),* $(,)?) => {
        $( $crate::scenario_tests!(@one $module; $backend; $attrs; $name); )*
    };
}

/// Generates one `#[tokio::test]` per lease scenario. `$backend` is an expression
/// building the backend (evaluated in each test); `$flavor` is passed to `tokio::test`.
///
/// ```text
/// tenure_testkit::lease_scenarios!(MemoryBackend, flavor = "current_thread", start_paused = true);
/// ```
#[macro_export]
macro_rules! lease_scenarios {
    ($backend:expr $(, $key:ident = $value:tt)*) => {
        $crate::scenario_tests!(conformance; $backend; [$($key = $value),*];
            scenario_first_acquire_gets_token_one,
            scenario_renew_keeps_token_and_extends,
            scenario_other_owner_refused_while_live,
            scenario_takeover_after_expiry,
            scenario_expiry_boundary,
            scenario_own_lapse_gets_new_token,
            scenario_release_hands_over,
            scenario_stale_release_is_noop,
            scenario_concurrent_contenders,
            scenario_get_and_list,
            scenario_list_prefix,
            scenario_token_survives_reopen,
            scenario_wait_wakes_on_release,
            scenario_bad_input,
            scenario_value_kept_with_term,
            scenario_value_bad_input,
            scenario_observe_pushes_changes,
            scenario_observe_sees_expiry,
            scenario_observe_bad_role);
    };
}

/// Generates one `#[tokio::test]` per registry scenario; see [`lease_scenarios!`].
#[macro_export]
macro_rules! registry_scenarios {
    ($backend:expr $(, $key:ident = $value:tt)*) => {
        $crate::scenario_tests!(conformance; $backend; [$($key = $value),*];
            scenario_heartbeat_liveness,
            scenario_heartbeat_boundary,
            scenario_live_set_sorted,
            scenario_leave,
            scenario_metadata_and_times,
            scenario_members_change_wakes_waiters,
            scenario_registry_bad_input);
    };
}

/// Generates one `#[tokio::test]` per queue fault scenario, as
/// [`queue_scenarios!`](crate::queue_scenarios) does for the queue's rules.
#[macro_export]
macro_rules! queue_fault_scenarios {
    ($backend:expr $(, $key:ident = $value:tt)*) => {
        $crate::scenario_tests!(queue_faults; $backend; [$($key = $value),*];
            scenario_fault_release_answer_lost,
            scenario_fault_hand_over_answer_lost,
            scenario_fault_queue_answer_lost,
            scenario_fault_withdraw_answer_lost,
            scenario_fault_late_queue_after_withdraw,
            scenario_fault_late_queue_takes_a_free_role,
            scenario_fault_hand_over_to_a_candidate_that_died,
            scenario_fault_late_release_after_role_taken_again,
            scenario_fault_late_hand_over_with_old_token,
            scenario_fault_candidate_dies_before_release);
    };
}

/// Generates one `#[tokio::test]` per shard fault scenario of
/// [`shard_faults`](crate::shard_faults), as
/// [`queue_fault_scenarios!`](crate::queue_fault_scenarios) does for the queue's.
#[macro_export]
macro_rules! shard_fault_scenarios {
    ($backend:expr $(, $key:ident = $value:tt)*) => {
        $crate::scenario_tests!(shard_faults; $backend; [$($key = $value),*];
            scenario_shard_fault_batch_answer_lost,
            scenario_shard_fault_batch_lands_late,
            scenario_shard_fault_late_batch_under_an_abandoned_session,
            scenario_shard_fault_answer_lost_then_member_stops);
    };
}

/// Generates one `#[tokio::test]` per scenario of every suite a backend with a lease
/// store and a registry runs, each suite's macro given the same arguments:
/// [`lease_scenarios!`](crate::lease_scenarios),
/// [`session_scenarios!`](crate::session_scenarios),
/// [`registry_scenarios!`](crate::registry_scenarios),
/// [`queue_scenarios!`](crate::queue_scenarios),
/// [`queue_fault_scenarios!`](crate::queue_fault_scenarios) and
/// [`shard_fault_scenarios!`](crate::shard_fault_scenarios).
///
/// ```text
/// tenure_testkit::backend_scenarios!(Postgres, flavor = "multi_thread", worker_threads = 2);
/// ```
#[macro_export]
macro_rules! backend_scenarios {
    ($backend:expr $(, $key:ident = $value:tt)*) => {
        $crate::lease_scenarios!($backend $(, $key = $value)*);
        $crate::session_scenarios!($backend $(, $key = $value)*);
        $crate::registry_scenarios!($backend $(, $key = $value)*);
        $crate::queue_scenarios!($backend $(, $key = $value)*);
        $crate::queue_fault_scenarios!($backend $(, $key = $value)*);
        $crate::shard_fault_scenarios!($backend $(, $key = $value)*);
    };
}
