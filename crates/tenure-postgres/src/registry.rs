//! [`PgNodeRegistry`]: heartbeat membership on PostgreSQL, judged on the database clock.
//!
//! A heartbeat is one upsert stamped with `statement_timestamp()`; liveness
//! (`now < last_heartbeat + ttl`) is evaluated by the database in the same statement
//! that reads it, so hosts' clocks never matter. Metadata is stored as `jsonb`. A join (a
//! node's first heartbeat, or its first after it lapsed) and a leave send `NOTIFY` on the
//! schema's membership channel in the same statement, for membership waiters.
//!
//! **Membership through a session.** A registry made from a store
//! ([`PgLeaseStore::registry`](crate::PgLeaseStore::registry)) shares the store's
//! [`SessionLinks`]. A node that holds an open session of that store (the node id is the
//! session's owner, as for a shard group's member) names it in its heartbeat
//! (`tenure_nodes.session_id`), and every reader counts the session's last keep-alive
//! (`tenure_sessions.kept_at`, on the database clock) as a heartbeat of the node while
//! the session is open (`expires_at` in the future) and held by the node: the node's
//! last heartbeat is the later of its own and that keep-alive. The registry then skips
//! its own heartbeat write while the store's last keep-alive of that session was sent
//! less than half the TTL ago and found the node's row naming the session, so one write
//! per interval (the keep-alive) keeps both. When keep-alives stop, the node's own
//! heartbeats resume at the first beat past half a TTL, before any reader sees it lapse
//! (see `docs/semantics.md`). A closed session stops counting at once, and its close
//! tells membership waiters; a leave deletes the row at once, as before.
//!
//! **Waits without a read.** A wait for a change of the members re-reads them after
//! subscribing, so that a change between the caller's read and the wait is not missed.
//! When the caller's observation is what this registry's last read showed, and the
//! listener heard no notification since that read began (same subscription, same
//! count), nothing committed after the read's snapshot can have gone unheard: the wait
//! skips its read. A shard member waits after every read of the members, so this saves
//! a statement per read.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::{PgPool, Row};
use tenure::lease::validate_name;
use tenure::registry::{validate_heartbeat, LastRead};
use tenure::session::HeartbeatsWritten;
use tenure::{Error, Metadata, NodeInfo, NodeRegistry, Result};
use tokio::time::Instant;

use crate::direct::DirectConnections;
use crate::error::{pg_error, BACKEND};
use crate::lease::{system_time, MAX_TTL};
use crate::links::SessionLinks;
use crate::notify::{Mark, Notifier};
use crate::schema::Schema;

/// A [`NodeRegistry`] on PostgreSQL.
///
/// Needs `SELECT, INSERT, UPDATE, DELETE` on `<schema>.tenure_nodes` and `SELECT` on
/// `<schema>.tenure_sessions`. Heartbeats keep the connections they run on, as
/// [`PgLeaseStore`](crate::PgLeaseStore) does. Made by
/// [`PgLeaseStore::registry`](crate::PgLeaseStore::registry), it counts that store's
/// session keep-alives as heartbeats (see the module docs).
#[derive(Clone, Debug)]
pub struct PgNodeRegistry {
    pool: PgPool,
    /// Heartbeats: one statement each, on the registry's own connections.
    direct: Arc<DirectConnections>,
    /// Joins and leaves, pushed to [`NodeRegistry::wait_for_members_change`].
    notifier: Arc<Notifier>,
    channel: String,
    ttl: Duration,
    ttl_micros: i64,
    heartbeat_sql: String,
    live_sql: String,
    members_sql: String,
    leave_sql: String,
    /// The sessions a store keeps alive, by owner (no store's, for [`PgNodeRegistry::new`]).
    links: Arc<SessionLinks>,
    /// What this registry's last successful heartbeat of each node wrote.
    written: Arc<HeartbeatsWritten>,
    /// The live nodes the last read showed, with the listener's mark taken before it:
    /// a wait for a change of those needs no read of its own while nothing was notified
    /// since (a member's wait after each read of the members).
    last_read: Arc<LastRead<Mark>>,
}

impl PgNodeRegistry {
    /// A registry over `pool` in `schema`, where a node is live for `ttl` after its
    /// last heartbeat. It counts no store's keep-alives as heartbeats (a node's row
    /// names no session); [`PgLeaseStore::registry`](crate::PgLeaseStore::registry)
    /// makes one that does.
    pub fn new(pool: PgPool, schema: Schema, ttl: Duration) -> Result<PgNodeRegistry> {
        PgNodeRegistry::linked(pool, schema, ttl, Arc::default())
    }

    /// A registry as [`new`](Self::new) makes, counting the keep-alives of the sessions
    /// in `links` as heartbeats of their owners.
    pub(crate) fn linked(
        pool: PgPool,
        schema: Schema,
        ttl: Duration,
        links: Arc<SessionLinks>,
    ) -> Result<PgNodeRegistry> {
        if ttl.is_zero() {
            return Err(Error::invalid("ttl", "must be greater than zero"));
        }
        if ttl > MAX_TTL {
            return Err(Error::invalid(
                "ttl",
                format!("{ttl:?} is too large: at most {MAX_TTL:?}"),
            ));
        }
        let ttl_micros = i64::try_from(ttl.as_nanos().div_ceil(1_000))
            .map_err(|_| Error::invalid("ttl", "is too large"))?;
        links.registry_made(ttl);
        let t = schema.table("tenure_nodes");
        let sessions = schema.table("tenure_sessions");
        let heard = heard_sql(&sessions);
        let live = live_sql(&sessions);
        let channel = schema.members_channel();
        Ok(PgNodeRegistry {
            direct: Arc::new(DirectConnections::for_pool(&pool)),
            notifier: Arc::new(Notifier::new(pool.clone(), channel.clone())),
            channel,
            pool,
            ttl,
            ttl_micros,
            // A node whose last heartbeat lapsed starts a new membership: first_seen
            // restarts. Metadata is replaced only when given ($3 not null).
            heartbeat_sql: heartbeat_statement(&t, &sessions),
            live_sql: format!(
                "SELECT node_id FROM {t} n WHERE {live} ORDER BY node_id COLLATE \"C\""
            ),
            members_sql: format!(
                "SELECT node_id, first_seen, last_heartbeat, metadata::text AS metadata, now
                 FROM (SELECT node_id, first_seen, {heard} AS last_heartbeat, metadata,
                         statement_timestamp() AS now
                     FROM {t} n) n
                 WHERE n.last_heartbeat + $1 * interval '1 microsecond' > n.now
                 ORDER BY node_id COLLATE \"C\""
            ),
            leave_sql: format!(
                "WITH gone AS (DELETE FROM {t} n WHERE node_id = $2 RETURNING {live} AS was_live),
                     told AS (SELECT pg_notify($3, '') FROM gone WHERE was_live)
                 SELECT COALESCE((SELECT bool_or(was_live) FROM gone), false),
                     (SELECT count(*) FROM told)"
            ),
            links,
            written: Arc::default(),
            last_read: Arc::default(),
        })
    }

    /// Creates the schema and tables if missing; see [`migrate`](crate::migrate).
    pub async fn migrate(&self, schema: &Schema) -> Result<()> {
        crate::schema::migrate(&self.pool, schema).await
    }

    async fn record(&self, node_id: &str, metadata: Option<&Metadata>) -> Result<()> {
        validate_heartbeat(node_id, metadata)?;
        let json = metadata
            .map(serde_json::to_string)
            .transpose()
            .map_err(|e| Error::store(BACKEND, "could not encode metadata", e))?;
        // Only a session whose id the database could have handed out is named.
        let link = self
            .links
            .of(node_id)
            .filter(|link| i64::try_from(link.id).is_ok());
        // Skipped while the store's keep-alive stood in for it and was sent less than
        // half the TTL ago: when keep-alives stop, the node's own heartbeats resume
        // before any reader sees it lapse.
        if let Some(link) = link {
            if self.written.stood_in(node_id, json.as_deref(), &link)
                && Instant::now() < link.kept + self.ttl / 2
            {
                return Ok(());
            }
        }
        let session = link.and_then(|link| i64::try_from(link.id).ok());
        const WHAT: &str = "could not record the heartbeat";
        let query = sqlx::query(&self.heartbeat_sql)
            .bind(self.ttl_micros)
            .bind(node_id)
            .bind(json.clone())
            .bind(&self.channel)
            .bind(session);
        match self.direct.execute(WHAT, query).await {
            Ok(()) => {
                self.written.wrote(node_id, link.map(|link| link.id), json);
                Ok(())
            }
            Err(error) => {
                // Unknown whether it was written: the next heartbeat writes.
                self.written.forget(node_id);
                Err(error)
            }
        }
    }
}

#[async_trait]
impl NodeRegistry for PgNodeRegistry {
    async fn record_heartbeat(&self, node_id: &str, metadata: Option<&Metadata>) -> Result<()> {
        self.record(node_id, metadata).await
    }

    async fn live_nodes(&self) -> Result<Vec<String>> {
        let mark = self.notifier.mark();
        let live: Vec<String> = sqlx::query_scalar(&self.live_sql)
            .bind(self.ttl_micros)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| pg_error("could not read live nodes", e))?;
        self.last_read.remember(mark, live.clone());
        Ok(live)
    }

    async fn members(&self) -> Result<Vec<NodeInfo>> {
        let mark = self.notifier.mark();
        let rows = sqlx::query(&self.members_sql)
            .bind(self.ttl_micros)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| pg_error("could not read members", e))?;
        let members: Vec<NodeInfo> = rows
            .iter()
            .map(|row| {
                let get = |e| pg_error("could not decode a member", e);
                let metadata: String = row.try_get("metadata").map_err(get)?;
                Ok(NodeInfo {
                    node_id: row.try_get("node_id").map_err(get)?,
                    first_seen: system_time(row.try_get("first_seen").map_err(get)?),
                    last_heartbeat: system_time(row.try_get("last_heartbeat").map_err(get)?),
                    metadata: serde_json::from_str(&metadata).map_err(|e| {
                        Error::store(BACKEND, "member metadata is not a string map", e)
                    })?,
                    now: system_time(row.try_get("now").map_err(get)?),
                })
            })
            .collect::<Result<_>>()?;
        self.last_read
            .remember(mark, members.iter().map(|m| m.node_id.clone()).collect());
        Ok(members)
    }

    async fn leave(&self, node_id: &str) -> Result<bool> {
        validate_name("node_id", node_id)?;
        // Gone: a heartbeat after the leave writes, whatever keeps a session alive.
        self.written.forget(node_id);
        sqlx::query_scalar(&self.leave_sql)
            .bind(self.ttl_micros)
            .bind(node_id)
            .bind(&self.channel)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| pg_error("could not remove the node", e))
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    async fn wait_for_members_change(&self, observed: &[String], deadline: Instant) {
        let since = self.last_read.since(observed);
        let unchanged = async { Ok(self.live_nodes().await? == observed) };
        self.notifier
            .wait(deadline, since, unchanged, |_| true)
            .await;
    }
}

/// When node row `n` was last heard of: its own last heartbeat, or the last keep-alive
/// (`kept_at`) of the session it names in session table `sessions`, while that session
/// is open and held by the node, whichever is later. A closed session's expiry is its
/// close; a forgotten one has no row: neither counts. A row naming no session (every
/// node of a registry made by [`PgNodeRegistry::new`], and long-gone nodes) reads no
/// session row: `CASE` evaluates the lookup only for a row that names one.
pub(crate) fn heard_sql(sessions: &str) -> String {
    format!(
        "CASE WHEN n.session_id IS NULL THEN n.last_heartbeat ELSE
            GREATEST(n.last_heartbeat, (SELECT s.kept_at FROM {sessions} s
                WHERE s.id = n.session_id AND s.owner = n.node_id
                    AND s.expires_at > statement_timestamp())) END"
    )
}

/// A node is live while it was last heard of within the TTL ($1, in microseconds).
fn live_sql(sessions: &str) -> String {
    format!(
        "{} + $1 * interval '1 microsecond' > statement_timestamp()",
        heard_sql(sessions)
    )
}

/// The heartbeat upsert on node table `t` (a quoted, qualified name; `sessions` the
/// session table): a node not live (see [`live_sql`]) starts a new membership
/// (first_seen restarts); metadata is replaced only when given ($3 not null); a join (a
/// new membership) is announced on channel $4; the row names session $5 (NULL for none)
/// as keeping it alive. Public only so the benchmark issues exactly the registry's
/// statement.
#[doc(hidden)]
pub fn heartbeat_statement(t: &str, sessions: &str) -> String {
    let live = live_sql(sessions);
    format!(
                "WITH up AS (
                     INSERT INTO {t} AS n (node_id, first_seen, last_heartbeat, metadata, session_id)
                     VALUES ($2, statement_timestamp(), statement_timestamp(), COALESCE($3::jsonb, '{{}}'), $5)
                     ON CONFLICT (node_id) DO UPDATE SET
                         first_seen = CASE WHEN {live} THEN n.first_seen ELSE statement_timestamp() END,
                         last_heartbeat = GREATEST(n.last_heartbeat, statement_timestamp()),
                         metadata = COALESCE($3::jsonb, n.metadata),
                         session_id = $5
                     RETURNING n.first_seen = statement_timestamp() AS joined
                 )
                 SELECT count(*) FROM (SELECT pg_notify($4, '') FROM up WHERE up.joined) n"
            )
}
