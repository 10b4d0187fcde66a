//! [`PgNodeRegistry`]: heartbeat membership on PostgreSQL, judged on the database clock.
//!
//! A heartbeat is one upsert stamped with `statement_timestamp()`; liveness
//! (`now < last_heartbeat + ttl`) is evaluated by the database in the same statement
//! that reads it, so hosts' clocks never matter. Metadata is stored as `jsonb`. A join (a
//! node's first heartbeat, or its first after it lapsed) and a leave send `NOTIFY` on the
//! schema's membership channel in the same statement, for membership waiters.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::{PgPool, Row};
use tenure::lease::validate_name;
use tenure::registry::validate_heartbeat;
use tenure::{Error, Metadata, NodeInfo, NodeRegistry, Result};
use tokio::time::Instant;

use crate::direct::DirectConnections;
use crate::error::{pg_error, BACKEND};
use crate::lease::{system_time, MAX_TTL};
use crate::notify::Notifier;
use crate::schema::Schema;

/// A [`NodeRegistry`] on PostgreSQL.
///
/// Needs `SELECT, INSERT, UPDATE, DELETE` on `<schema>.tenure_nodes`. Heartbeats keep
/// the connections they run on, as [`PgLeaseStore`](crate::PgLeaseStore) does.
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
}

impl PgNodeRegistry {
    /// A registry over `pool` in `schema`, where a node is live for `ttl` after its
    /// last heartbeat.
    pub fn new(pool: PgPool, schema: Schema, ttl: Duration) -> Result<PgNodeRegistry> {
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
        let t = schema.table("tenure_nodes");
        let live = LIVE;
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
            heartbeat_sql: heartbeat_statement(&t),
            live_sql: format!(
                "SELECT node_id FROM {t} n WHERE {live} ORDER BY node_id COLLATE \"C\""
            ),
            members_sql: format!(
                "SELECT node_id, first_seen, last_heartbeat, metadata::text AS metadata,
                     statement_timestamp() AS now
                 FROM {t} n WHERE {live} ORDER BY node_id COLLATE \"C\""
            ),
            leave_sql: format!(
                "WITH gone AS (DELETE FROM {t} n WHERE node_id = $2 RETURNING {live} AS was_live),
                     told AS (SELECT pg_notify($3, '') FROM gone WHERE was_live)
                 SELECT COALESCE((SELECT bool_or(was_live) FROM gone), false),
                     (SELECT count(*) FROM told)"
            ),
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
        const WHAT: &str = "could not record the heartbeat";
        let query = sqlx::query(&self.heartbeat_sql)
            .bind(self.ttl_micros)
            .bind(node_id)
            .bind(json)
            .bind(&self.channel);
        self.direct.execute(WHAT, query).await
    }
}

#[async_trait]
impl NodeRegistry for PgNodeRegistry {
    async fn heartbeat(&self, node_id: &str) -> Result<()> {
        self.record(node_id, None).await
    }

    async fn heartbeat_with(&self, node_id: &str, metadata: &Metadata) -> Result<()> {
        self.record(node_id, Some(metadata)).await
    }

    async fn live_nodes(&self) -> Result<Vec<String>> {
        sqlx::query_scalar(&self.live_sql)
            .bind(self.ttl_micros)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| pg_error("could not read live nodes", e))
    }

    async fn members(&self) -> Result<Vec<NodeInfo>> {
        let rows = sqlx::query(&self.members_sql)
            .bind(self.ttl_micros)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| pg_error("could not read members", e))?;
        rows.iter()
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
            .collect()
    }

    async fn leave(&self, node_id: &str) -> Result<bool> {
        validate_name("node_id", node_id)?;
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
        let unchanged = async { Ok(self.live_nodes().await? == observed) };
        self.notifier.wait(deadline, unchanged, |_| true).await;
    }
}

/// A node is live while its last heartbeat is within the TTL ($1, in microseconds).
const LIVE: &str = "n.last_heartbeat + $1 * interval '1 microsecond' > statement_timestamp()";

/// The heartbeat upsert on node table `t` (a quoted, qualified name): a node whose last
/// heartbeat lapsed starts a new membership (first_seen restarts); metadata is replaced
/// only when given ($3 not null); a join (a new membership) is announced on channel $4.
/// Public only so the benchmark issues exactly the registry's statement.
#[doc(hidden)]
pub fn heartbeat_statement(t: &str) -> String {
    let live = LIVE;
    format!(
                "WITH up AS (
                     INSERT INTO {t} AS n (node_id, first_seen, last_heartbeat, metadata)
                     VALUES ($2, statement_timestamp(), statement_timestamp(), COALESCE($3::jsonb, '{{}}'))
                     ON CONFLICT (node_id) DO UPDATE SET
                         first_seen = CASE WHEN {live} THEN n.first_seen ELSE statement_timestamp() END,
                         last_heartbeat = GREATEST(n.last_heartbeat, statement_timestamp()),
                         metadata = COALESCE($3::jsonb, n.metadata)
                     RETURNING n.first_seen = statement_timestamp() AS joined
                 )
                 SELECT count(*) FROM (SELECT pg_notify($4, '') FROM up WHERE up.joined) n"
            )
}
