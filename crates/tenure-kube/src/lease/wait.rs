//! Waiting on a role by the namespace watch: for its term to end
//! ([`tenure::LeaseStore::wait_for_change`]), for a new one to begin
//! ([`tenure::LeaseStore::wait_for_term`]), and for what replaced a term
//! ([`tenure::LeaseStore::wait_for_successor`]).
//!
//! `wait_for_successor` sends no request at all once the watch has listed the namespace:
//! it judges the watch's copy of the role, and each event on the role (a renewal, a
//! release, a handover) is judged again from the copy the event brought. The object in
//! the event names the holder, and its epoch and `leaseTransitions` give the token, so
//! a hundred candidates waiting on one role cost the API server nothing when a release
//! hands the role to one of them. A term that lapses unreleased is seen lapsing on this
//! process's clock, as every judgement is.

use tenure::{FencingToken, TermChange};
use tokio::time::Instant;

use super::{session_view_of, KubeLeaseStore, Seen};
use crate::names::{object_name, session_name, Kind};
use crate::record::Record;

/// What the watch's copy of a role says of an observed term.
enum Verdict {
    /// The answer.
    Answer(TermChange),
    /// The term may go on: wait for an event on the role (and on the session it is held
    /// under, if any), or until `lapses`, when it ends unless renewed.
    Wait {
        lapses: Option<Instant>,
        session: Option<String>,
    },
}

impl KubeLeaseStore {
    pub(super) async fn change(&self, role: &str, observed: FencingToken, deadline: Instant) {
        self.watch.ensure(&self.api, &self.shared);
        let object = object_name(Kind::Role, role);
        let notify = self.shared.notify_of(&object);
        let changed = notify.notified();
        let mut changed = std::pin::pin!(changed);
        changed.as_mut().enable();
        let session_notify;
        let mut session_changed = None;
        match self.read_role(role).await {
            Ok(Some(seen)) => {
                let Ok(judged) = self.judge(seen).await else {
                    tokio::time::sleep_until(deadline).await;
                    return;
                };
                if judged.token != Some(observed) || !judged.live {
                    return;
                }
                if let Some(id) = judged.session {
                    session_notify = self.shared.notify_of(&session_name(id));
                    session_changed = Some(Box::pin(session_notify.notified()));
                }
            }
            Ok(None) => return,
            Err(error) => {
                tracing::debug!(role, %error, "reading the role before waiting failed");
            }
        }
        let session_wait = async {
            match session_changed.as_mut() {
                Some(future) => future.as_mut().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = changed => {}
            _ = session_wait => {}
            _ = tokio::time::sleep_until(deadline) => {}
        }
    }

    pub(super) async fn term(&self, role: &str, after: FencingToken, deadline: Instant) {
        self.watch.ensure(&self.api, &self.shared);
        let notify = self.shared.notify_of(&object_name(Kind::Role, role));
        let changed = notify.notified();
        let mut changed = std::pin::pin!(changed);
        // Registered before the read, so a term begun after it still wakes this wait.
        changed.as_mut().enable();
        match self.read_role(role).await {
            Ok(Some(seen)) => match seen.record.token() {
                Ok(Some(token)) if token > after => return,
                Ok(_) => {}
                Err(_) => {
                    tokio::time::sleep_until(deadline).await;
                    return;
                }
            },
            Ok(None) => {}
            Err(error) => {
                tracing::debug!(role, %error, "reading the role before waiting failed");
            }
        }
        tokio::select! {
            _ = changed => {}
            _ = tokio::time::sleep_until(deadline) => {}
        }
    }

    pub(super) async fn successor(
        &self,
        role: &str,
        observed: FencingToken,
        deadline: Instant,
    ) -> TermChange {
        self.watch.ensure(&self.api, &self.shared);
        // One list per store, when it first waits; a broken watch sleeps to the deadline.
        if !self.shared.wait_synced(deadline).await {
            return TermChange::Unknown;
        }
        let object = object_name(Kind::Role, role);
        let notify = self.shared.notify_of(&object);
        loop {
            let changed = notify.notified();
            let mut changed = std::pin::pin!(changed);
            // Registered before judging, so an event after the judgement still wakes.
            changed.as_mut().enable();
            let (lapses, session) = match self.verdict(role, &object, observed) {
                Verdict::Answer(change) => return change,
                Verdict::Wait { lapses, session } => (lapses, session),
            };
            let session_notify = session.map(|name| self.shared.notify_of(&name));
            let session_wait = async {
                match &session_notify {
                    Some(notify) => notify.notified().await,
                    None => std::future::pending().await,
                }
            };
            let wake = lapses.map_or(deadline, |lapses| lapses.min(deadline));
            tokio::select! {
                _ = changed => {}
                _ = session_wait => {}
                _ = tokio::time::sleep_until(wake) => {
                    if Instant::now() >= deadline {
                        return TermChange::Unknown;
                    }
                }
            }
        }
    }

    /// Judges the watch's copy of the role against the observed term.
    fn verdict(&self, role: &str, object: &str, observed: FencingToken) -> Verdict {
        let wait = Verdict::Wait {
            lapses: None,
            session: None,
        };
        let Some((lease, first)) = self.shared.cached(object) else {
            // Not delivered yet (the caller saw a term, so the object exists).
            return wait;
        };
        let Ok(record) = Record::read(lease, role) else {
            // The caller's next call reads it and reports what is wrong.
            return Verdict::Answer(TermChange::Unknown);
        };
        if self
            .shared
            .observer
            .first_sighting(object, &record.version)
            .is_none()
        {
            // This process read a newer version than the watch has delivered.
            return wait;
        }
        let token = match record.token() {
            Ok(Some(token)) => token,
            // An object with no term yet: recreated since the observed term.
            Ok(None) => return Verdict::Answer(TermChange::Ended),
            Err(_) => return Verdict::Answer(TermChange::Unknown),
        };
        if token < observed {
            // Older than what the caller saw: its event is on its way.
            return wait;
        }
        let session = match record.session() {
            Ok(session) => session.map(session_name),
            Err(_) => return Verdict::Answer(TermChange::Unknown),
        };
        let (lapses, view) = match &session {
            None => (first + record.duration, None),
            Some(name) => match self.shared.cached(name) {
                Some((lease, first)) => {
                    let Ok(record) = Record::read_any(lease) else {
                        return Verdict::Answer(TermChange::Unknown);
                    };
                    let lapses = first + record.duration;
                    (lapses, Some(session_view_of(Seen { record, first })))
                }
                // The session's object has not been delivered: wait for it.
                None => {
                    return Verdict::Wait {
                        lapses: None,
                        session,
                    }
                }
            },
        };
        let holder = record.holder.clone();
        let Ok(judged) = self.judge_with(Seen { record, first }, view) else {
            return Verdict::Answer(TermChange::Unknown);
        };
        match holder {
            Some(_) if token == observed && judged.live => Verdict::Wait {
                lapses: Some(lapses),
                session,
            },
            // No session named: this backend hands no term to a session.
            Some(holder) if judged.live => Verdict::Answer(TermChange::Began {
                holder,
                fencing_token: token,
                session: None,
            }),
            _ => Verdict::Answer(TermChange::Ended),
        }
    }
}
