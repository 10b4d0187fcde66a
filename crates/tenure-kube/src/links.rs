//! Which session keeps which member alive: what a store and a registry made from one
//! [`KubeConnection`](crate::KubeConnection) share.
//!
//! A shard group's member writes two things every interval: its session's keep-alive
//! (the store) and its membership heartbeat (the registry). On Kubernetes both are Lease
//! objects judged the same way, by watching their version change, so the keep-alive can
//! serve as the heartbeat: the member's object names the session
//! (`tenure.dev/heartbeat-session`), readers count a sighting of that session's newer
//! version as a heartbeat of the member, and the registry skips a heartbeat write while
//! the store keeps that session alive. The store tells the registry here when it last
//! kept which owner's session alive.

/// An owner's open session as its store last kept it alive.
pub(crate) type Link = tenure::session::SessionLink<tokio::time::Instant>;

/// The open sessions of the stores sharing one set of links, by owner.
pub(crate) type SessionLinks = tenure::session::SessionLinks<tokio::time::Instant>;
