//! What one read of a role saw ([`Seen`], with its [`Holder`]), and what one attempt of
//! a call ended with ([`Step`]): the plain data the store's calls decide on.

use std::time::SystemTime;

use tenure::{FencingToken, LeaseResult};

use super::EXPIRY_GRACE;

/// A role's state as one read saw it.
#[derive(Clone, Debug)]
pub(super) enum Seen {
    Absent,
    /// No live term, and a handover under way has reserved the role (see `queue.rs`).
    Handing,
    Held(Holder),
}

#[derive(Clone, Debug)]
pub(super) struct Holder {
    pub(super) owner: String,
    pub(super) token: i64,
    pub(super) lease: i64,
    /// The requested and granted TTLs, when the term record says them.
    pub(super) ttl_secs: Option<(i64, i64)>,
    /// The expiry the holder was last told, when the term record is this term's (for
    /// a term held under a session: the session's, once looked up).
    pub(super) expires_at: Option<SystemTime>,
    /// The etcd lease of the session the term is held under, if it is.
    pub(super) session: Option<i64>,
}

impl Holder {
    pub(super) fn token(&self) -> FencingToken {
        FencingToken::from(u64::try_from(self.token).unwrap_or(0))
    }

    /// The expiry to report at `now`: the recorded one, or `now + EXPIRY_GRACE` when it
    /// has passed (or is unknown) but etcd still holds the key.
    pub(super) fn expires_at(&self, now: SystemTime) -> SystemTime {
        reported_expiry(self.expires_at, now)
    }

    pub(super) fn refusal(&self, now: SystemTime) -> LeaseResult {
        LeaseResult {
            acquired: false,
            fencing_token: self.token(),
            expires_at: self.expires_at(now),
            holder: self.owner.clone(),
            now,
        }
    }
}

/// The expiry to report at `now` for a key etcd still holds whose recorded expiry is
/// `recorded`: that one, or `now + EXPIRY_GRACE` when it has passed (or is unknown), as
/// etcd deletes an expired key only at its next expiry check.
pub(super) fn reported_expiry(recorded: Option<SystemTime>, now: SystemTime) -> SystemTime {
    match recorded {
        Some(at) if at > now => at,
        _ => now + EXPIRY_GRACE,
    }
}

/// What one attempt ended with.
pub(super) enum Step {
    Done(LeaseResult),
    /// The role looked different than assumed; decide again from this.
    Saw(Seen),
    /// As `Saw`, and the caller is queued as a candidate.
    Queued(Seen),
    /// Read the role afresh.
    Reread,
    /// Our term's etcd lease is gone but its key may linger for etcd's expiry check:
    /// wait (briefly) for the key to go, then read again.
    Lapsing(FencingToken),
}
