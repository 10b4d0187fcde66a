//! Sessions on the Kubernetes API: one Lease object per session, `tenure.session-ID`.
//!
//! The session object holds the owner and the TTL; a role held under the session names
//! it (annotation and label) and is live exactly while the session is. A keep-alive is one
//! conditional write of the session object however many roles it holds. A session ends
//! by a conditional write that marks it ended (`tenure.dev/ended`), made by `close`, by
//! the owner's own store once its TTL passed on its clock, or by a contender that watched
//! it stay unchanged for its TTL. That write is conditional on the version the writer
//! judged, so it and a late keep-alive cannot both succeed: either the keep-alive landed
//! first and the contender reads again and finds the session alive, or the session is
//! ended and the keep-alive answers that it ended. An ended session is never revived.
//! Ids come from the namespace's epoch counter, so they are never handed out twice.

use std::time::Duration;

use tenure::lease::validate_name;
use tenure::session::validate_open;
use tenure::{Error, LeaseResult, LeaseStore, Result, SessionGrant, SessionId};
use tokio::time::Instant;

use super::{session_view_of, KubeLeaseStore, Seen, SessionView, ATTEMPTS};
use crate::names::session_name;
use crate::record::{annotate, begin_term, micro_now, new_object, spec, ttl_secs, Record, ENDED};

/// What this store knows of a session it opened or used.
#[derive(Clone, Debug)]
pub(crate) struct SessionState {
    owner: String,
    /// The session object as last written or read: keep-alives are conditional on it.
    record: Record,
    /// The end of the session on this process's clock.
    expires: Instant,
    ended: bool,
}

impl KubeLeaseStore {
    pub(super) async fn open(&self, owner: &str, ttl: Duration) -> Result<SessionGrant> {
        validate_open(owner, ttl, self.min_ttl(), self.shared.observer.now())?;
        let secs = ttl_secs("ttl", ttl)?;
        let id = self.allocate_epoch().await?;
        let object = session_name(id);
        let mut lease = new_object(&object, "session", Some(&format!("{id:x}")));
        begin_term(&mut lease, owner, secs, None);
        let sent = self.instant();
        let created = self
            .api
            .create(&kube::api::PostParams::default(), &lease)
            .await
            .map_err(|error| self.error("create", &object, error))?;
        self.wrote(&object, &created, sent);
        let state = SessionState {
            owner: owner.to_owned(),
            record: Record::read_any(created)?,
            expires: sent + ttl,
            ended: false,
        };
        self.sessions.lock().insert(id, state);
        self.conn.links.kept(owner, id, sent, true);
        Ok(self.grant(id, owner, sent + ttl, sent))
    }

    fn grant(&self, id: u64, owner: &str, expires: Instant, at: Instant) -> SessionGrant {
        SessionGrant {
            id: SessionId::from(id),
            owner: owner.to_owned(),
            expires_at: self.wall(expires),
            now: self.wall(at),
            peers_lapse: None,
            terms_handed: None,
            latest_change: None,
        }
    }

    /// The session as this store knows it, read from the API server the first time;
    /// `None` once it ended.
    async fn state(&self, id: u64) -> Result<Option<SessionState>> {
        if let Some(state) = self.sessions.lock().get(&id) {
            return Ok((!state.ended).then(|| state.clone()));
        }
        let state = match self.session_view(id).await? {
            SessionView::Ended => return Ok(None),
            SessionView::Open(seen) => SessionState {
                owner: seen.record.holder.clone().unwrap_or_default(),
                expires: seen.first + seen.record.duration,
                record: seen.record,
                ended: false,
            },
        };
        self.sessions.lock().insert(id, state.clone());
        Ok(Some(state))
    }

    fn mark_ended(&self, id: u64) {
        if let Some(state) = self.sessions.lock().get_mut(&id) {
            state.ended = true;
        }
        self.conn.links.ended(id);
    }

    /// The live session `id` on this process's clock, or [`Error::SessionEnded`] (ending
    /// it in the store if its time ran out here).
    async fn live_state(&self, id: u64) -> Result<SessionState> {
        let Some(state) = self.state(id).await? else {
            return Err(Error::SessionEnded(SessionId::from(id)));
        };
        if self.instant() >= state.expires {
            self.end_session(&state.record).await?;
            self.mark_ended(id);
            return Err(Error::SessionEnded(SessionId::from(id)));
        }
        Ok(state)
    }

    pub(super) async fn keep_alive(&self, id: u64, ttl: Duration) -> Result<Option<SessionGrant>> {
        tenure::lease::validate_ttl(ttl, self.min_ttl(), self.shared.observer.now())?;
        let secs = ttl_secs("ttl", ttl)?;
        for _ in 0..ATTEMPTS {
            let mut state = match self.live_state(id).await {
                Ok(state) => state,
                Err(Error::SessionEnded(_)) => return Ok(None),
                Err(error) => return Err(error),
            };
            // Never shorter than the window already promised: others count the new
            // duration from when they see this write, which is after it was sent.
            let secs = secs.max(i32::try_from(state.record.duration.as_secs()).unwrap_or(secs));
            let mut lease = state.record.to_write();
            let spec = spec(&mut lease);
            spec.lease_duration_seconds = Some(secs);
            spec.renew_time = Some(micro_now());
            match self.replace_read(&state.record.object, &lease).await? {
                Some((sent, written)) => {
                    state.record = written;
                    state.expires = state.expires.max(sent + ttl);
                    let grant = self.grant(id, &state.owner, state.expires, sent);
                    self.conn.links.kept(&state.owner, id, sent, true);
                    self.sessions.lock().insert(id, state);
                    return Ok(Some(grant));
                }
                None => {
                    // Ended by someone else, or changed by our own earlier keep-alive
                    // that landed after we gave up on it: read and judge again.
                    match self.session_view(id).await? {
                        SessionView::Open(seen)
                            if seen.record.holder.as_deref() == Some(&state.owner) =>
                        {
                            if let Some(known) = self.sessions.lock().get_mut(&id) {
                                known.record = seen.record;
                            }
                        }
                        _ => {
                            self.mark_ended(id);
                            return Ok(None);
                        }
                    }
                }
            }
        }
        Err(self.lost_races(&session_name(id)))
    }

    pub(super) async fn acquire_under(&self, role: &str, id: u64) -> Result<LeaseResult> {
        validate_name("role", role)?;
        let state = self.live_state(id).await?;
        let secs = i32::try_from(state.record.duration.as_secs())
            .unwrap_or(i32::MAX)
            .max(1);
        let held = |token| LeaseResult {
            acquired: true,
            fencing_token: token,
            expires_at: self.wall(state.expires),
            holder: state.owner.clone(),
            now: self.shared.observer.now(),
        };
        if let Some((token, ..)) = self
            .take_watched(role, &state.owner, secs, Some(id), None)
            .await?
        {
            return Ok(held(token));
        }
        for _ in 0..ATTEMPTS {
            let Some(seen) = self.read_or_create(role).await? else {
                continue;
            };
            let judged = self.judge(seen).await?;
            if let (Some(token), true) = (judged.token, judged.session == Some(id)) {
                if judged.seen.record.holder.is_some() {
                    return Ok(held(token));
                }
            }
            if judged.live {
                return self.refusal(&judged);
            }
            if let Some((token, ..)) = self
                .take(&judged, role, &state.owner, secs, Some(id), None)
                .await?
            {
                return Ok(held(token));
            }
        }
        Err(self.lost_races(role))
    }

    pub(super) async fn close(&self, id: u64) -> Result<bool> {
        for _ in 0..ATTEMPTS {
            let Some((record, first)) = self.read(&session_name(id)).await? else {
                self.mark_ended(id);
                return Ok(false);
            };
            let SessionView::Open(seen) = session_view_of(Seen { record, first }) else {
                self.mark_ended(id);
                return Ok(false);
            };
            if self.end_session(&seen.record).await? {
                return Ok(true);
            }
        }
        Err(self.lost_races(&session_name(id)))
    }

    /// Marks a session ended with a write conditional on `record`'s version; false when
    /// the object changed since (read again).
    pub(super) async fn end_session(&self, record: &Record) -> Result<bool> {
        let mut lease = record.to_write();
        annotate(&mut lease, ENDED, Some("true".to_owned()));
        let spec = spec(&mut lease);
        spec.holder_identity = None;
        spec.renew_time = Some(micro_now());
        let ended = self.replace(&record.object, &lease).await?.is_some();
        if ended {
            if let Some(id) = record
                .annotations
                .get(crate::record::NAME)
                .and_then(|id| u64::from_str_radix(id, 16).ok())
            {
                self.mark_ended(id);
            }
        }
        Ok(ended)
    }
}
