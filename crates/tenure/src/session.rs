//! Sessions: one renewable lease per member that many roles are held under.
//!
//! A member holding a thousand shards must not renew a thousand leases per interval. It
//! opens one [session](LeaseStore::open_session) with a TTL instead, acquires each role
//! *under* it ([`LeaseStore::acquire_in_session`]), and keeps the session alive with one
//! call per interval ([`LeaseStore::keep_alive_session`]) that writes one row or key
//! however many roles it holds. A role held under a session is live exactly while the
//! session is. An expired session is never revived: its roles are free, and taking them
//! again starts new terms with new tokens, so every rule of a single lease (tokens
//! strictly increase per role, a lapsed term is never resumed) holds per role.
//!
//! This is the design of etcd leases with keys attached, ZooKeeper sessions with
//! ephemeral nodes and Chubby's KeepAlive; tenure's shard groups are built on it.

use std::time::{Duration, SystemTime};

use crate::lease::{validate_name, validate_ttl, ChangeMark};
use crate::registry::is_live;
use crate::Result;

#[cfg(doc)]
use crate::LeaseStore;

/// A session's id: assigned by the store, never handed out twice.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct SessionId(u64);

impl SessionId {
    /// The raw id.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl From<u64> for SessionId {
    fn from(id: u64) -> Self {
        SessionId(id)
    }
}

impl std::fmt::Display for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:x}", self.0)
    }
}

/// The answer to opening or keeping alive a session: live until `expires_at`, on store
/// time.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SessionGrant {
    /// The session.
    pub id: SessionId,
    /// The owner it was opened for; roles held under it name this owner as holder.
    pub owner: String,
    /// When the session (and every role held under it) ends unless kept alive.
    pub expires_at: SystemTime,
    /// The store time at which the call was decided.
    pub now: SystemTime,
    /// When the other nodes of the registry made from the same connection (or store)
    /// lapse, told by a keep-alive of a store whose registry shares its sessions
    /// (PostgreSQL, SQLite, etcd, in memory); `None` otherwise. A shard member reads the
    /// group's members only when this is due, so a group in which every member keeps
    /// its session alive is not read at all.
    #[serde(default)]
    pub peers_lapse: Option<PeersLapse>,
    /// How many terms were handed to the session ([`LeaseStore::hand_to_session`])
    /// since it opened, on a store that hands over in one step and counts them
    /// (PostgreSQL, SQLite, in memory); `None` otherwise (etcd and Kubernetes hand over
    /// by releasing). A shard member compares it with the
    /// handovers it heard of: a term handed to it that it did not expect (a handover
    /// that landed late, or was planned from another view of the group) is then worked
    /// on at the next keep-alive, not at its next look many TTLs later.
    #[serde(default)]
    pub terms_handed: Option<u64>,
    /// Where the store's numbering of lease changes stood at the call, on a store whose
    /// keep-alives tell it (PostgreSQL, SQLite, etcd, in memory); `None` otherwise. A read of
    /// changes ([`LeaseStore::list_prefix_changes`]) whose mark is at or past it saw every
    /// change of every lease (of any prefix) made before the call; one whose mark is
    /// before it may have missed some. So a shard member that planned from a read looks
    /// again only when a keep-alive tells of a later change, not on a timer: a settled
    /// group costs a keep-alive per member per interval, and a change that no push
    /// announced (an outside release of a shard) is seen at the next keep-alive.
    #[serde(default)]
    pub latest_change: Option<ChangeMark>,
}

/// When the first of the other nodes of a registry lapses unless it is heard from again,
/// as a keep-alive saw it ([`SessionGrant::peers_lapse`]): judged as the registry's reads
/// of the members judge it, at the grant's `now`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PeersLapse {
    /// How long after the grant's `now` the first other live node lapses: zero if a node
    /// lapsed less than `ttl` before `now`, and `ttl` if there is no other node (a node
    /// that comes later joins, which is announced).
    pub after: Duration,
    /// How many other nodes were live: fewer than a reader last saw, and one lapsed
    /// since (more are joins, which are announced).
    pub live: usize,
    /// The registry's TTL it was judged by: only a registry with this TTL may use it.
    pub ttl: Duration,
}

impl PeersLapse {
    /// The account of the other nodes at `now` for a registry of TTL `ttl`, from when
    /// each was last heard of (`heard`: its heartbeat, or its open session's last
    /// keep-alive, as the registry's reads take it) and when it was last heard of by any
    /// means (`recent`: a session since ended counts too). A node whose `recent` is two
    /// TTLs or more in the past is forgotten; one that lapsed less recently makes the
    /// lapse past (zero), so the caller reads the members.
    pub fn judge(
        others: impl IntoIterator<Item = (SystemTime, SystemTime)>,
        ttl: Duration,
        now: SystemTime,
    ) -> PeersLapse {
        let (mut first, mut live) = (None::<SystemTime>, 0);
        for (heard, recent) in others {
            if !is_live(recent.max(heard), ttl.saturating_mul(2), now) {
                continue;
            }
            first = Some(first.map_or(heard, |first| first.min(heard)));
            live += usize::from(is_live(heard, ttl, now));
        }
        // A lapse beyond the clock's range is more than a TTL away: as far as with no
        // other node.
        let after = first
            .and_then(|heard| heard.checked_add(ttl))
            .map_or(ttl, |lapses| {
                lapses.duration_since(now).unwrap_or(Duration::ZERO)
            });
        PeersLapse { after, live, ttl }
    }
}

impl SessionGrant {
    /// Time left in the session as judged by the store at the call (`expires_at - now`).
    pub fn remaining(&self) -> Duration {
        self.expires_at
            .duration_since(self.now)
            .unwrap_or(Duration::ZERO)
    }
}

/// Checks the arguments of [`LeaseStore::open_session`] and returns `now + ttl`.
pub fn validate_open(
    owner: &str,
    ttl: Duration,
    min_ttl: Duration,
    now: SystemTime,
) -> Result<SystemTime> {
    validate_name("owner", owner)?;
    validate_ttl(ttl, min_ttl, now)
}

/// An owner's open session as a store last kept it alive: see [`SessionLinks`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionLink<T> {
    /// The session id.
    pub id: u64,
    /// When the last successful open or keep-alive of the session happened, on the
    /// clock the backend judges it by (a monotonic instant, or store time).
    pub kept: T,
    /// Whether that keep-alive found the owner's membership naming the session, so that
    /// every reader counted it as the owner's heartbeat (false after an open).
    pub named: bool,
}

/// Which owner's session the stores of one connection last kept alive, by owner: for
/// backends whose registry lets a shard member's session keep-alive stand in for its
/// membership heartbeat (one write per member per interval instead of two). The store
/// records each open and keep-alive here; the registry made from the same connection
/// reads it to skip heartbeats the keep-alive already stood in for.
///
/// `T` is the time the backend judges by; a newer session of an owner replaces an
/// older one, and an older answer never replaces a newer one.
#[derive(Debug)]
pub struct SessionLinks<T> {
    by_owner: parking_lot::Mutex<std::collections::HashMap<String, SessionLink<T>>>,
    registry_ttls: RegistryTtls,
}

/// The TTLs of the registries made over one store's nodes: a keep-alive tells when the
/// other nodes lapse only while they all agree (see [`SessionGrant::peers_lapse`]).
#[derive(Debug, Default)]
pub(crate) struct RegistryTtls(parking_lot::Mutex<std::collections::BTreeSet<Duration>>);

impl RegistryTtls {
    /// A registry of TTL `ttl` was made.
    pub(crate) fn made(&self, ttl: Duration) {
        self.0.lock().insert(ttl);
    }

    /// The one TTL of every registry ever made (a dropped one too: nothing tells them
    /// apart), if they share one.
    pub(crate) fn single(&self) -> Option<Duration> {
        let ttls = self.0.lock();
        (ttls.len() == 1).then(|| ttls.first().copied()).flatten()
    }

    /// The longest TTL of a registry made, if any.
    pub(crate) fn longest(&self) -> Option<Duration> {
        self.0.lock().last().copied()
    }
}

impl<T> Default for SessionLinks<T> {
    fn default() -> Self {
        SessionLinks {
            by_owner: parking_lot::Mutex::new(std::collections::HashMap::new()),
            registry_ttls: RegistryTtls::default(),
        }
    }
}

impl<T> SessionLinks<T> {
    /// A registry judging nodes live for `ttl` after they were last heard of now
    /// shares these links.
    pub fn registry_made(&self, ttl: Duration) {
        self.registry_ttls.made(ttl);
    }

    /// The TTL by which a keep-alive judges when the other nodes lapse
    /// ([`SessionGrant::peers_lapse`]): the registry's, while every registry ever made
    /// over these links (a dropped one too: nothing tells them apart) has the same one.
    pub fn peers_ttl(&self) -> Option<Duration> {
        self.registry_ttls.single()
    }
}

impl<T: Copy + Ord> SessionLinks<T> {
    /// Session `id` of `owner` was opened or kept alive at `kept`, and that write found
    /// the owner's membership naming it (`named`).
    pub fn kept(&self, owner: &str, id: u64, kept: T, named: bool) {
        let mut links = self.by_owner.lock();
        match links.get_mut(owner) {
            Some(link) if link.id == id => {
                if kept >= link.kept {
                    link.kept = kept;
                    link.named = named;
                }
            }
            Some(link) if link.id > id => {}
            _ => {
                links.insert(owner.to_owned(), SessionLink { id, kept, named });
            }
        }
    }

    /// Session `id` ended (or is being closed): it keeps nobody alive any more.
    pub fn ended(&self, id: u64) {
        self.by_owner.lock().retain(|_, link| link.id != id);
    }

    /// `owner`'s open session, if a store sharing these links keeps one alive.
    pub fn of(&self, owner: &str) -> Option<SessionLink<T>> {
        self.by_owner.lock().get(owner).copied()
    }
}

/// What a registry's last successful heartbeat of each node wrote: the session the
/// node's row was made to name, and its metadata. The registry half of
/// [`SessionLinks`]: a heartbeat may be skipped only while the row still says what the
/// skipped write would have said.
#[derive(Debug, Default)]
pub struct HeartbeatsWritten {
    by_node: parking_lot::Mutex<std::collections::HashMap<String, HeartbeatWritten>>,
}

/// One node's entry in [`HeartbeatsWritten`].
#[derive(Clone, Debug, Default)]
struct HeartbeatWritten {
    session: Option<u64>,
    /// The metadata last written, encoded (`None` if never given).
    metadata: Option<String>,
}

impl HeartbeatsWritten {
    /// Whether `link`'s keep-alive stands in for a heartbeat of `node_id` with
    /// `metadata` (`None`: keep what is there): the last write made the row name that
    /// session with this metadata, and the last keep-alive found the row still naming
    /// it. The caller adds its own test of how recent the keep-alive is.
    pub fn stood_in<T>(
        &self,
        node_id: &str,
        metadata: Option<&str>,
        link: &SessionLink<T>,
    ) -> bool {
        let by_node = self.by_node.lock();
        let Some(written) = by_node.get(node_id) else {
            return false;
        };
        written.session == Some(link.id)
            && link.named
            && (metadata.is_none() || metadata == written.metadata.as_deref())
    }

    /// A heartbeat of `node_id` naming `session` wrote `metadata` (`None`: kept what
    /// was there).
    pub fn wrote(&self, node_id: &str, session: Option<u64>, metadata: Option<String>) {
        let mut by_node = self.by_node.lock();
        let written = by_node.entry(node_id.to_owned()).or_default();
        written.session = session;
        if metadata.is_some() {
            written.metadata = metadata;
        }
    }

    /// Nothing is known of `node_id`'s row any more (a heartbeat failed and may or may
    /// not have been written, or the node left): its next heartbeat writes.
    pub fn forget(&self, node_id: &str) {
        self.by_node.lock().remove(node_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The account of the other nodes: a TTL with none; the first live one's lapse;
    /// zero once one lapsed less than two TTLs ago by `recent` (though `heard` is older,
    /// as for a node whose session is gone), which is then not counted live; nothing of
    /// one last heard of two TTLs ago or more.
    #[test]
    fn the_peers_account_is_the_first_lapse_within_two_ttls() {
        let ttl = Duration::from_secs(3);
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let ago = |secs: u64| now - Duration::from_secs(secs);
        let judge = |others: &[(SystemTime, SystemTime)]| {
            let told = PeersLapse::judge(others.iter().copied(), ttl, now);
            assert_eq!(told.ttl, ttl);
            (told.after, told.live)
        };
        assert_eq!(judge(&[]), (ttl, 0), "no other node");
        assert_eq!(
            judge(&[(ago(1), ago(1)), (ago(2), ago(2))]),
            (Duration::from_secs(1), 2),
            "the first of two live nodes lapses in a second"
        );
        assert_eq!(
            judge(&[(ago(1), ago(1)), (ago(4), ago(4))]),
            (Duration::ZERO, 1),
            "one lapsed a second ago"
        );
        assert_eq!(
            judge(&[(ago(1), ago(1)), (ago(6), ago(6))]),
            (Duration::from_secs(2), 1),
            "one last heard of two TTLs ago is forgotten"
        );
        assert_eq!(
            judge(&[(ago(1), ago(1)), (ago(9), now)]),
            (Duration::ZERO, 1),
            "heard of recently by other means: lapsed, and due now"
        );
    }

    #[test]
    fn a_newer_session_replaces_an_older_one_and_an_end_drops_it() {
        let links = SessionLinks::default();
        links.kept("a", 2, 10, false);
        links.kept("a", 1, 11, true);
        assert_eq!(
            links.of("a").map(|l| l.id),
            Some(2),
            "an older session never wins"
        );
        links.kept("a", 2, 12, true);
        links.kept("a", 2, 11, false);
        let expected = SessionLink {
            id: 2,
            kept: 12,
            named: true,
        };
        assert_eq!(links.of("a"), Some(expected), "an older answer never wins");
        links.ended(2);
        assert_eq!(links.of("a"), None);
    }

    #[test]
    fn a_keep_alive_stands_in_only_for_what_the_last_write_said() {
        let written = HeartbeatsWritten::default();
        let link = |id, named| SessionLink { id, kept: 0, named };
        assert!(
            !written.stood_in("a", None, &link(1, true)),
            "nothing written yet"
        );
        written.wrote("a", Some(1), Some("{}".to_owned()));
        assert!(written.stood_in("a", None, &link(1, true)));
        assert!(written.stood_in("a", Some("{}"), &link(1, true)));
        assert!(
            !written.stood_in("a", Some("{\"k\":1}"), &link(1, true)),
            "new metadata"
        );
        assert!(
            !written.stood_in("a", None, &link(2, true)),
            "another session"
        );
        assert!(
            !written.stood_in("a", None, &link(1, false)),
            "the row no longer names it"
        );
        written.wrote("a", Some(1), None);
        assert!(
            written.stood_in("a", Some("{}"), &link(1, true)),
            "metadata kept"
        );
        written.forget("a");
        assert!(!written.stood_in("a", None, &link(1, true)));
    }
}
