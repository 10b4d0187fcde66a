//! Which session keeps which node alive: what a [`PgLeaseStore`](crate::PgLeaseStore)
//! and the [`PgNodeRegistry`](crate::PgNodeRegistry) made from it share.
//!
//! A shard group's member writes two things every interval: its session's keep-alive
//! (the store) and its membership heartbeat (the registry). Here the keep-alive serves
//! as the heartbeat: a heartbeat names the owner's open session
//! (`tenure_nodes.session_id`), every reader counts that session's last keep-alive
//! (`tenure_sessions.kept_at`) as a heartbeat of the node while the session is open and
//! held by the node, and the registry skips its own write while the store keeps that
//! session alive (see `registry.rs`). The store tells the registry here when it last
//! kept which owner's session alive, and whether the keep-alive found the owner's node
//! row naming the session.

/// The open sessions of the stores sharing one set of links, by owner.
pub(crate) type SessionLinks = tenure::session::SessionLinks<tokio::time::Instant>;
