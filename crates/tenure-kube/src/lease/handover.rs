//! Ending a term: [`tenure::LeaseStore::release`] hands the role to the oldest live
//! candidate (see [`super::queue`]) or frees it; [`tenure::LeaseStore::hand_over`] hands
//! it to a chosen one or changes nothing.
//!
//! Either is one conditional `PUT` of the role's object: on the version this store wrote
//! last (no read) when it wrote the term, else on the version just read. The candidates
//! are judged from the namespace watch's copies, so a handover costs the same however
//! many wait (a store whose watch has not listed the namespace yet lists the role's
//! candidacies once). The handed term:
//!
//! - `holderIdentity` the candidate, `leaseTransitions + 1` (so its token is the previous
//!   one + 1; a fresh epoch past `i32::MAX`, as any change of holder), `acquireTime` and
//!   `renewTime` now, the candidacy's value, no session;
//! - `leaseDurationSeconds` the candidacy's time left as this store judged it, rounded
//!   up to whole seconds: a candidate that died in the queue holds the role no longer
//!   than it would have stayed queued (give or take that second, and the time its
//!   readers take to see the write);
//! - its place listed as spent in `tenure.dev/used-candidacies`, so no later release
//!   picks it again.
//!
//! The candidate learns of it from the watch (`wait_for_successor`) and renews with one
//! `PUT` on the watch's copy. So a handover costs two requests: the release and the
//! successor's renewal. After the write, the release clears the candidacies of dead
//! candidates it judged lapsed (housekeeping, see [`super::queue`]): one request per dead
//! candidate, once.

use tenure::lease::{EndRequest, Handover};
use tenure::Result;

use super::queue::{next_in_line, Candidacy, Used};
use super::{set_session, KubeLeaseStore, ATTEMPTS};
use crate::record::{annotate, begin_term, micro_now, spec, token, Record, EPOCH, VALUE};

impl KubeLeaseStore {
    /// Ends the live term `(role, owner, token)` as `how` says; whether it did.
    pub(super) async fn close_term(&self, end: EndRequest<'_>) -> Result<bool> {
        end.validate()?;
        let (role, owner, token, how) = (end.role, end.owner, end.token, end.how);
        let successor = how.successor();
        // Later releases by this store judge candidates from the watch.
        self.watch.ensure(&self.api, &self.shared);
        let mut known = self
            .own_live(role, owner)
            .filter(|own| own.token == token)
            .map(|own| own.record);
        for _ in 0..ATTEMPTS {
            let record = match known.take() {
                Some(record) => record,
                None => {
                    let Some(seen) = self.read_role(role).await? else {
                        return Ok(false);
                    };
                    let judged = self.judge(seen).await?;
                    if judged.seen.record.holder.as_deref() != Some(owner)
                        || judged.token != Some(token)
                        || !judged.live
                    {
                        return Ok(false);
                    }
                    judged.seen.record
                }
            };
            let view = self.candidacies(role).await?;
            let now = self.instant();
            let mut used = Used::of(&record);
            used.prune(&view);
            let next = next_in_line(&view, &used, owner, successor, now);
            if next.is_none() && matches!(how, Handover::To(_)) {
                return Ok(false);
            }
            let mut lease = record.to_write();
            set_session(&mut lease, None);
            match next {
                Some(candidate) => {
                    used.spend(candidate);
                    self.begin_handed(&mut lease, &record, candidate, now)
                        .await?;
                }
                None => {
                    annotate(&mut lease, VALUE, None);
                    let spec = spec(&mut lease);
                    spec.holder_identity = None;
                    spec.renew_time = Some(micro_now());
                }
            }
            self.clear_dropped(role, &mut used).await?;
            used.write(&mut lease);
            // Whatever the answer, this store's copy of the term is over.
            self.own.lock().remove(role);
            if self.replace(&record.object, &lease).await?.is_some() {
                self.clear_lapsed(&view, &used, now).await;
                return Ok(true);
            }
        }
        Err(self.lost_races(role))
    }

    /// Writes `candidate`'s term into `lease`, read as `record`, at `now`.
    async fn begin_handed(
        &self,
        lease: &mut k8s_openapi::api::coordination::v1::Lease,
        record: &Record,
        candidate: &Candidacy,
        now: tokio::time::Instant,
    ) -> Result<()> {
        let (epoch, transitions) = self.next_term(record).await?;
        // The candidacy's time left, rounded up: a whole second at least.
        let left = candidate.until.saturating_duration_since(now);
        let secs = left.as_secs() + u64::from(left.subsec_nanos() > 0);
        let secs = i32::try_from(secs.max(1)).unwrap_or(i32::MAX);
        annotate(lease, EPOCH, Some(epoch.to_string()));
        annotate(lease, VALUE, candidate.value().map(str::to_owned));
        let holder = candidate.owner.as_deref().unwrap_or_default();
        begin_term(lease, holder, secs, Some(transitions));
        // Checked here so a token past the largest fails before anything is written.
        token(epoch, transitions)?;
        Ok(())
    }
}
