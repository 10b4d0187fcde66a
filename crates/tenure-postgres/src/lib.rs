//! # tenure-postgres: durable shared leases, membership and fenced transactions
//!
//! The PostgreSQL backend of [tenure]: leadership across machines with the
//! database clock as the single arbiter.
//!
//! - [`PgLeaseStore`]: the [`LeaseStore`](tenure::LeaseStore) contract, one autocommit
//!   statement per operation, expiry on `statement_timestamp()`, push-based takeover
//!   through LISTEN/NOTIFY (one listener connection per store, shared by every waiter,
//!   observers of a role with no live holder too), a term's advertised value written
//!   by the statement that starts the term (the `value` column of `tenure_leases`),
//!   sessions (many roles held under one row kept alive with one `UPDATE`), and a
//!   queue of candidates per role (`tenure_candidates`: a release hands the role to
//!   the oldest live candidate in the statement that ends the term, and the
//!   notification names the successor, so waiting contenders read nothing).
//! - [`PgNodeRegistry`]: heartbeat membership on database time, metadata as `jsonb`.
//!   One made from a store ([`PgLeaseStore::registry`], as [`connect`] does) counts the
//!   store's session keep-alives as heartbeats of the session's owner and skips its own
//!   heartbeat writes meanwhile, so a shard group's member writes once per interval.
//! - [`PgFence`]: fenced transactions inside the caller's own transaction, and the
//!   [`FenceStore`](tenure::FenceStore) the CLI uses.
//! - [`AdvisoryLockElector`]: the connection-bound elector (a session advisory lock),
//!   simpler but blind to a stalled leader.
//!
//! Everything runs over the caller's own [`sqlx::PgPool`]; [`connect`] builds one from a
//! `postgres://` URL for the CLI.
//!
//! ## Automated: the elector over a PostgreSQL lease
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), tenure::Error> {
//! use std::sync::Arc;
//! use tenure::{LeaseLeaderElector, LeaseLeaderOptions};
//! use tenure_postgres::{PgLeaseStore, Schema};
//! use tokio_util::sync::CancellationToken;
//!
//! let store = PgLeaseStore::new(pool, Schema::default());
//! store.migrate().await?;
//! let elector = LeaseLeaderElector::new(Arc::new(store), LeaseLeaderOptions::default())?;
//! elector
//!     .run("reports", |token, leadership| async move {
//!         // ... work stamped with `token`, stopping when `leadership` is cancelled ...
//!         leadership.cancelled().await;
//!     }, CancellationToken::new())
//!     .await
//! # }
//! ```
//!
//! ## Manual: the raw store and a fenced transaction
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tenure::LeaseStore;
//! use tenure_postgres::{PgFence, PgLeaseStore, Schema};
//!
//! let store = PgLeaseStore::new(pool.clone(), Schema::default());
//! let fence = PgFence::new(pool.clone(), Schema::default());
//! let lease = store.try_acquire_or_renew("reports", "node-a", Duration::from_secs(15)).await?;
//! if lease.acquired {
//!     let mut tx = pool.begin().await?;
//!     fence.fence_in_transaction(&mut tx, "report-table", lease.fencing_token).await?;
//!     sqlx::query("UPDATE reports SET done = true").execute(&mut *tx).await?;
//!     tx.commit().await?;
//!     store.release("reports", "node-a", lease.fencing_token).await?;
//! }
//! # Ok(()) }
//! ```
//!
//! ## Requirements
//!
//! - **Durability.** Tokens are only as durable as the commit: with
//!   `synchronous_commit = off` a crash can forget a handed-out token and hand it out
//!   again. [`connect`]'s connections never commit with `off` (it is raised to `on`,
//!   with a warning); a pool passed to [`PgLeaseStore::new`] must not use it either. Use
//!   synchronous replication if the database can fail over to a replica, for the same
//!   reason.
//! - **Isolation.** tenure's statements run at READ COMMITTED (the default). Fenced
//!   transactions refuse REPEATABLE READ and SERIALIZABLE.
//! - **Privileges.** [`migrate`] needs `CREATE` on the database (or an existing schema
//!   the role may create tables in). At run time the role needs `SELECT, INSERT, UPDATE`
//!   on `tenure_leases`, `tenure_sessions`, `tenure_fences` and `tenure_advisory_terms`,
//!   and additionally `DELETE` on `tenure_nodes` and `tenure_candidates`, all in the
//!   configured schema (default `tenure`).
//! - **Poolers.** Leases and fences work through any pooler; LISTEN/NOTIFY and the
//!   advisory-lock elector need session pooling (not PgBouncer transaction mode).
#![deny(missing_docs)]

mod advisory;
mod direct;
mod error;
mod fence;
mod lease;
mod links;
mod notify;
mod queue;
mod registry;
mod schema;
mod session;
mod succession;
mod url;

use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tenure::{Error, Result};

pub use advisory::{advisory_key, AdvisoryLockElector, AdvisoryLockOptions};
pub use fence::PgFence;
pub use lease::{PgLeaseStore, MAX_TTL, MIN_TTL};
pub use registry::PgNodeRegistry;
pub use schema::{migrate, Schema, DEFAULT_SCHEMA, MAX_SCHEMA_LEN};
pub use url::connect_options;

/// The store's SQL statements, for `tenure bench`'s raw baseline only; not a supported
/// API, it changes with the store. It stays public (hidden) because the baseline must
/// issue the store's statement text on a plain connection: a copy in the bench would
/// drift from the store it is meant to measure.
#[doc(hidden)]
pub mod statements {
    pub use crate::lease::{acquire_statement, release_statement};
    pub use crate::registry::heartbeat_statement;
    pub use crate::session::keep_alive_statement;
}

use crate::error::pg_error_scrubbed;
use crate::url::url_secrets;

/// How [`connect`] builds the pool and the stores.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// The schema holding tenure's tables. Default `tenure`.
    pub schema: String,
    /// The liveness TTL of the node registry. Default 15 s.
    pub registry_ttl: Duration,
    /// The pool's size. Default 8. A session's keep-alive may use one connection more
    /// when all of these are busy, so that a member's own calls never lapse its session.
    pub max_connections: u32,
    /// How long to wait for a connection. Default 10 s.
    pub connect_timeout: Duration,
    /// Whether to run [`migrate`] after connecting. Default true.
    pub migrate: bool,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            schema: DEFAULT_SCHEMA.to_owned(),
            registry_ttl: Duration::from_secs(15),
            max_connections: 8,
            connect_timeout: Duration::from_secs(10),
            migrate: true,
        }
    }
}

/// Everything [`connect`] opens over one pool.
#[derive(Clone, Debug)]
pub struct PgBackend {
    /// The pool (also usable for the caller's own fenced transactions).
    pub pool: PgPool,
    /// The lease store.
    pub leases: PgLeaseStore,
    /// The node registry, made from `leases` ([`PgLeaseStore::registry`]): a node that
    /// holds a session of `leases` is kept alive by its keep-alives.
    pub registry: PgNodeRegistry,
    /// The fences.
    pub fence: PgFence,
}

/// Connects to `url` (`postgres://user:password@host:port/db?...`), checks that the
/// server answers, optionally migrates, and returns the stores.
///
/// The URL is checked first by [`connect_options`] (so a query parameter sqlx does not
/// know is refused rather than logged). Errors never contain the URL or its password.
pub async fn connect(url: &str, options: ConnectOptions) -> Result<PgBackend> {
    let schema = Schema::new(&options.schema)?;
    if options.max_connections == 0 {
        return Err(Error::invalid(
            "max_connections",
            "must be greater than zero",
        ));
    }
    let mut connect_options = connect_options(url)?;
    let secrets = url_secrets(url);
    // One direct connection first: a pool that cannot connect only says it timed out,
    // while this names the server and the real cause (refused, bad password, ...).
    let endpoint = format!(
        "{}:{}",
        connect_options.get_host(),
        connect_options.get_port()
    );
    // It also reads whether commits must be made durable (`raised_commit`), within the
    // same time limit: a server that accepts and then stalls must not hang `connect`.
    match tokio::time::timeout(options.connect_timeout, probe(&connect_options)).await {
        Ok(Ok(raise)) => connect_options = with_commit(connect_options, raise),
        Ok(Err(e)) => {
            return Err(pg_error_scrubbed(
                &format!("could not connect to {endpoint}"),
                e,
                &secrets,
            ))
        }
        Err(_) => {
            return Err(Error::store_msg(
                crate::error::BACKEND,
                format!(
                    "could not connect to {endpoint}: no answer within {:?}",
                    options.connect_timeout
                ),
            ))
        }
    }
    let pool = PgPoolOptions::new()
        .max_connections(options.max_connections)
        .acquire_timeout(options.connect_timeout)
        // Each store call is one statement: a ping before every checkout would double
        // its round trips. A broken connection fails that statement instead, and the
        // elector retries.
        .test_before_acquire(false)
        .connect_with(connect_options)
        .await
        .map_err(|e| pg_error_scrubbed("could not connect to the database", e, &secrets))?;
    let leases = PgLeaseStore::new(pool.clone(), schema.clone());
    // The registry counts the store's session keep-alives as heartbeats.
    let registry = leases.registry(options.registry_ttl)?;
    let backend = PgBackend {
        leases,
        fence: PgFence::new(pool.clone(), schema.clone()),
        registry,
        pool,
    };
    if options.migrate {
        migrate(&backend.pool, &schema).await?;
    }
    Ok(backend)
}

/// `options` as [`connect`] sets them for its pool: where the server's
/// `synchronous_commit` for the role and database they reach is `off` (read over one
/// connection of their own, closed before returning), with `synchronous_commit = on`
/// in their startup options; otherwise unchanged. For a pool made by the caller and
/// passed to [`PgLeaseStore::new`], [`PgFence::new`] or [`PgNodeRegistry::new`]. An
/// error is the probe connection's. The probe has no time limit of its own: bound the
/// call with a timeout where the server may not answer (dropping the future closes the
/// probe).
pub async fn durable_commit_options(
    options: sqlx::postgres::PgConnectOptions,
) -> Result<sqlx::postgres::PgConnectOptions> {
    let raise = probe(&options)
        .await
        .map_err(|e| pg_error_scrubbed("could not read synchronous_commit", e, &[]))?;
    Ok(with_commit(options, raise))
}

/// One connection with `options`: whether `synchronous_commit` must be raised
/// ([`raised_commit`]); closed before returning.
async fn probe(options: &sqlx::postgres::PgConnectOptions) -> sqlx::Result<Option<&'static str>> {
    let mut conn: sqlx::PgConnection = sqlx::Connection::connect_with(options).await?;
    let raise = raised_commit(&mut conn).await;
    let _ = sqlx::Connection::close(conn).await;
    raise
}

/// `Some("on")` when the connection's `synchronous_commit` is `off`, else `None`.
///
/// With `off` the server acknowledges a commit before its WAL record is written, and a
/// crash then forgets a term it acknowledged: the next holder is handed the same token
/// (`a_term_acknowledged_before_a_crash_survives_asynchronous_commit`). Every other
/// value writes the record locally before the answer and is left alone (`on`,
/// `remote_write` and `remote_apply` also wait for synchronous standbys). Only a raise
/// is written into the startup options, so a server that commits durably sees the same
/// connections as before (a pooler that refuses unknown startup parameters among them).
async fn raised_commit(probe: &mut sqlx::PgConnection) -> sqlx::Result<Option<&'static str>> {
    let setting: String = sqlx::query_scalar("SELECT current_setting('synchronous_commit')")
        .fetch_one(probe)
        .await?;
    if setting != "off" {
        return Ok(None);
    }
    tracing::warn!(
        "synchronous_commit is off for this role and database, which can forget a term \
         the server acknowledged in a crash; tenure's connections use on"
    );
    Ok(Some("on"))
}

/// `options` with `synchronous_commit` set to `raise`, if any.
fn with_commit(
    options: sqlx::postgres::PgConnectOptions,
    raise: Option<&str>,
) -> sqlx::postgres::PgConnectOptions {
    match raise {
        Some(value) => options.options([("synchronous_commit", value)]),
        None => options,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_checked() {
        assert!(Schema::new("tenure_1").is_ok());
        for bad in ["", "1abc", "a-b", "a\"b", "pg_x", "a b", &"x".repeat(49)] {
            assert!(
                matches!(
                    Schema::new(bad),
                    Err(Error::InvalidArgument {
                        field: "schema",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn advisory_keys_are_stable() {
        assert_eq!(advisory_key("reports"), advisory_key("reports"));
        assert_ne!(advisory_key("reports"), advisory_key("reports2"));
    }
}
