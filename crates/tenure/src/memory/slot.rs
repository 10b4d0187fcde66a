//! What the in-memory store keeps: one [`Slot`] per role (its term, waiters and queue)
//! and the table of [`Sessions`], with the steps on them every call shares.

use std::sync::Arc;
use std::time::SystemTime;

use rustc_hash::{FxHashMap, FxHashSet};
use tokio::sync::Notify;

use crate::{FencingToken, LeaseInfo, SessionId};

#[derive(Debug)]
pub(super) struct Slot {
    pub(super) holder: Option<String>,
    pub(super) token: FencingToken,
    /// The term's end; for a term held under a session, the session's expiry decides
    /// instead (see [`Sessions::expiry`]).
    pub(super) expires_at: SystemTime,
    /// The session the term is held under, if any.
    pub(super) session: Option<SessionId>,
    /// The value the term advertised when it began.
    pub(super) value: Option<String>,
    /// Woken on every change of term (release or a new token), never on renewal.
    pub(super) changed: Arc<Notify>,
    /// The candidates queued for the role, oldest first (lapsed ones are dropped when
    /// next seen).
    pub(super) queue: Vec<Candidate>,
    /// The store's change number when the term last began, ended or left its session
    /// (see [`LeaseStore::list_prefix_changes`]).
    pub(super) changed_at: u64,
}

/// One queued contender (see [`LeaseStore::try_acquire_or_queue`]).
#[derive(Debug)]
pub(super) struct Candidate {
    pub(super) owner: String,
    pub(super) expires_at: SystemTime,
    pub(super) value: Option<String>,
}

impl Slot {
    /// Queues `owner` until `expires_at`, keeping the place of a live candidacy.
    pub(super) fn enqueue(
        &mut self,
        owner: &str,
        expires_at: SystemTime,
        value: Option<&str>,
        now: SystemTime,
    ) {
        self.queue.retain(|c| now < c.expires_at);
        let value = value.map(str::to_owned);
        match self.queue.iter_mut().find(|c| c.owner == owner) {
            Some(candidate) => {
                candidate.expires_at = expires_at;
                candidate.value = value;
            }
            None => self.queue.push(Candidate {
                owner: owner.to_owned(),
                expires_at,
                value,
            }),
        }
    }

    /// Removes `owner`'s candidacy; whether it was live.
    pub(super) fn dequeue(&mut self, owner: &str, now: SystemTime) -> bool {
        let position = self.queue.iter().position(|c| c.owner == owner);
        position.is_some_and(|at| now < self.queue.remove(at).expires_at)
    }

    /// Takes the oldest live candidate, or `successor` only when it is given.
    pub(super) fn take_candidate(
        &mut self,
        successor: Option<&str>,
        now: SystemTime,
    ) -> Option<Candidate> {
        self.queue.retain(|c| now < c.expires_at);
        let at = match successor {
            Some(owner) => self.queue.iter().position(|c| c.owner == owner)?,
            None if self.queue.is_empty() => return None,
            None => 0,
        };
        Some(self.queue.remove(at))
    }

    /// Ends the live term and begins the candidate's, or frees the role.
    pub(super) fn hand_to(&mut self, next: Option<Candidate>, now: SystemTime) {
        match next {
            Some(c) => new_term(self, &c.owner, c.expires_at, None, c.value.as_deref()),
            None => {
                self.holder = None;
                self.session = None;
                self.value = None;
                self.expires_at = now;
                self.changed.notify_waiters();
            }
        }
    }
}

/// A live or expired session; closed ones are removed.
#[derive(Debug)]
pub(super) struct Session {
    pub(super) owner: String,
    pub(super) expires_at: SystemTime,
    /// The roles acquired under it (some may have been released or taken over since).
    pub(super) roles: FxHashSet<String>,
    /// How many terms were handed to it ([`SessionGrant::terms_handed`](crate::SessionGrant::terms_handed)).
    pub(super) terms_handed: u64,
}

#[derive(Debug, Default)]
pub(super) struct Sessions {
    pub(super) by_id: FxHashMap<SessionId, Session>,
}

impl Sessions {
    /// When `slot`'s term ends: its own expiry, or its session's (the epoch once the
    /// session was closed).
    pub(super) fn expiry(&self, slot: &Slot) -> SystemTime {
        match slot.session {
            None => slot.expires_at,
            Some(id) => self
                .by_id
                .get(&id)
                .map_or(SystemTime::UNIX_EPOCH, |s| s.expires_at),
        }
    }

    /// `owner`'s live session with the highest id (the one opened last), if any.
    pub(super) fn newest_live(
        &mut self,
        owner: &str,
        now: SystemTime,
    ) -> Option<(SessionId, &mut Session)> {
        self.by_id
            .iter_mut()
            .filter(|(_, s)| s.owner == owner && now < s.expires_at)
            .max_by_key(|(id, _)| **id)
            .map(|(id, s)| (*id, s))
    }

    pub(super) fn info(&self, slot: &Slot, role: &str, now: SystemTime) -> LeaseInfo {
        LeaseInfo {
            role: role.to_owned(),
            holder: slot.holder.clone(),
            fencing_token: slot.token,
            expires_at: self.expiry(slot),
            now,
            value: slot.value.clone(),
        }
    }
}

/// Starts a new term for `owner` in `slot` (token + 1) and wakes its waiters.
pub(super) fn new_term(
    slot: &mut Slot,
    owner: &str,
    expires_at: SystemTime,
    session: Option<SessionId>,
    value: Option<&str>,
) {
    slot.token = slot.token.next();
    slot.expires_at = expires_at;
    slot.session = session;
    slot.value = value.map(str::to_owned);
    match &mut slot.holder {
        Some(holder) => {
            holder.clear();
            holder.push_str(owner);
        }
        None => slot.holder = Some(owner.to_owned()),
    }
    slot.changed.notify_waiters();
}

pub(super) fn first_slot(
    owner: &str,
    expires_at: SystemTime,
    session: Option<SessionId>,
    value: Option<&str>,
    changed_at: u64,
) -> Slot {
    Slot {
        holder: Some(owner.to_owned()),
        token: FencingToken::from(1),
        expires_at,
        session,
        value: value.map(str::to_owned),
        changed: Arc::new(Notify::new()),
        queue: Vec::new(),
        changed_at,
    }
}
