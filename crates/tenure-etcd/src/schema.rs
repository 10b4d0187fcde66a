//! The key layout under a prefix and the records stored there, with their encodings
//! (JSON records, times as nanoseconds since the epoch, TTLs as etcd's whole seconds).
//!
//! Under `<prefix>`:
//!
//! | key | value | etcd lease | purpose |
//! | --- | --- | --- | --- |
//! | `leases/R` | owner | the term's lease | the live term of role R; token = create revision |
//! | `terms/R` | [`TermRecord`] (JSON), plus `session` for a term held under one | none | latest term's token, expiry, release; survives expiry |
//! | `values/R` | [`ValueRecord`] (JSON) | none | the value the latest term advertised; absent when it advertised none or was released |
//! | `queue/N/R/O` | [`CandidateRecord`] (JSON) | the candidate's own lease | owner O queued for role R (N: R's length in bytes); place = create revision |
//! | `leases/R` NUL `handoff` | [`HandoffRecord`] (JSON) | none | a handover under way: R's last term ended, the candidate's has not begun |
//! | `sessions/L` | [`SessionRecord`] (JSON) | the session's lease `L` | a live session (id = etcd lease id `L`, hex); its expiry for readers, and when it was last kept alive (a heartbeat of its owner's node) |
//! | `nodes/ID` | [`NodeRecord`] (JSON) | the node's lease (two TTLs) | membership; may name the owner's session, whose keep-alives then count as its heartbeats |
//! | `changed` | empty | none | put by every transaction that begins or ends a term: its mod revision is the latest such change |
//!
//! `values/R` is written only by the transaction that starts a term (put with a value,
//! deleted without one) and deleted by release, never by a renewal: `terms/R` is
//! rewritten by every renewal, and a value kept there would be sent again each time.
//! It belongs to the term whose token is its mod revision (the starting transaction's
//! revision, which is the lease key's create revision); readers ignore it otherwise, so
//! a `values/R` left by a term that an older tenure (which knows no `values/R`) followed
//! is never shown with the wrong term. A layout from before `values/R` existed reads as
//! terms that advertised nothing.
//!
//! A candidate's key `queue/N/R/O` names role and owner injectively (the length says
//! where R ends, whatever `/` either holds), so `queue/N/R/` is exactly R's queue. It is
//! on an etcd lease of the candidate's TTL, so a candidate that stops refreshing drops
//! out of the queue by itself; a refresh puts the key again (keeping its create
//! revision, so its place) and keeps the lease alive.
//!
//! `changed` is what a session's keep-alive tells as the latest change
//! ([`tenure::SessionGrant::latest_change`]): it reads the key in the transaction that
//! writes the session's record, so the answer is the store's state at that revision. A
//! term that lapses (etcd deletes its key) does not put it, and neither does a tenure
//! older than this key, whose changes are seen only by a member's timer look.
//!
//! The handover key sorts right after `leases/R` (no name holds a NUL), so one watch of
//! the range `[leases/R, leases/R \x01)` sees a term end, a handover reserve the role and
//! the next term begin, each revision's events in one response. Names holding a NUL are
//! never roles: listings skip them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tenure::{Error, Metadata, Result};

use crate::conn::BACKEND;

/// The longest prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 512;

/// The prefix used when an `etcd://` URL names none.
pub const DEFAULT_PREFIX: &str = "/tenure";

/// etcd's own ceiling on a lease TTL (`MaxLeaseTTL`), in seconds.
pub(crate) const MAX_TTL_SECS: u64 = 9_000_000_000;

/// Checks a key prefix: non-empty, at most [`MAX_PREFIX_LEN`] bytes, printable (no
/// control characters or whitespace) and not ending in `/` (the layout adds the `/`).
pub fn validate_prefix(prefix: &str) -> Result<()> {
    if prefix.is_empty() {
        return Err(Error::invalid("prefix", "must not be empty"));
    }
    if prefix.len() > MAX_PREFIX_LEN {
        return Err(Error::invalid(
            "prefix",
            format!(
                "is {} bytes long, at most {MAX_PREFIX_LEN} allowed",
                prefix.len()
            ),
        ));
    }
    if prefix.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(Error::invalid(
            "prefix",
            "must be printable: no control characters, NUL or whitespace",
        ));
    }
    if prefix.ends_with('/') {
        return Err(Error::invalid(
            "prefix",
            "must not end with '/': keys are <prefix>/leases/<role>, so write /app, not /app/",
        ));
    }
    Ok(())
}

/// Checks a TTL for etcd: whole seconds, at least one, at most etcd's maximum.
pub(crate) fn ttl_secs(ttl: Duration) -> Result<i64> {
    if ttl.subsec_nanos() != 0 {
        return Err(Error::invalid(
            "ttl",
            format!("{ttl:?} is not a whole number of seconds, which etcd leases need"),
        ));
    }
    let secs = ttl.as_secs();
    if secs > MAX_TTL_SECS {
        return Err(Error::invalid(
            "ttl",
            format!("{ttl:?} is above etcd's maximum lease TTL of {MAX_TTL_SECS} s"),
        ));
    }
    i64::try_from(secs).map_err(|_| Error::invalid("ttl", "too large"))
}

/// The keys of one store or registry.
///
/// Public (hidden) for [`crate::requests`]: benchmarks build the store's requests on the
/// same keys.
#[doc(hidden)]
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// The keys under `prefix`; `InvalidArgument` as for [`validate_prefix`].
    pub fn new(prefix: &str) -> Result<Self> {
        validate_prefix(prefix)?;
        Ok(Keys {
            prefix: prefix.to_owned(),
        })
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `<prefix>/leases/<role>`: the live term's key.
    pub fn lease(&self, role: &str) -> String {
        format!("{}/leases/{role}", self.prefix)
    }

    /// `<prefix>/terms/<role>`: the latest term's record.
    pub fn term(&self, role: &str) -> String {
        format!("{}/terms/{role}", self.prefix)
    }

    /// `<prefix>/values/<role>`: the value the latest term advertised, if any.
    pub fn value(&self, role: &str) -> String {
        format!("{}/values/{role}", self.prefix)
    }

    /// `<prefix>/leases/<role>` NUL `handoff`: a handover of `role` under way.
    pub fn handoff(&self, role: &str) -> String {
        format!("{}/leases/{role}\0handoff", self.prefix)
    }

    /// The end of the range `[leases/<role>, ...)` that holds exactly the role's lease
    /// key and its handover key.
    pub(crate) fn lease_range_end(&self, role: &str) -> String {
        format!("{}/leases/{role}\x01", self.prefix)
    }

    /// `<prefix>/queue/<len>/<role>/`: the directory of `role`'s candidates.
    pub(crate) fn queue_dir(&self, role: &str) -> String {
        format!("{}/queue/{}/{role}/", self.prefix, role.len())
    }

    /// The end of the range of [`queue_dir`](Self::queue_dir) (`/` + 1 is `0`).
    pub(crate) fn queue_end(&self, role: &str) -> String {
        format!("{}/queue/{}/{role}0", self.prefix, role.len())
    }

    /// `<prefix>/queue/<len>/<role>/<owner>`: `owner`'s candidacy for `role`.
    pub fn candidate(&self, role: &str, owner: &str) -> String {
        format!("{}{owner}", self.queue_dir(role))
    }

    /// `<prefix>/nodes/<node_id>`: the node's membership.
    pub fn node(&self, node_id: &str) -> String {
        format!("{}/nodes/{node_id}", self.prefix)
    }

    /// `<prefix>/changed`: put by every transaction that begins or ends a term.
    pub fn changed(&self) -> String {
        format!("{}/changed", self.prefix)
    }

    /// `<prefix>/sessions/<lease id, hex>`: a live session, on its own etcd lease.
    pub(crate) fn session(&self, lease: i64) -> String {
        format!("{}/sessions/{lease:x}", self.prefix)
    }

    pub(crate) fn sessions_dir(&self) -> String {
        format!("{}/sessions/", self.prefix)
    }

    pub(crate) fn leases_dir(&self) -> String {
        format!("{}/leases/", self.prefix)
    }

    pub(crate) fn terms_dir(&self) -> String {
        format!("{}/terms/", self.prefix)
    }

    pub(crate) fn values_dir(&self) -> String {
        format!("{}/values/", self.prefix)
    }

    pub(crate) fn nodes_dir(&self) -> String {
        format!("{}/nodes/", self.prefix)
    }
}

/// The name after a directory prefix (`<prefix>/leases/` + name), if `key` is under it.
/// A name holding a NUL is none (no role, owner or node id does): under `leases/` it is
/// a handover key.
pub(crate) fn name_under<'a>(key: &'a [u8], dir: &str) -> Option<&'a str> {
    let rest = key.strip_prefix(dir.as_bytes())?;
    std::str::from_utf8(rest)
        .ok()
        .filter(|s| !s.is_empty() && !s.contains('\0'))
}

/// The non-leased record of a role's latest term.
///
/// Written by the acquire transaction without `token` (the token is then the record's
/// mod revision, which equals the lease key's create revision: one transaction), and
/// with `token` by renewals and release.
#[doc(hidden)]
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct TermRecord {
    /// The term's owner.
    pub owner: String,
    /// The term's token; absent in the acquire transaction's record (see above).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// Expiry as reported to the holder, nanoseconds since the Unix epoch.
    pub expires_at_ns: u64,
    /// The TTL the holder asked for, in seconds.
    pub ttl_secs: i64,
    /// The TTL etcd granted (higher when etcd raised it to its minimum); 0 if unknown.
    #[serde(default)]
    pub lease_secs: i64,
    /// Whether the term ended by release.
    #[serde(default)]
    pub released: bool,
}

impl TermRecord {
    /// The token of the term this record describes, given the record's mod revision.
    pub(crate) fn token_at(&self, mod_revision: i64) -> u64 {
        self.token
            .unwrap_or_else(|| u64::try_from(mod_revision).unwrap_or(0))
    }
}

/// A term record that names the session the term is held under: [`TermRecord`] plus
/// the session's etcd lease id. A separate type so the plain record (and everything
/// that builds one) stays as it was; readers see both through [`SessionMark`].
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct SessionTermRecord<'a> {
    #[serde(flatten)]
    pub(crate) term: &'a TermRecord,
    /// The session's etcd lease id.
    pub(crate) session: i64,
}

/// The `session` field of a stored term record, absent for plain terms.
#[derive(Clone, Copy, Debug, Default, serde::Deserialize)]
pub(crate) struct SessionMark {
    #[serde(default)]
    pub(crate) session: Option<i64>,
}

/// The value a term advertised, at `values/R` (see the [module](self) docs): written by
/// the transaction that starts the term, so its mod revision is the term's token.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct ValueRecord {
    /// The value, as the holder gave it.
    pub(crate) value: String,
}

/// A queued candidate, at `queue/N/R/O` on the candidate's own etcd lease: put by each
/// of its refreshes (the key, and so its place, is kept), read by the handover that
/// begins its term.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct CandidateRecord {
    /// The value its term will advertise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) value: Option<String>,
    /// When the candidacy lapses unless refreshed, as the candidate computed it at its
    /// last refresh (a lower bound of its lease's end), nanoseconds since the Unix epoch.
    pub(crate) expires_at_ns: u64,
    /// The TTL the candidate asked for, in seconds.
    pub(crate) ttl_secs: i64,
    /// The TTL etcd granted its lease (higher when etcd raised it to its minimum).
    pub(crate) lease_secs: i64,
}

/// A handover under way, at `leases/R` NUL `handoff`: written by the transaction that
/// ends a term for a candidate, deleted by the one that begins the candidate's term
/// (or frees the role when no candidate is left). While it exists no term starts but
/// that one (every acquire checks it is absent).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct HandoffRecord {
    /// The owner of the term that ended.
    pub(crate) from: String,
    /// That term's token.
    pub(crate) token: u64,
    /// The candidate chosen by a planned handoff; the oldest live one when absent (or
    /// when it left the queue meanwhile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) to: Option<String>,
}

/// A live session's record, at `sessions/L` on the session's own etcd lease `L`: written
/// when it opens and on each keep-alive (one key however many roles it holds).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct SessionRecord {
    /// The owner the session was opened for; its roles' holder.
    pub(crate) owner: String,
    /// Expiry as last reported to the session's owner, nanoseconds since the Unix epoch.
    pub(crate) expires_at_ns: u64,
    /// The TTL the session was opened with, in seconds.
    pub(crate) ttl_secs: i64,
    /// The TTL etcd granted its lease (higher when etcd raised it to its minimum).
    pub(crate) lease_secs: i64,
    /// When the open or keep-alive that wrote it was sent, nanoseconds since the Unix
    /// epoch on the writer's clock: registries count it as a heartbeat of a node whose
    /// record names this session (zero in records of a tenure older than the field).
    #[serde(default)]
    pub(crate) kept_at_ns: u64,
}

/// A node's membership record.
#[doc(hidden)]
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct NodeRecord {
    /// When this membership started, nanoseconds since the Unix epoch.
    pub first_seen_ns: u64,
    /// The last heartbeat, nanoseconds since the Unix epoch.
    pub last_heartbeat_ns: u64,
    /// What the node said about itself.
    #[serde(default)]
    pub metadata: Metadata,
    /// The session (its etcd lease) of the node's owner that the writing registry's
    /// store keeps alive, if any: readers count that session's keep-alives
    /// ([`SessionRecord`]'s `kept_at_ns`) as heartbeats of the node while the session
    /// lives and is the node's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<i64>,
}

pub(crate) fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| Error::store(BACKEND, "encoding a record", e))
}

/// A stored record, or `None` when the bytes are not one.
#[doc(hidden)]
pub fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    serde_json::from_slice(bytes).ok()
}

/// Nanoseconds since the Unix epoch (saturating; 2554 is far off).
#[doc(hidden)]
pub fn to_ns(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

pub(crate) fn from_ns(ns: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(ns)
}

/// `time` as it reads back from a record, so a holder and a reader see equal values.
pub(crate) fn round_trip(time: SystemTime) -> SystemTime {
    from_ns(to_ns(time))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        for good in ["/tenure", "tenure", "/a/b-c_d.e", "/ünï"] {
            validate_prefix(good).unwrap();
        }
        for bad in ["", "/", "/app/", "a b", "a\0b", "a\nb"] {
            assert!(
                matches!(
                    validate_prefix(bad),
                    Err(Error::InvalidArgument {
                        field: "prefix",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
        assert!(validate_prefix(&"x".repeat(MAX_PREFIX_LEN + 1)).is_err());
    }

    #[test]
    fn ttls() {
        assert_eq!(ttl_secs(Duration::from_secs(3)).unwrap(), 3);
        assert!(ttl_secs(Duration::from_millis(1500)).is_err());
        assert!(ttl_secs(Duration::from_secs(MAX_TTL_SECS + 1)).is_err());
    }

    /// Records as releases before `values/R` wrote them still decode (a value is never
    /// in `terms/R`, so the term record's encoding is unchanged), and a value record is
    /// only what it says.
    #[test]
    fn records_written_before_values_decode() {
        let acquired = br#"{"owner":"a","expires_at_ns":1700000000000000000,"ttl_secs":4,"lease_secs":4,"released":false}"#;
        let record = decode::<TermRecord>(acquired).expect("an acquire's record");
        assert_eq!((record.owner.as_str(), record.token), ("a", None));
        assert_eq!(record.token_at(42), 42);
        let released = br#"{"owner":"a","token":42,"expires_at_ns":1700000000000000000,"ttl_secs":4,"lease_secs":4,"released":true}"#;
        let record = decode::<TermRecord>(released).expect("a release's record");
        assert!(record.released && record.token_at(50) == 42);
        // The oldest records had neither `lease_secs` nor `released`.
        let oldest = br#"{"owner":"a","expires_at_ns":1,"ttl_secs":4}"#;
        assert!(decode::<TermRecord>(oldest).is_some_and(|r| !r.released));

        let value = encode(&ValueRecord {
            value: "grpc://[fd00::3]:7443/ünïcode".into(),
        })
        .unwrap();
        assert_eq!(
            decode::<ValueRecord>(&value).map(|v| v.value).as_deref(),
            Some("grpc://[fd00::3]:7443/ünïcode")
        );
        for junk in [&b"http://a"[..], b"", br#"{"value":7}"#, br#"{}"#] {
            assert!(decode::<ValueRecord>(junk).is_none(), "{junk:?}");
        }
    }

    #[test]
    fn names_and_times() {
        let keys = Keys::new("/p").unwrap();
        assert_eq!(keys.lease("a/b"), "/p/leases/a/b");
        assert_eq!(
            name_under(b"/p/leases/a/b", &keys.leases_dir()),
            Some("a/b")
        );
        assert_eq!(name_under(b"/p/terms/a", &keys.leases_dir()), None);
        assert_eq!(keys.value("a/b"), "/p/values/a/b");
        assert_eq!(keys.candidate("a/b", "o/1"), "/p/queue/3/a/b/o/1");
        assert_eq!(
            name_under(b"/p/queue/3/a/b/o/1", &keys.queue_dir("a/b")),
            Some("o/1")
        );
        // Role `a`'s queue holds none of role `a/b`'s candidates, and the other way round.
        let (a_dir, a_end) = (keys.queue_dir("a"), keys.queue_end("a"));
        let ab = keys.candidate("a/b", "o");
        assert!(!(a_dir.as_str() <= ab.as_str() && ab.as_str() < a_end.as_str()));
        let a = keys.candidate("a", "b/o");
        assert!(a_dir.as_str() <= a.as_str() && a.as_str() < a_end.as_str());
        assert!(name_under(keys.handoff("a").as_bytes(), &keys.leases_dir()).is_none());
        // No listing of roles, sessions or nodes takes the change key for one of theirs.
        for dir in [
            keys.leases_dir(),
            keys.terms_dir(),
            keys.values_dir(),
            keys.sessions_dir(),
            keys.nodes_dir(),
        ] {
            assert!(
                name_under(keys.changed().as_bytes(), &dir).is_none(),
                "{dir}"
            );
        }
        let (lease, handoff, end) = (
            keys.lease("a"),
            keys.handoff("a"),
            keys.lease_range_end("a"),
        );
        assert!(lease < handoff && handoff < end);
        assert!(keys.lease("a0") > end && keys.lease("a/b") > end);
        assert_eq!(
            name_under(b"/p/values/a/b", &keys.values_dir()),
            Some("a/b")
        );
        let t = SystemTime::now();
        assert_eq!(round_trip(t), from_ns(to_ns(t)));
        assert_eq!(round_trip(round_trip(t)), round_trip(t));
    }
}
