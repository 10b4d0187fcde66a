//! Which session keeps which node alive: what the
//! [`SqliteLeaseStore`](crate::SqliteLeaseStore) and the
//! [`SqliteNodeRegistry`](crate::SqliteNodeRegistry) made from one
//! [`SqliteDatabase`](crate::SqliteDatabase) share.
//!
//! A shard group's member writes two things every interval: its session's keep-alive
//! (the store) and its membership heartbeat (the registry), each a write transaction on
//! the file. Here the keep-alive serves as the heartbeat: a heartbeat names the owner's
//! open session (`tenure_nodes.session_id`), every reader counts that session's last
//! keep-alive (`tenure_sessions.kept_at`) as a heartbeat of the node while the session
//! is open and held by the node, and the registry skips its own write while the store
//! keeps that session alive (see `registry.rs`). The store tells the registry here when
//! it last kept which owner's session alive, and whether the keep-alive found the
//! owner's node row naming the session.

use std::collections::HashMap;
use std::sync::Mutex;

/// An owner's open session, as its store last kept it alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Link {
    /// The session id.
    pub id: u64,
    /// The store time (monotonic nanoseconds) of the last successful open or keep-alive
    /// of the session: the `kept_at` it wrote.
    pub kept: i64,
    /// Whether that keep-alive found the owner's node row naming the session, so that
    /// every reader counted it as the node's heartbeat (false after an open).
    pub named: bool,
}

/// The open sessions of the stores sharing one set of links, by owner.
#[derive(Debug, Default)]
pub(crate) struct SessionLinks {
    by_owner: Mutex<HashMap<String, Link>>,
}

impl SessionLinks {
    /// Session `id` of `owner` was opened or kept alive at store time `sent`, and that
    /// write found the owner's node row naming it (`named`). A newer session of the same
    /// owner replaces an older one; an older answer never replaces a newer one.
    pub fn kept(&self, owner: &str, id: u64, sent: i64, named: bool) {
        let mut links = self.lock();
        match links.get_mut(owner) {
            Some(link) if link.id == id => {
                if sent >= link.kept {
                    link.kept = sent;
                    link.named = named;
                }
            }
            Some(link) if link.id > id => {}
            _ => {
                links.insert(
                    owner.to_owned(),
                    Link {
                        id,
                        kept: sent,
                        named,
                    },
                );
            }
        }
    }

    /// Session `id` ended (or is being closed): it keeps nobody alive any more.
    pub fn ended(&self, id: u64) {
        self.lock().retain(|_, link| link.id != id);
    }

    /// `owner`'s open session, if a store sharing these links keeps one alive.
    pub fn of(&self, owner: &str) -> Option<Link> {
        self.lock().get(owner).copied()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Link>> {
        // A panic while holding the lock left a plain map behind: still usable.
        self.by_owner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newer_session_replaces_an_older_one_and_an_end_drops_it() {
        let links = SessionLinks::default();
        links.kept("a", 2, 10, false);
        links.kept("a", 1, 11, true);
        assert_eq!(links.of("a").map(|l| l.id), Some(2));
        links.kept("a", 2, 12, true);
        links.kept("a", 2, 11, false);
        assert_eq!(
            links.of("a"),
            Some(Link {
                id: 2,
                kept: 12,
                named: true
            })
        );
        links.ended(2);
        assert_eq!(links.of("a"), None);
    }
}
