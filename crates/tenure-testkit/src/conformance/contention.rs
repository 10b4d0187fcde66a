//! Many contenders racing for one role: one winner per term, no token handed out twice.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::{LeaseBackend, MustAnswer};

/// Many contenders at once: exactly one winner per term, no token handed out twice.
pub async fn scenario_concurrent_contenders(backend: &dyn LeaseBackend) {
    let fx = backend.create().await;
    let ttl = fx.ttl();
    let contenders = fx.contenders();
    let mut stores = Vec::new();
    for i in 0..contenders {
        // Durable backends hand out separate instances (separate connections) so the
        // race happens in the store, not in a client-side lock.
        stores.push(if i % 2 == 0 {
            fx.store()
        } else {
            fx.reopen().await
        });
    }
    let mut seen = BTreeSet::new();
    for round in 0..3 {
        let mut tasks = Vec::new();
        for (i, store) in stores.iter().enumerate() {
            let store = Arc::clone(store);
            tasks.push(tokio::spawn(async move {
                let owner = format!("node-{i}");
                let result = store.try_acquire_or_renew("contested", &owner, ttl).await;
                (owner, result)
            }));
        }
        let mut winners = Vec::new();
        let mut tokens = BTreeSet::new();
        for task in tasks {
            let (owner, result) = task.await.expect("contender task");
            let result = result.unwrap_or_else(|e| panic!("{owner}: {e}"));
            tokens.insert(result.fencing_token);
            if result.acquired {
                winners.push((owner, result));
            }
        }
        assert_eq!(
            winners.len(),
            1,
            "round {round}: exactly one winner, got {winners:?}"
        );
        let (winner, result) = &winners[0];
        assert_eq!(
            tokens.len(),
            1,
            "round {round}: every answer names the one term: {tokens:?}"
        );
        assert!(
            seen.insert(result.fencing_token),
            "round {round}: token handed out twice"
        );
        assert!(
            seen.iter().next_back() == Some(&result.fencing_token),
            "round {round}: tokens increase"
        );
        let store = fx.store();
        assert!(
            store
                .release_term("contested", winner, result.fencing_token)
                .await
        );
    }
}
