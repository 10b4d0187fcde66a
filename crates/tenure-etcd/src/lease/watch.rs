//! Waiting on etcd's watch: for a live term to end (`wait_for_change`) and for a new
//! term to begin (`wait_for_term`).

use super::*;

impl EtcdLeaseStore {
    /// Returns once the term `observed` is no longer the role's live term: the read
    /// shows another term or none, or the key is deleted or put by another term.
    pub(super) async fn watch_term(&self, role: &str, observed: FencingToken) -> Result<()> {
        let is_observed = |token: i64| u64::try_from(token).ok() == Some(observed.get());
        self.watch_role(
            role,
            |seen, _| !matches!(seen, Seen::Held(holder) if is_observed(holder.token)),
            |event| match event.event_type() {
                EventType::Delete => true,
                EventType::Put => event
                    .kv()
                    .is_some_and(|kv| !is_observed(kv.create_revision())),
            },
        )
        .await
    }

    /// Returns once a term with a token above `after` has begun on `role`: the read
    /// shows one (live, or ended already), or the key is put with a create revision
    /// above `after`. A delete, or a put keeping the create revision (a change of TTL),
    /// is no new term; renewals put nothing.
    pub(super) async fn watch_for_term(&self, role: &str, after: FencingToken) -> Result<()> {
        let above = |token: u64| token > after.get();
        self.watch_role(
            role,
            |seen, record| match (seen, record) {
                (Seen::Held(holder), _) => above(holder.token().get()),
                (Seen::Absent | Seen::Handing, Some((record, mod_revision))) => {
                    above(record.token_at(*mod_revision))
                }
                (Seen::Absent | Seen::Handing, None) => false,
            },
            |event| {
                event.event_type() == EventType::Put
                    && event
                        .kv()
                        .is_some_and(|kv| u64::try_from(kv.create_revision()).is_ok_and(above))
            },
        )
        .await
    }

    /// Reads `role`, and returns at once if `settled` says the read answers already;
    /// otherwise watches the role's lease key from right after the read and returns on
    /// the first event `news` says answers.
    pub(super) async fn watch_role(
        &self,
        role: &str,
        settled: impl FnOnce(&Seen, Option<&(TermRecord, i64)>) -> bool,
        news: impl Fn(&Event) -> bool,
    ) -> Result<()> {
        let (seen, record, revision) = self.read_role(role).await?;
        if settled(&seen, record.as_ref()) {
            return Ok(());
        }
        // Start right after the read: a watch from a past revision joins etcd's live set
        // only on a 100 ms background loop, which would delay the push by that much.
        let options = WatchOptions::new().with_start_revision(revision + 1);
        let mut stream = self
            .conn
            .watch("watching a lease", &self.keys.lease(role), options)
            .await?;
        loop {
            let Some(response) = next_response(&mut stream, "lease").await? else {
                return Err(Error::store_msg(BACKEND, "the lease watch ended"));
            };
            if response.events().iter().any(&news) {
                return Ok(());
            }
        }
    }
}

/// Runs `watch` (of `role`'s key) until it returns or `deadline` passes. When it fails,
/// or `role` is no valid name, sleeps to the deadline instead: the waits return early
/// only on news, so a caller that loops on them never spins.
pub(super) async fn until_watched(
    role: &str,
    deadline: tokio::time::Instant,
    watch: impl std::future::Future<Output = Result<()>>,
) {
    // `watch` is lazy: nothing is sent for a bad role.
    let watched = match validate_name("role", role) {
        Ok(()) => tokio::time::timeout_at(deadline, watch).await,
        Err(error) => Ok(Err(error)),
    };
    if let Ok(Err(error)) = watched {
        tracing::debug!(role, %error, "lease watch failed; waiting for the deadline");
        tokio::time::sleep_until(deadline).await;
    }
}

// The request builders below are the store's own, and public (hidden) so benchmarks can
// send exactly what the store sends (`crate::requests`): one definition for both.
