//! [`AdvisoryLockElector`]: leadership as a session advisory lock on one connection.
//!
//! The leader is whoever holds `pg_try_advisory_lock(key(role))` on a dedicated
//! connection; the lock lives exactly as long as that database session. Simpler than a
//! lease (no TTL to tune, no renewals) and the right default when a rare double run is
//! harmless.
//!
//! **Limits.**
//! - It cannot see a stalled leader: a process that is paused but whose connection stays
//!   open keeps the lock forever. Only a lease ([`tenure::LeaseLeaderElector`] over
//!   [`PgLeaseStore`](crate::PgLeaseStore)) bounds a term in time.
//! - A leader cut off from the database learns it only when its next liveness check
//!   fails (every `check_interval`, bounded by `check_timeout`), while the server may
//!   already have ended the session (on TCP keepalive or
//!   `idle_session_timeout`) and granted the lock to another: the two can overlap for
//!   up to about `check_interval + check_timeout`.
//! - It needs a real session: it does not work through transaction-mode poolers
//!   (PgBouncer `pool_mode = transaction`), where session locks are taken on whatever
//!   server connection happens to run the statement.
//! - Takeover after a release is noticed on the follower's next try (`retry_interval`);
//!   there is no push.
//!
//! Each term still gets a fencing token: a per-role counter in
//! `<schema>.tenure_advisory_terms`, incremented by the winner while it holds the lock,
//! so downstream fences reject a former leader's late writes.
//!
//! **Why a loop of its own, not [`tenure::LeaseLeaderElector`]'s.** That elector's loop
//! is built on a [`tenure::LeaseStore`]: a term there has a deadline it renews, a local
//! deadline it stops at, a queue it waits in and hand-offs. Here a term is a connection
//! that holds a lock: it has no deadline, nothing to renew, and ends when a liveness
//! check of that connection fails. Fitting it into the lease loop would need a store
//! whose every renewal is a check of one connection the store cannot hand between
//! calls. What the two share (the work's outcome and the state channel) is shared:
//! [`tenure::work_outcome`], [`ElectionState`].

use std::future::Future;
use std::time::Duration;

use sqlx::{Connection, PgConnection, PgPool};
use tenure::lease::validate_name;
use tenure::{work_outcome, ElectionState, Error, FencingToken, Result, WorkOutcome};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::error::pg_error;
use crate::lease::token_from_db;
use crate::schema::Schema;

/// Options of an [`AdvisoryLockElector`].
#[derive(Clone, Debug)]
pub struct AdvisoryLockOptions {
    /// How often a follower tries to take the lock. Default 2 s.
    pub retry_interval: Duration,
    /// How often the leader checks that its connection is alive. Default 5 s.
    pub check_interval: Duration,
    /// How long a liveness check may take before the connection counts as lost.
    /// Default 5 s.
    pub check_timeout: Duration,
}

impl Default for AdvisoryLockOptions {
    fn default() -> Self {
        AdvisoryLockOptions {
            retry_interval: Duration::from_secs(2),
            check_interval: Duration::from_secs(5),
            check_timeout: Duration::from_secs(5),
        }
    }
}

impl AdvisoryLockOptions {
    /// Checks the options; every interval must be greater than zero.
    pub fn validate(&self) -> Result<()> {
        for (field, value) in [
            ("retry_interval", self.retry_interval),
            ("check_interval", self.check_interval),
            ("check_timeout", self.check_timeout),
        ] {
            if value.is_zero() {
                return Err(Error::invalid(field, "must be greater than zero"));
            }
        }
        Ok(())
    }
}

/// Runs work while holding a session advisory lock for the role.
#[derive(Debug)]
pub struct AdvisoryLockElector {
    pool: PgPool,
    options: AdvisoryLockOptions,
    term_sql: String,
    state: watch::Sender<ElectionState>,
}

/// The advisory lock key of a role: a stable 64-bit FNV-1a hash of a tenure-specific
/// prefix and the role, so every process computes the same key.
pub fn advisory_key(role: &str) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in "tenure.advisory:".bytes().chain(role.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash as i64
}

enum TermEnd {
    Shutdown,
    WorkReturned(Result<()>),
    ConnectionLost,
}

impl AdvisoryLockElector {
    /// An elector taking dedicated connections from `pool` (each term holds one out of
    /// the pool for its whole length). Run [`migrate`](crate::migrate) first. Its
    /// tokens are as durable as the pool's commits: see
    /// [`durable_commit_options`](crate::durable_commit_options).
    pub fn new(pool: PgPool, schema: Schema, options: AdvisoryLockOptions) -> Result<Self> {
        options.validate()?;
        let terms = schema.table("tenure_advisory_terms");
        Ok(AdvisoryLockElector {
            pool,
            options,
            term_sql: format!(
                "INSERT INTO {terms} AS t (role, term) VALUES ($1, 1)
                 ON CONFLICT (role) DO UPDATE SET term = t.term + 1 RETURNING t.term"
            ),
            state: watch::Sender::new(ElectionState::Idle),
        })
    }

    /// A receiver of the elector's state.
    pub fn watch(&self) -> watch::Receiver<ElectionState> {
        self.state.subscribe()
    }

    /// Contends for `role` until `shutdown` fires or `work` returns while leader; the
    /// same shape as [`tenure::LeaseLeaderElector::run`]. `leadership` is cancelled when
    /// the connection holding the lock is lost or on shutdown. Store errors are logged
    /// and retried, never returned.
    pub async fn run<W, Fut>(
        &self,
        role: &str,
        mut work: W,
        shutdown: CancellationToken,
    ) -> Result<()>
    where
        W: FnMut(FencingToken, CancellationToken) -> Fut,
        Fut: Future + Send + 'static,
        Fut::Output: WorkOutcome,
    {
        validate_name("role", role)?;
        let key = advisory_key(role);
        let outcome = loop {
            self.state
                .send_replace(ElectionState::Follower { holder: None });
            let Some((conn, token)) = self.contend(role, key, &shutdown).await else {
                break Ok(());
            };
            match self
                .lead(role, key, conn, token, &mut work, &shutdown)
                .await
            {
                TermEnd::Shutdown => break Ok(()),
                TermEnd::WorkReturned(outcome) => break outcome,
                TermEnd::ConnectionLost => continue,
            }
        };
        self.state.send_replace(ElectionState::Idle);
        outcome
    }

    /// Tries to take the lock until it succeeds (returning the connection holding it
    /// and the term's token) or shutdown fires.
    async fn contend(
        &self,
        role: &str,
        key: i64,
        shutdown: &CancellationToken,
    ) -> Option<(PgConnection, FencingToken)> {
        loop {
            let attempt = async {
                // Detached: the lock must die with this connection, never go back to
                // the pool still held.
                let mut conn = self
                    .pool
                    .acquire()
                    .await
                    .map_err(|e| pg_error("could not connect for the advisory lock", e))?
                    .detach();
                let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                    .bind(key)
                    .fetch_one(&mut conn)
                    .await
                    .map_err(|e| pg_error("could not try the advisory lock", e))?;
                if !locked {
                    let _ = conn.close().await;
                    return Ok(None);
                }
                let term: i64 = sqlx::query_scalar(&self.term_sql)
                    .bind(role)
                    .fetch_one(&mut conn)
                    .await
                    .map_err(|e| pg_error("could not start the advisory term", e))?;
                Ok::<_, Error>(Some((conn, token_from_db(term)?)))
            };
            let result = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return None,
                result = tokio::time::timeout(self.options.retry_interval.max(self.options.check_timeout), attempt) => result,
            };
            match result {
                Ok(Ok(Some(won))) => return Some(won),
                Ok(Ok(None)) => debug!(role, "advisory lock held elsewhere; waiting"),
                Ok(Err(error)) => {
                    warn!(role, %error, "advisory lock attempt failed; retrying")
                }
                Err(_) => warn!(role, "advisory lock attempt timed out; retrying"),
            }
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return None,
                _ = tokio::time::sleep(self.options.retry_interval) => {}
            }
        }
    }

    async fn lead<W, Fut>(
        &self,
        role: &str,
        key: i64,
        mut conn: PgConnection,
        token: FencingToken,
        work: &mut W,
        shutdown: &CancellationToken,
    ) -> TermEnd
    where
        W: FnMut(FencingToken, CancellationToken) -> Fut,
        Fut: Future + Send + 'static,
        Fut::Output: WorkOutcome,
    {
        info!(role, token = %token, "elected (advisory lock)");
        self.state.send_replace(ElectionState::Leader {
            fencing_token: token,
        });
        let leadership = CancellationToken::new();
        let mut task = tokio::spawn(work(token, leadership.clone()));
        let mut ticker = tokio::time::interval(self.options.check_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        let end = loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => {
                    leadership.cancel();
                    if let Err(error) = work_outcome(task.await) {
                        warn!(role, token = %token, %error, "leader work failed after shutdown");
                    }
                    break TermEnd::Shutdown;
                }
                joined = &mut task => {
                    leadership.cancel();
                    break TermEnd::WorkReturned(work_outcome(joined));
                }
                _ = ticker.tick() => {
                    let check = tokio::time::timeout(self.options.check_timeout, conn.ping()).await;
                    match check {
                        Ok(Ok(())) => continue,
                        Ok(Err(error)) => {
                            warn!(role, token = %token, %error, "advisory lock connection lost; leadership lost");
                        }
                        Err(_) => {
                            warn!(role, token = %token, "advisory lock connection did not answer; leadership lost");
                        }
                    }
                    leadership.cancel();
                    if let Err(error) = work_outcome(task.await) {
                        warn!(role, token = %token, %error, "leader work failed after leadership ended");
                    }
                    // Dropping the connection closes it; the server then frees the lock.
                    return TermEnd::ConnectionLost;
                }
            }
        };
        // Unlock explicitly so a successor need not wait for the server to notice the
        // closed socket; closing the connection frees it in any case.
        let unlock = async {
            let _ = sqlx::query("SELECT pg_advisory_unlock($1)")
                .bind(key)
                .execute(&mut conn)
                .await;
            let _ = conn.close().await;
        };
        if tokio::time::timeout(self.options.check_timeout, unlock)
            .await
            .is_err()
        {
            warn!(role, token = %token, "advisory unlock timed out; the lock ends with the connection");
        } else {
            info!(role, token = %token, "released (advisory lock)");
        }
        end
    }
}
