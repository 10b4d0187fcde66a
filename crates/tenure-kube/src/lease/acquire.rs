//! Acquiring and renewing a role: [`LeaseStore::try_acquire_or_renew_with_value`] and,
//! for a contender that waits its turn, [`LeaseStore::try_acquire_or_queue`], which also
//! keeps the caller's place in the role's queue when another owner holds the term (see
//! [`super::queue`]).
//!
//! Where the store can, a call answers from what it already knows, with one write and
//! no read: the term it wrote last (a renewal), or the namespace watch's copy of the
//! role (a takeover of a term that ended; a renewal by the owner the copy names, such as
//! a candidate a release handed the role to; a queued contender's refusal). Every such
//! write is conditional on the version it was judged on, so a stale copy only costs a
//! 409 and a read.
//!
//! [`LeaseStore::try_acquire_or_renew_with_value`]: tenure::LeaseStore::try_acquire_or_renew_with_value
//! [`LeaseStore::try_acquire_or_queue`]: tenure::LeaseStore::try_acquire_or_queue

use std::time::Duration;

use tenure::lease::AcquireRequest;
use tenure::{LeaseResult, LeaseStore, Result};

use super::queue::Used;
use super::{set_session, Judged, KubeLeaseStore, ATTEMPTS};
use crate::record::{micro_now, spec, ttl_secs};

impl KubeLeaseStore {
    /// One acquire-or-renew step; `queue` also keeps the caller's place in the queue
    /// when another owner holds the live term.
    pub(super) async fn acquire(&self, request: AcquireRequest<'_>) -> Result<LeaseResult> {
        let (role, owner, ttl) = (request.role, request.owner, request.ttl);
        let (value, queue) = (request.value, request.queue);
        request.validate(self.min_ttl(), self.shared.observer.now())?;
        let secs = ttl_secs("ttl", ttl)?;
        if queue {
            // Releases, and this contender's waits, judge candidacies from the watch: it
            // runs from the first queued call on.
            self.watch.ensure(&self.api, &self.shared);
        }
        if let Some(own) = self.own_live(role, owner) {
            let mut lease = own.record.to_write();
            let spec = spec(&mut lease);
            spec.lease_duration_seconds = Some(secs);
            spec.renew_time = Some(micro_now());
            if let Some((sent, record)) = self.replace_read(&own.record.object, &lease).await? {
                return Ok(self.hold(role, owner, own.token, sent, record, ttl));
            }
        } else if let Some(answer) = self
            .answer_watched(role, owner, ttl, secs, value, queue)
            .await?
        {
            return Ok(answer);
        }
        for _ in 0..ATTEMPTS {
            let Some(seen) = self.read_or_create(role).await? else {
                continue;
            };
            let judged = self.judge(seen).await?;
            let ours = judged.seen.record.holder.as_deref() == Some(owner);
            if judged.live && !ours {
                if queue {
                    let used = Used::of(&judged.seen.record);
                    self.queue_up(role, owner, secs, value, &used).await?;
                }
                return self.refusal(&judged);
            }
            if judged.live {
                match self.renew(&judged, role, owner, ttl, secs).await? {
                    Some(answer) => return Ok(answer),
                    None => continue,
                }
            }
            if let Some((token, sent, record)) =
                self.take(&judged, role, owner, secs, None, value).await?
            {
                return Ok(self.hold(role, owner, token, sent, record, ttl));
            }
        }
        Err(self.lost_races(role))
    }

    /// Answers from the watch's copy of the role where it can (see the module docs);
    /// `None` sends the caller to read.
    async fn answer_watched(
        &self,
        role: &str,
        owner: &str,
        ttl: Duration,
        secs: i32,
        value: Option<&str>,
        queue: bool,
    ) -> Result<Option<LeaseResult>> {
        let Some(seen) = self.watched_role(role)? else {
            return Ok(None);
        };
        let judged = self.judge(seen).await?;
        if !judged.live {
            let taken = self.take(&judged, role, owner, secs, None, value).await?;
            return Ok(
                taken.map(|(token, sent, record)| self.hold(role, owner, token, sent, record, ttl))
            );
        }
        let ours = judged.seen.record.holder.as_deref() == Some(owner);
        if ours && judged.session.is_none() {
            // The owner the copy names renews on it: a candidate that a release handed
            // the role to renews with this one write.
            return self.renew(&judged, role, owner, ttl, secs).await;
        }
        if !ours && queue && self.shared.synced() {
            // A queued contender's refusal may come from the copy: what it waits on is
            // its place, and a release the copy has not shown yet is answered by
            // `wait_for_successor` as soon as its event arrives.
            let used = Used::of(&judged.seen.record);
            self.queue_up(role, owner, secs, value, &used).await?;
            return self.refusal(&judged).map(Some);
        }
        Ok(None)
    }

    /// Renews the live term `judged` of `owner` (a term held under a session becomes a
    /// plain lease of its own); `None` when the write lost.
    async fn renew(
        &self,
        judged: &Judged,
        role: &str,
        owner: &str,
        ttl: Duration,
        secs: i32,
    ) -> Result<Option<LeaseResult>> {
        let mut lease = judged.seen.record.to_write();
        set_session(&mut lease, None);
        let spec = spec(&mut lease);
        spec.lease_duration_seconds = Some(secs);
        spec.renew_time = Some(micro_now());
        let Some((sent, record)) = self
            .replace_read(&judged.seen.record.object, &lease)
            .await?
        else {
            return Ok(None);
        };
        let token = judged.live_token()?;
        Ok(Some(self.hold(role, owner, token, sent, record, ttl)))
    }
}
