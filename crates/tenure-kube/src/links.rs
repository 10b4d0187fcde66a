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

use std::collections::HashMap;

use parking_lot::Mutex;
use tokio::time::Instant;

/// An owner's open session, as its store last kept it alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Link {
    /// The session id.
    pub id: u64,
    /// When the last successful write of the session object (open or keep-alive) was
    /// sent, on this process's monotonic clock.
    pub kept: Instant,
}

/// The open sessions of the stores made from one connection, by owner.
#[derive(Debug, Default)]
pub(crate) struct SessionLinks {
    by_owner: Mutex<HashMap<String, Link>>,
}

impl SessionLinks {
    /// Session `id` of `owner` was written (opened or kept alive) by a request sent at
    /// `sent`. A newer session of the same owner replaces an older one.
    pub fn kept(&self, owner: &str, id: u64, sent: Instant) {
        let mut links = self.by_owner.lock();
        match links.get_mut(owner) {
            Some(link) if link.id == id => link.kept = link.kept.max(sent),
            Some(link) if link.id > id => {}
            _ => {
                links.insert(owner.to_owned(), Link { id, kept: sent });
            }
        }
    }

    /// Session `id` ended: it keeps nobody alive any more.
    pub fn ended(&self, id: u64) {
        self.by_owner.lock().retain(|_, link| link.id != id);
    }

    /// `owner`'s open session, if a store of this connection keeps one alive.
    pub fn of(&self, owner: &str) -> Option<Link> {
        self.by_owner.lock().get(owner).copied()
    }
}
