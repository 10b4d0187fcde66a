//! What a notification on the lease channel says, and what one listener knows from them.
//!
//! Every statement that begins or ends a term notifies the schema's lease channel with
//! the role's state after it, so a waiter learns who leads next from the push alone
//! ([`LeaseStore::wait_for_successor`](tenure::LeaseStore::wait_for_successor)) and a
//! handover costs the store no read per waiting contender. A payload is the role, then
//! fields after a unit separator (U+001F, which no role or owner may contain: names
//! with control characters are refused):
//!
//! - `role US began US token US holder`: the term `token` of `holder` began;
//! - `role US began-in US token US session US holder`: the term `token` of `holder`
//!   began under session `session` (a term handed to a member's session, see
//!   [`LeaseStore::hand_to_session`](tenure::LeaseStore::hand_to_session)); an earlier
//!   tenure reads it as unknown, and reads the row;
//! - `role US ended US token`: the term `token` ended and no term is live.
//!
//! The same statement also notifies the bare role, right after, as every tenure before
//! this one did: their waiters compare the payload with the role and would otherwise
//! never wake. A listener of this version drops that companion (the bare role directly
//! after a state of the same role from the same backend); a bare role on its own comes
//! from an earlier tenure's statement and says nothing of the state (its waiters are
//! told [`TermChange::Unknown`]), as does any payload this parser cannot read.
//!
//! [`Terms`] is the listener's memory of each role's latest state, learned while it has
//! been subscribed without a gap: a waiter consults it instead of reading the row, so
//! only the first wait on a role after the listener (re)subscribed reads the store.

use std::collections::HashMap;

use parking_lot::Mutex;
use tenure::{FencingToken, LeaseInfo, SessionId, TermChange};

/// Separates a payload's fields (U+001F UNIT SEPARATOR).
const SEPARATOR: char = '\u{1f}';

/// The most roles one listener remembers; past it the memory starts over (waiters on a
/// forgotten role read the store once). Bounds a long-lived listener of a schema with
/// ever new roles.
const MAX_ROLES: usize = 65_536;

/// A role's term as a notification (or a read) left it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TermState {
    /// The role's latest token.
    pub(crate) token: FencingToken,
    /// The holder of term `token` while it is live; `None` once it ended.
    pub(crate) holder: Option<Box<str>>,
    /// The session the term is held under, when the notification said (a read of the
    /// row does not).
    pub(crate) session: Option<SessionId>,
}

impl TermState {
    /// What a waiter that observed term `observed` learns from this state: the term
    /// that replaced it, that none is live, or nothing (`None`: `observed` may still be
    /// live, or this state is older than it).
    pub(crate) fn answer(&self, observed: FencingToken) -> Option<TermChange> {
        match &self.holder {
            Some(holder) if self.token > observed => Some(TermChange::Began {
                holder: holder.to_string(),
                fencing_token: self.token,
                session: self.session,
            }),
            None if self.token >= observed => Some(TermChange::Ended),
            _ => None,
        }
    }

    /// Whether this state comes after `other` (a later term, or the end of the same).
    fn supersedes(&self, other: &TermState) -> bool {
        self.token > other.token || (self.token == other.token && self.holder.is_none())
    }

    /// The state a read of the role shows (`None`: the role has no row, so no term).
    pub(crate) fn read(info: Option<&LeaseInfo>) -> TermState {
        match info {
            Some(info) => TermState {
                token: info.fencing_token,
                holder: info.live_holder().map(Box::from),
                session: None,
            },
            None => TermState {
                token: FencingToken::from(0),
                holder: None,
                session: None,
            },
        }
    }
}

/// One notification as the listener parsed it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Note {
    /// The role it is about: the payload up to the first separator (all of a payload
    /// without one, such as an earlier tenure's or the membership channel's).
    pub(crate) role: Box<str>,
    /// The state it announces; `None` when it announces none this parser can read.
    pub(crate) state: Option<TermState>,
    /// Whether the payload was the bare role (no separator).
    bare: bool,
}

impl Note {
    /// Parses a payload; never fails (an unreadable state is `state: None`).
    pub(crate) fn parse(payload: &str) -> Note {
        let Some((role, rest)) = payload.split_once(SEPARATOR) else {
            return Note {
                role: payload.into(),
                state: None,
                bare: true,
            };
        };
        Note {
            role: role.into(),
            state: parse_state(rest),
            bare: false,
        }
    }
}

fn parse_state(fields: &str) -> Option<TermState> {
    let mut fields = fields.splitn(3, SEPARATOR);
    let kind = fields.next()?;
    let token: u64 = fields.next()?.parse().ok()?;
    let token = FencingToken::from(token);
    let began = |session, holder: &str| {
        (!holder.is_empty()).then(|| TermState {
            token,
            holder: Some(holder.into()),
            session,
        })
    };
    match (kind, fields.next()) {
        ("began", Some(holder)) => began(None, holder),
        ("began-in", Some(rest)) => {
            let (session, holder) = rest.split_once(SEPARATOR)?;
            let session: u64 = session.parse().ok()?;
            began(Some(SessionId::from(session)), holder)
        }
        ("ended", None) => Some(TermState {
            token,
            holder: None,
            session: None,
        }),
        _ => None,
    }
}

/// The SQL expression of a `began` payload for the role, token and holder expressions.
pub(crate) fn began_sql(role: &str, token: &str, holder: &str) -> String {
    format!("{role} || chr(31) || 'began' || chr(31) || {token} || chr(31) || {holder}")
}

/// The SQL expression of a `began-in` payload for the role, token, session id and holder
/// expressions.
pub(crate) fn began_in_session_sql(role: &str, token: &str, session: &str, holder: &str) -> String {
    format!(
        "{role} || chr(31) || 'began-in' || chr(31) || {token} || chr(31) || {session} \
         || chr(31) || {holder}"
    )
}

/// The SQL expression of an `ended` payload for the role and token expressions.
pub(crate) fn ended_sql(role: &str, token: &str) -> String {
    format!("{role} || chr(31) || 'ended' || chr(31) || {token}")
}

/// The SQL that notifies `channel` of a role's state after a statement, then the bare
/// role for earlier tenures (see the module docs): two `pg_notify` calls in this order,
/// for a target list. `payload` is [`began_sql`], [`ended_sql`] or a `CASE` of them.
pub(crate) fn notify_sql(channel: &str, payload: &str, role: &str) -> String {
    format!("pg_notify({channel}, {payload}), pg_notify({channel}, {role})")
}

/// What one listener learned of each role's latest term since it last subscribed.
#[derive(Debug, Default)]
pub(crate) struct Terms {
    inner: Mutex<Known>,
}

#[derive(Debug, Default)]
struct Known {
    /// The listener subscription the states were learned in (0: not listening).
    generation: u64,
    roles: HashMap<Box<str>, TermState>,
    /// The last state notified, and the backend that sent it: a bare role right after
    /// it from the same backend is its companion.
    last: Option<(u32, Box<str>)>,
}

impl Terms {
    /// Forgets everything: the listener (re)subscribed as `generation`, or went down
    /// (0); notifications in the gap may have been lost.
    pub(crate) fn restart(&self, generation: u64) {
        let mut known = self.inner.lock();
        known.generation = generation;
        known.roles.clear();
        known.last = None;
    }

    /// Takes in one notification from backend `pid`; returns `None` for the companion
    /// bare role of a state just taken in (nobody needs to hear it twice), else the
    /// note to pass on to waiters.
    pub(crate) fn take_in(&self, pid: u32, note: Note) -> Option<Note> {
        let mut known = self.inner.lock();
        let last = known.last.take();
        match &note.state {
            Some(state) => {
                known.record(&note.role, state.clone());
                known.last = Some((pid, note.role.clone()));
            }
            None if note.bare && last.is_some_and(|(p, r)| p == pid && r == note.role) => {
                return None;
            }
            // An earlier tenure's statement (or an unreadable payload) changed the role
            // in a way this listener cannot tell: its waiters must read.
            None => {
                known.roles.remove(&note.role);
            }
        }
        Some(note)
    }

    /// The latest state of `role` learned in subscription `generation`, if any.
    pub(crate) fn get(&self, role: &str, generation: u64) -> Option<TermState> {
        let known = self.inner.lock();
        if known.generation != generation {
            return None;
        }
        known.roles.get(role).cloned()
    }

    /// Remembers `read`, a state of `role` read from the store after subscription
    /// `generation` was listening, unless a later one was learned meanwhile; returns the
    /// latest of the two.
    pub(crate) fn seed(&self, role: &str, generation: u64, read: TermState) -> TermState {
        let mut known = self.inner.lock();
        if known.generation != generation {
            return read;
        }
        match known.roles.get(role) {
            Some(state) if !read.supersedes(state) => state.clone(),
            _ => {
                known.record(role, read.clone());
                read
            }
        }
    }
}

impl Known {
    fn record(&mut self, role: &str, state: TermState) {
        if let Some(current) = self.roles.get_mut(role) {
            if state.supersedes(current) {
                *current = state;
            }
            return;
        }
        if self.roles.len() >= MAX_ROLES {
            self.roles.clear();
        }
        self.roles.insert(role.into(), state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn began(token: u64, holder: &str) -> Option<TermState> {
        Some(TermState {
            token: FencingToken::from(token),
            holder: Some(holder.into()),
            session: None,
        })
    }

    fn ended(token: u64) -> Option<TermState> {
        Some(TermState {
            token: FencingToken::from(token),
            holder: None,
            session: None,
        })
    }

    #[test]
    fn payloads_parse() {
        let parse = |payload: &str| Note::parse(payload);
        assert_eq!(
            parse("r\u{1f}began\u{1f}7\u{1f}node-b").state,
            began(7, "node-b")
        );
        assert_eq!(parse("r\u{1f}ended\u{1f}7").state, ended(7));
        // A holder is everything after the third separator.
        assert_eq!(
            parse("r\u{1f}began\u{1f}1\u{1f}a\u{1f}b").state,
            began(1, "a\u{1f}b")
        );
        assert_eq!(
            parse("r\u{1f}began-in\u{1f}7\u{1f}42\u{1f}node-b").state,
            Some(TermState {
                token: FencingToken::from(7),
                holder: Some("node-b".into()),
                session: Some(SessionId::from(42)),
            })
        );
        for unreadable in [
            "r\u{1f}began-in\u{1f}7\u{1f}42",
            "r\u{1f}began-in\u{1f}7\u{1f}42\u{1f}",
            "r\u{1f}began-in\u{1f}7\u{1f}x\u{1f}a",
            "r\u{1f}began-in\u{1f}7\u{1f}-1\u{1f}a",
            "r\u{1f}",
            "r\u{1f}began",
            "r\u{1f}began\u{1f}7",
            "r\u{1f}began\u{1f}7\u{1f}",
            "r\u{1f}began\u{1f}-1\u{1f}a",
            "r\u{1f}began\u{1f}x\u{1f}a",
            "r\u{1f}ended\u{1f}7\u{1f}a",
            "r\u{1f}ended\u{1f}99999999999999999999",
            "r\u{1f}moved\u{1f}7",
        ] {
            let note = parse(unreadable);
            assert_eq!(&*note.role, "r", "{unreadable:?}");
            assert_eq!(note.state, None, "{unreadable:?}");
        }
        let bare = parse("reports/eu");
        assert_eq!((&*bare.role, bare.state), ("reports/eu", None));
        assert_eq!(&*parse("").role, "");
    }

    #[test]
    fn answers_only_for_a_term_other_than_the_observed() {
        let at = FencingToken::from;
        let state = began(5, "b").unwrap();
        assert_eq!(
            state.answer(at(4)),
            Some(TermChange::Began {
                holder: "b".into(),
                fencing_token: at(5),
                session: None,
            })
        );
        assert_eq!(state.answer(at(5)), None, "the observed term itself");
        assert_eq!(state.answer(at(6)), None, "older than the observed");
        let state = ended(5).unwrap();
        assert_eq!(state.answer(at(5)), Some(TermChange::Ended));
        assert_eq!(state.answer(at(3)), Some(TermChange::Ended));
        assert_eq!(state.answer(at(6)), None);
    }

    #[test]
    fn companions_are_dropped_and_lone_bare_roles_forget() {
        let terms = Terms::default();
        terms.restart(1);
        let note = |p: &str| Note::parse(p);
        assert!(terms
            .take_in(10, note("r\u{1f}began\u{1f}2\u{1f}a"))
            .is_some());
        assert_eq!(terms.take_in(10, note("r")), None, "companion");
        assert_eq!(terms.get("r", 1), began(2, "a"));
        assert_eq!(terms.get("r", 2), None, "another subscription");
        // The same bare role again, or from another backend: an earlier tenure's.
        assert!(terms.take_in(10, note("r")).is_some());
        assert_eq!(terms.get("r", 1), None);
        assert!(terms
            .take_in(10, note("r\u{1f}began\u{1f}3\u{1f}b"))
            .is_some());
        assert!(terms.take_in(11, note("r")).is_some());
        assert_eq!(terms.get("r", 1), None);
        assert!(terms.take_in(10, note("r\u{1f}ended\u{1f}3")).is_some());
        assert!(terms.take_in(10, note("s")).is_some(), "another role's");
        assert_eq!(terms.get("r", 1), ended(3));
        // An unreadable payload is no companion, and forgets what was known.
        assert!(terms
            .take_in(10, note("r\u{1f}began\u{1f}4\u{1f}a"))
            .is_some());
        assert!(terms.take_in(10, note("r\u{1f}moved\u{1f}4")).is_some());
        assert_eq!(terms.get("r", 1), None);
        assert!(terms.take_in(10, note("r\u{1f}ended\u{1f}4")).is_some());
        terms.restart(2);
        assert_eq!(terms.get("r", 2), None);
    }

    #[test]
    fn states_never_go_back() {
        let terms = Terms::default();
        terms.restart(1);
        terms.take_in(1, Note::parse("r\u{1f}ended\u{1f}4"));
        terms.take_in(1, Note::parse("r\u{1f}began\u{1f}4\u{1f}a"));
        terms.take_in(1, Note::parse("r\u{1f}began\u{1f}3\u{1f}a"));
        assert_eq!(terms.get("r", 1), ended(4));
        // A read never replaces what a later notification said.
        assert_eq!(
            terms.seed("r", 1, began(4, "a").unwrap()),
            ended(4).unwrap()
        );
        assert_eq!(
            terms.seed("r", 1, began(6, "c").unwrap()),
            began(6, "c").unwrap()
        );
        assert_eq!(terms.get("r", 1), began(6, "c"));
        // A read from before a restart is not remembered.
        assert_eq!(terms.seed("q", 0, ended(1).unwrap()), ended(1).unwrap());
        assert_eq!(terms.get("q", 1), None);
    }
}
