//! Who leads a role, and where to reach it, watched without contending.
//!
//! [`observe`] gives a [`LeaderObserver`] whose [`changed`](LeaderObserver::changed)
//! returns each change of a role's live leader: a new holder or token, or no leader at
//! all once a term is released or expires. It only reads: an observer never writes to
//! the store and never delays a contender. Between changes it waits on the store's push
//! ([`LeaseStore::wait_for_change`] while a term is live,
//! [`LeaseStore::wait_for_term`] while none is), so on a backend that pushes a change
//! is seen in one notification; a term that lapses without release is seen when its
//! expiry passes, and a store that cannot push is read every poll interval.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::lease::validate_name;
use crate::{FencingToken, LeaseInfo, LeaseStore, Result};

/// How often an observer reads the store when nothing wakes it, by default.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// The live leader of a role: its holder, token and advertised value.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Leader {
    /// The holder's owner id.
    pub owner: String,
    /// The token of its term.
    pub fencing_token: FencingToken,
    /// What the term advertised (see `LeaseLeaderOptions::advertise`), if anything.
    pub value: Option<String>,
}

impl Leader {
    /// The live leader in `info`, if its term is live.
    pub fn of(info: &LeaseInfo) -> Option<Leader> {
        info.live_holder().map(|owner| Leader {
            owner: owner.to_owned(),
            fencing_token: info.fencing_token,
            value: info.value.clone(),
        })
    }
}

/// Watches one role's leader; see the [module](self) docs.
///
/// # Examples
///
/// ```
/// # tokio_test_block_on(async {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tenure::{observe, InMemoryLeaseStore, LeaseStore};
///
/// let store = Arc::new(InMemoryLeaseStore::new());
/// let mut observer = observe(store.clone(), "reports").unwrap();
/// assert_eq!(observer.changed().await.unwrap(), None); // nobody leads yet
///
/// let ttl = Duration::from_secs(10);
/// store
///     .try_acquire_or_renew_with_value("reports", "node-a", ttl, Some("http://10.0.0.7:8080"))
///     .await
///     .unwrap();
/// let leader = observer.changed().await.unwrap().unwrap();
/// assert_eq!(leader.owner, "node-a");
/// assert_eq!(leader.value.as_deref(), Some("http://10.0.0.7:8080"));
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(f)
/// # }
/// ```
pub struct LeaderObserver {
    store: Arc<dyn LeaseStore>,
    role: String,
    poll_interval: Duration,
    /// What the last [`changed`](Self::changed) returned; `None` before the first.
    seen: Option<Option<Leader>>,
}

/// Watches `role`'s leader on `store` (see [`LeaderObserver`]). A bad role name is
/// [`crate::Error::InvalidArgument`].
pub fn observe(store: Arc<dyn LeaseStore>, role: &str) -> Result<LeaderObserver> {
    validate_name("role", role)?;
    Ok(LeaderObserver {
        store,
        role: role.to_owned(),
        poll_interval: DEFAULT_POLL_INTERVAL,
        seen: None,
    })
}

impl LeaderObserver {
    /// Reads the store at least this often when nothing wakes the observer (default
    /// [`DEFAULT_POLL_INTERVAL`]); a zero interval is taken as one millisecond.
    pub fn with_poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = every.max(Duration::from_millis(1));
        self
    }

    /// The role this observer watches.
    pub fn role(&self) -> &str {
        &self.role
    }

    /// The role's live leader right now (one read).
    pub async fn current(&self) -> Result<Option<Leader>> {
        Ok(self
            .store
            .get(&self.role)
            .await?
            .as_ref()
            .and_then(Leader::of))
    }

    /// The role's leader once it differs from what the last call returned: at once on
    /// the first call, then at each change of holder, token or value, and `None` when a
    /// term ends with nobody after it. A store error is returned as it is; calling again
    /// goes on from the last leader returned.
    pub async fn changed(&mut self) -> Result<Option<Leader>> {
        loop {
            let info = self.store.get(&self.role).await?;
            let leader = info.as_ref().and_then(Leader::of);
            if self.seen.as_ref() != Some(&leader) {
                self.seen = Some(leader.clone());
                return Ok(leader);
            }
            self.wait(info.as_ref(), leader.as_ref()).await;
        }
    }

    /// Waits for the store to say the lease moved on from `info`, or for the term to
    /// reach its expiry, or for the poll interval.
    async fn wait(&self, info: Option<&LeaseInfo>, leader: Option<&Leader>) {
        let poll = Instant::now() + self.poll_interval;
        match (info, leader) {
            (Some(info), Some(leader)) => {
                // A term that lapses unreleased pushes nothing: look again at its
                // expiry (the first look may find it renewed).
                let expiry = Instant::now() + info.remaining().max(Duration::from_millis(1));
                let deadline = poll.min(expiry);
                self.store
                    .wait_for_change(&self.role, leader.fencing_token, deadline)
                    .await;
            }
            (info, _) => {
                let after = info.map_or(FencingToken::from(0), |info| info.fencing_token);
                self.store.wait_for_term(&self.role, after, poll).await;
            }
        }
    }
}
