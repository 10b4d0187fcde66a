//! One running member of a shard group: its terms, its loop over wake-ups, and how a
//! term's work ends (returned, or wound down for a handover) and its shard is released.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::assignment::Assignment;
use super::membership::Membership;
use super::plan::{start_handovers, Joining, MembersSeen};
use super::probe::{Probes, PROBE_WAIT};
use super::session::Session;
use super::*;
use crate::TermChange;

/// One shard term running here.
pub(super) struct Term {
    pub(super) token: FencingToken,
    pub(super) leadership: CancellationToken,
    pub(super) task: JoinHandle<Result<()>>,
    /// Being handed over (its work was cancelled; it is released when the work ends).
    pub(super) handing_over: bool,
    /// Taken while targeted at another member (an orphan): handed to that member once it
    /// owns some shard, or after [`RESCUE_HOLD`] TTLs, so a member that heartbeats but
    /// never works cannot strand shards by having them handed to it, and a healthy one
    /// that owns nothing yet still gets its targets.
    pub(super) rescued: bool,
    /// When the term began here.
    pub(super) started: Instant,
    /// Handed over as a probe to a target working on no shard (see [`super::probe`]).
    pub(super) probe: bool,
}

/// The store's answer for one shard of a batch, with what it was for.
pub(super) struct Contended {
    pub(super) shard: u32,
    /// Taken as a rescue (targeted at another member).
    pub(super) rescued: bool,
    pub(super) role: String,
    /// The store's answer.
    pub(super) result: crate::LeaseResult,
}

/// What woke the member's loop.
pub(super) enum Wake {
    /// The work of a shard's term ended (returned, or wound down after a cancel); the
    /// token tells a late wake of an earlier term from one of the current term.
    WorkEnded(u32, FencingToken),
    /// The store pushed a change of a shard held elsewhere that this member waits for
    /// (or the wait ran out), and what the push said of it.
    ShardChanged(u32, TermChange),
    /// A probe's target took the shard, or the probe is due to be taken back.
    ProbeSettled(u32),
}

/// The mutable side of one running member.
pub(super) struct Member<'a> {
    pub(super) elector: &'a ShardElector,
    pub(super) session: Option<Session>,
    /// Its heartbeats into the group (none while drained).
    pub(super) membership: Membership,
    /// Drained: out of the membership, contending for nothing, handing every shard over.
    pub(super) draining: bool,
    /// Drains asked in process and through the store; drained while either is set.
    pub(super) drains: [watch::Receiver<bool>; 2],
    /// The members the last look saw working on some shard.
    pub(super) working: BTreeSet<String>,
    /// The live owner of each shard at the last look: whose shards a member that left
    /// since held (see `departed_shards`).
    pub(super) owners: Assignment,
    /// The targets last published (as `ShardState::target`), by member index: what
    /// wakes and the next waves of handovers act on between looks, and a look whose
    /// targets are these does not build that map of a `String` per shard again.
    pub(super) target: Assignment,
    /// Probes of targets that work on no shard yet.
    pub(super) probes: Probes,
    pub(super) terms: BTreeMap<u32, Term>,
    /// Shards whose term here began, ended or began handing over since the view was
    /// last published: what [`Member::publish_owned`] applies to the published `owned`,
    /// so that publishing costs what changed, not every shard held (once per batch of
    /// acquires, rebuilding it from every term made winning a large share quadratic).
    pub(super) owned_changes: BTreeSet<u32>,
    /// Shards whose work returned on its own: not taken again before then.
    pub(super) cooling: HashMap<u32, Instant>,
    /// When this member first saw each shard with no live owner.
    pub(super) orphaned_since: HashMap<u32, Instant>,
    /// When each member was last seen live (for `rebalance_delay`).
    pub(super) last_seen: HashMap<String, Instant>,
    /// Shards held elsewhere whose store push one waiter task is waiting for (one per
    /// shard: a waiter per reconcile would multiply with every wake).
    pub(super) waiting: BTreeSet<u32>,
    /// When the last read of the group showed the first change due (a term targeted
    /// here lapsing, a probe due back), if any.
    pub(super) next_look: Option<Instant>,
    /// When the last read of the members showed the first other member's membership
    /// lapsing unless it heartbeats, if any: a read of the members (not of every shard)
    /// then tells whether the group must be read.
    pub(super) next_lapse: Option<Instant>,
    /// Releases that failed or timed out, by shard: the store may still apply each
    /// one, so no work starts under its token (a late release would end that term under
    /// it); each look releases the shard again until one answers.
    pub(super) pending_releases: BTreeMap<u32, FencingToken>,
    /// The latest term of each shard that this member worked on, released or handed
    /// over under the current session. A push is heard late at times (a slow listener,
    /// a stalled process): one saying that a term at or below this one was handed here
    /// is about a term already ended here, and another member may hold the shard now.
    pub(super) latest_terms: BTreeMap<u32, FencingToken>,
    /// Shards whose acquire under the current session got an error: the store may have
    /// granted it, then or later, with no term here. A live session would keep such a
    /// shard from its target for good, so each look takes it (targeted here) or releases
    /// it (targeted elsewhere) whenever the store shows it held by this member with no
    /// term here. Kept for the session's life: the request may still be on its way.
    pub(super) lost_acquires: BTreeSet<u32>,
    /// When the last acquire was lost (see `lost_acquires`). Such an acquire may land
    /// with no push here: the member is not settled for [`LOST_ACQUIRE_LANDS_TTLS`]
    /// TTLs after, so it keeps looking every retry interval while it is likely to.
    pub(super) lost_acquire_at: Option<Instant>,
    /// The last look found nothing to do: every shard owned by the member the plan
    /// targets, none to take, hand over, wait for or release here. Looks are then
    /// [`SETTLED_LOOK_TTLS`] TTLs apart (each reads what changed in the group, every
    /// shard on a store that reads only completely); joins and
    /// leaves are pushed, and a membership due to lapse has its own read of the members
    /// (a look if it did lapse). A read of the group that shows a change clears it.
    pub(super) settled: bool,
    /// How many looks in a row left this member short of its share (a shard targeted
    /// here not worked on here). Members plan from the owners each saw at its own look,
    /// so while shards move their plans disagree: one may hand a shard to a member whose
    /// plan did not target it, and that member, not waiting on it, hears no push. The
    /// free shard leaves some member short (shares add up to the group's size); that
    /// member looks again soon, after [`SHORT_LOOK_DIVISOR`]-th of the retry interval,
    /// doubled at each look that still finds it short, so a member short for long (a
    /// join waiting for handovers) costs a few extra looks, not one per division.
    pub(super) short_looks: u32,
    /// While looks are put off until a departed member's session ends (see
    /// `reconcile`): when the first refusal said it ends. Looks are put off only until
    /// then, so a holder that lives on (its term renewed) is read as any other.
    pub(super) look_put_off: Option<Instant>,
    /// The copy of the group's leases each look brings up to date.
    pub(super) view: crate::LeaseCopy<u32>,
    /// The members the last look planned for: a look that finds the group and these
    /// unchanged keeps a settled plan (see `still_settled`).
    pub(super) planned: Vec<String>,
    /// The shards the last look targeted here.
    pub(super) targeted_here: Vec<u32>,
}

impl Drop for Member<'_> {
    /// Shard work runs on tasks of its own: if `run` is dropped mid-term (the caller's
    /// select! moved on, its task was aborted), nothing renews the session any more, so
    /// every shard's work must be told it no longer leads.
    fn drop(&mut self) {
        for term in self.terms.values() {
            term.leadership.cancel();
        }
        // It works on nothing now, and a later run's publishes only apply changes to what
        // was published: dropped mid-run, it publishes that it owns nothing.
        self.terms.clear();
        let published: Vec<u32> = self.elector.state.borrow().owned.keys().copied().collect();
        self.owned_changes.extend(published);
        self.publish_owned();
    }
}

impl Member<'_> {
    pub(super) fn options(&self) -> &ShardOptions {
        &self.elector.options
    }

    pub(super) async fn run<W, Fut>(
        &mut self,
        work: &mut W,
        shutdown: &CancellationToken,
        wake_tx: &mpsc::UnboundedSender<Wake>,
        wake_rx: &mut mpsc::UnboundedReceiver<Wake>,
        joining: Joining,
    ) -> Result<()>
    where
        W: FnMut(u32, FencingToken, CancellationToken) -> Fut,
        Fut: Future + Send + 'static,
        Fut::Output: WorkOutcome,
    {
        let joined = Instant::now();
        let retry = self.options().retry_interval;
        // Cold: the first look once no member joined for a quiet spell, and no later than
        // a retry interval after joining (see `Joining::Cold`).
        let quiet = retry / GATHER_QUIET_DIVISOR;
        let mut gathering = matches!(joining, Joining::Cold(_)).then_some(joined + retry);
        let (mut look, mut observed) = match joining {
            Joining::Prepared(seen) => {
                self.next_look = Some(joined + retry);
                (false, seen)
            }
            Joining::Cold(seen) => {
                self.next_look = Some(joined + quiet);
                (false, seen)
            }
            Joining::Unprepared => (true, MembersSeen::default()),
        };
        let mut looked_at = Instant::now();
        loop {
            if self.session.is_none() {
                self.open_session(shutdown).await;
                if shutdown.is_cancelled() {
                    break;
                }
                // In the group again, unless drained.
                self.follow_drains().await;
                look = true;
            }
            if look {
                looked_at = Instant::now();
                gathering = None;
                let looked = self.reconcile(work, wake_tx).await;
                // How long pushes waited behind it: they are acted on between looks.
                debug!(took = ?looked_at.elapsed(), settled = self.settled, "looked at the group");
                observed = match looked {
                    Ok(members) => members,
                    Err(error) => {
                        warn!(group = %self.options().group, %error, "could not read the group; retrying");
                        // It did not see the group: not settled, so it looks again a
                        // retry interval later.
                        self.settled = false;
                        observed
                    }
                };
            }
            look = true;
            let Some((alive, handed_unseen, change_unseen, tells_changes)) =
                self.session.as_ref().map(|s| {
                    let (handed, latest) = (&s.terms_handed, &s.latest_change);
                    (
                        s.alive.clone(),
                        handed.unseen(),
                        latest.unseen(),
                        latest.is_told(),
                    )
                })
            else {
                continue;
            };
            // Look again a retry interval (SETTLED_LOOK_TTLS TTLs once settled) after the
            // last look, or sooner when it showed something about to lapse (see
            // `reconcile`). From the last look, not from now: wakes that do not look (a
            // push acted on, a read of the members that found them unchanged) come as
            // often as the store pushes, and must not put the next look off for good.
            let now = Instant::now();
            let every = if self.settled {
                let ttls = if tells_changes {
                    SETTLED_LOOK_TTLS_TOLD
                } else {
                    SETTLED_LOOK_TTLS
                };
                (self.options().lease_ttl * ttls).max(self.options().retry_interval)
            } else {
                self.options().retry_interval
            };
            let due = self.next_look.unwrap_or(looked_at + every);
            // Put off until a departed member's session ends: not sooner, or the look
            // would read the group while its shards are still held.
            let look_again = if self.look_put_off.is_some() {
                due
            } else {
                (looked_at + every).min(due)
            }
            .max(now + MIN_LOOK);
            self.take_peers_lapse(&observed);
            let lapse_check = self.next_lapse.map_or(look_again, |lapse| {
                lapse.max(now + MIN_LOOK).min(look_again)
            });
            let registry = self.elector.registry.clone();
            let members_changed = registry.wait_for_members_change(&observed.registry, lapse_check);
            let [local, stored] = &mut self.drains;
            let drains = async {
                tokio::select! {
                    biased;
                    _ = changed(local) => {}
                    _ = changed(stored) => {}
                }
            };
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = drains => {
                    self.follow_drains().await;
                    continue;
                }
                _ = alive.cancelled() => self.lose_everything().await,
                // A term handed to the session that no push told of (a handover that
                // landed late, or one planned from another view of the group): the look
                // reads it and works on it, or hands it on to its target. Only when
                // settled: an unsettled member looks again soon anyway, and a look that
                // is put off (a departed member's session still holds its shards) reads
                // no group, so it would see nothing and be brought again at once.
                _ = handed_unseen, if self.settled => {
                    debug!("a keep-alive counts a term handed here that no push told of");
                }
                // Settled, and a lease changed since the last read of the group: a
                // change no push told of (a shard released from outside) is read now,
                // not at the timer's look. Not while unsettled: such a member looks
                // soon anyway, and a cold group's members wait for each other to join.
                _ = change_unseen, if self.settled => {
                    debug!("a keep-alive tells of a change since the last read of the group");
                }
                Some(wake) = wake_rx.recv() => {
                    // Wakes come in bursts (a member handing several shards over): act
                    // on all that are queued at once.
                    let mut wakes = vec![wake];
                    while let Ok(wake) = wake_rx.try_recv() {
                        wakes.push(wake);
                    }
                    look = self.woken(wakes, work, wake_tx).await;
                }
                _ = members_changed => {
                    let now = Instant::now();
                    if let Some(until) = gathering.filter(|_| now < look_again) {
                        // Seen, not looked at: the first look plans with all who came, a
                        // quiet spell after the last of them joined.
                        look = match self.group_members().await {
                            Ok(seen) => {
                                if seen.group != observed.group {
                                    self.next_look = Some((now + quiet).min(until));
                                }
                                observed = seen;
                                false
                            }
                            Err(_) => true,
                        };
                    } else if now < look_again {
                        // Due to read the members, unless a keep-alive since says no
                        // member lapses yet: wait again (a change that also woke the
                        // wait wakes the next one at once).
                        let lapse_put_off = now >= lapse_check && {
                            self.take_peers_lapse(&observed);
                            self.next_lapse.is_some_and(|lapse| lapse > now)
                        };
                        look = !lapse_put_off && !self.members_unchanged(&mut observed).await;
                    }
                }
            }
        }
        self.stop_work().await;
        Ok(())
    }

    /// Puts the next read of the members off to when the last keep-alive says the
    /// first other member lapses, if its account covers every member that may have
    /// lapsed since the last (see [`PeersLapseSeen::bound`]).
    fn take_peers_lapse(&mut self, observed: &MembersSeen) {
        let told = self.session.as_ref().and_then(Session::peers_lapse);
        if let (Some(told), Some(known)) = (told, self.next_lapse) {
            let me = &self.options().node_id;
            let live = observed.registry.iter().filter(|node| *node != me).count();
            let ttl = self.elector.registry.ttl();
            self.next_lapse = Some(told.bound(known, live, ttl));
        }
    }

    /// Reads the group's members: whether they are still those `observed` (then the
    /// next lapse to check is set from this read, the registry's other nodes are
    /// taken as they are now, and the group need not be read).
    async fn members_unchanged(&mut self, observed: &mut MembersSeen) -> bool {
        let now = Instant::now();
        match self.group_members().await {
            Ok(seen) if seen.group == observed.group => {
                self.next_lapse = seen.lapse.map(|lapse| now + lapse + LAPSE_NUDGE);
                *observed = seen;
                true
            }
            _ => false,
        }
    }

    /// Cancels and awaits every shard's work (the session, if any, still holds them).
    pub(super) async fn stop_work(&mut self) {
        let terms = std::mem::take(&mut self.terms);
        self.owned_changes.extend(terms.keys());
        for term in terms.values() {
            term.leadership.cancel();
        }
        for (shard, term) in terms {
            if let Err(error) = work_outcome_of(term.task).await {
                warn!(shard, %error, "shard work failed after its term ended");
            }
        }
        self.publish_owned();
    }

    /// Acts on wakes; returns whether the group must be read again. Shards pushed free
    /// while targeted here are contended for at once, without reading the whole group
    /// first (that read grows with the group; this is one call per shard, all at once).
    pub(super) async fn woken<W, Fut>(
        &mut self,
        wakes: Vec<Wake>,
        work: &mut W,
        wake_tx: &mpsc::UnboundedSender<Wake>,
    ) -> bool
    where
        W: FnMut(u32, FencingToken, CancellationToken) -> Fut,
        Fut: Future + Send + 'static,
        Fut::Output: WorkOutcome,
    {
        let mut look = false;
        let mut pushed = Vec::new();
        let mut handed = Vec::new();
        let mut seen = BTreeSet::new();
        for wake in wakes {
            match wake {
                Wake::ShardChanged(shard, change) => {
                    debug!(
                        shard,
                        ?change,
                        "the store pushed a change of a shard held elsewhere"
                    );
                    self.waiting.remove(&shard);
                    // Taken here meanwhile, or targeted elsewhere since: nothing to act on
                    // (a look per such wake read the whole group up to `MAX_WAITERS` times
                    // as a group settled, when the waits ran out).
                    if !self.targeted_here(shard) || self.terms.contains_key(&shard) {
                        continue;
                    }
                    if let Some(token) = self.handed_here(shard, &change) {
                        handed.push((shard, token));
                        continue;
                    }
                    let now = Instant::now();
                    let cooled = self.cooled(shard, now);
                    // A shard can be pushed twice in one burst; it is taken once.
                    if !cooled {
                        look = true;
                    } else if seen.insert(shard) {
                        pushed.push((shard, false));
                    }
                }
                Wake::ProbeSettled(shard) => {
                    debug!(shard, "a probe was taken or is due back");
                    look = true;
                }
                Wake::WorkEnded(shard, token) => {
                    look |= self.work_ended(shard, token, wake_tx).await
                }
            }
        }
        if let Some(alive) = self.session.as_ref().map(|s| s.alive.clone()) {
            for (shard, token) in handed {
                if !self.terms.contains_key(&shard) {
                    self.start_term(shard, token, false, &alive, work, wake_tx);
                    if let Some(session) = self.session.as_mut() {
                        session.heard_term_handed();
                    }
                }
            }
        }
        // Once per burst, not per ended term (see `contend`).
        self.publish_owned();
        if !pushed.is_empty() {
            self.contend(pushed, work, wake_tx, None).await;
        }
        look
    }

    /// The token of the term that `change` says began for this member under its current
    /// session: handed to it by the shard's last holder (see
    /// [`LeaseStore::hand_to_session`]), to be worked on with no acquire. Never a term
    /// of an earlier session (that one ends with it, and may be held by another member
    /// by now), nor one this member has ended since (see [`Member::latest_terms`]).
    fn handed_here(&self, shard: u32, change: &TermChange) -> Option<FencingToken> {
        let session = self.session.as_ref()?;
        match change {
            TermChange::Began {
                holder,
                fencing_token,
                session: Some(held_under),
            } if *held_under == session.id
                && *holder == self.options().node_id
                && self
                    .latest_terms
                    .get(&shard)
                    .is_none_or(|t| fencing_token > t) =>
            {
                Some(*fencing_token)
            }
            _ => None,
        }
    }

    /// Records that this member works on, or ends, `shard`'s term `token` (see
    /// [`Member::latest_terms`]).
    pub(super) fn saw_term(&mut self, shard: u32, token: FencingToken) {
        let latest = self.latest_terms.entry(shard).or_insert(token);
        *latest = (*latest).max(token);
    }

    /// Whether `shard` may be taken again at `now`: its last term here did not return on
    /// its own less than a retry interval ago.
    pub(super) fn cooled(&self, shard: u32, now: Instant) -> bool {
        self.cooling.get(&shard).is_none_or(|until| now >= *until)
    }

    /// Whether the last look targeted `shard` at this member.
    pub(super) fn targeted_here(&self, shard: u32) -> bool {
        let here = self.target.index_of(&self.options().node_id);
        here.is_some_and(|here| self.target.at(shard) == here)
    }

    /// A term's work ended: release the shard. Returns whether the group must be read
    /// again: not after a handover when no other shard waits to be handed over.
    pub(super) async fn work_ended(
        &mut self,
        shard: u32,
        token: FencingToken,
        wake_tx: &mpsc::UnboundedSender<Wake>,
    ) -> bool {
        if self
            .terms
            .get(&shard)
            .is_none_or(|term| term.token != token)
        {
            return false;
        }
        let Some(term) = self.terms.remove(&shard) else {
            return false;
        };
        self.owned_changes.insert(shard);
        let returned_on_its_own = !term.leadership.is_cancelled();
        term.leadership.cancel();
        if let Err(error) = work_outcome_of(term.task).await {
            warn!(shard, %error, "shard work failed");
        }
        if returned_on_its_own {
            self.cooling
                .insert(shard, Instant::now() + self.options().retry_interval);
        }
        // A shard handed over goes to its target's session in the step that ends the
        // term here: the target works on it when the push reaches it, with no acquire.
        // Only to a target the last look saw working on some shard: one that works on
        // none takes its shards itself (a probe first), which shows that its loop runs
        // and not only its session's keep-alive; handed to a session whose loop is stuck
        // they would be held, idle, for as long as the keep-alives go on.
        let here = self.target.index_of(&self.options().node_id);
        let target = if term.handing_over {
            self.target.elsewhere(shard, here).map(str::to_owned)
        } else {
            None
        };
        let to = target.as_deref().filter(|to| self.working.contains(*to));
        self.end_term(shard, term.token, to).await;
        if term.probe {
            // Look again when its target takes it (then it works, and gets the rest),
            // or when it is due to be taken back.
            let until = Instant::now() + self.options().retry_interval * PROBE_WAIT;
            self.probes.released(shard, until, target);
            let (store, wake) = (self.elector.store.clone(), wake_tx.clone());
            let role = role(&self.options().group, shard);
            tokio::spawn(async move {
                store.wait_for_term(&role, term.token, until).await;
                let _ = wake.send(Wake::ProbeSettled(shard));
            });
        }
        if term.handing_over {
            // The next few, on the last look's targets: a look per wave would read the
            // whole group once per `max_moves_in_flight` shards moved.
            let target = &self.target;
            let handing_over = start_handovers(
                &mut self.terms,
                &self.elector.options,
                |shard| target.elsewhere(shard, here),
                &self.working,
                &mut self.probes,
                Instant::now(),
            );
            self.owned_changes.extend(handing_over);
        }
        !term.handing_over
    }

    /// Ends `shard`'s term `token`: handed to member `to`'s session (see
    /// [`LeaseStore::hand_to_session`]), or released. One that may still land is
    /// released again at the next look.
    pub(super) async fn end_term(&mut self, shard: u32, token: FencingToken, to: Option<&str>) {
        self.saw_term(shard, token);
        let role = role(&self.options().group, shard);
        let node = &self.options().node_id;
        let deadline = self
            .session
            .as_ref()
            .map_or_else(Instant::now, Session::deadline);
        let store = &self.elector.store;
        let ended = async {
            match to {
                Some(to) => store.hand_to_session(&role, node, token, to).await,
                None => store.release(&role, node, token).await,
            }
        };
        match tokio::time::timeout_at(deadline, ended).await {
            Ok(Ok(_)) => {
                debug!(shard, token = %token, to, "shard released");
                self.pending_releases.remove(&shard);
            }
            Ok(Err(error)) => {
                warn!(shard, token = %token, %error,
                    "release failed and may still land; no work under this token, releasing again at the next look");
                self.pending_releases.insert(shard, token);
            }
            Err(_) => {
                warn!(shard, token = %token,
                    "release timed out and may still land; no work under this token, releasing again at the next look");
                self.pending_releases.insert(shard, token);
            }
        }
    }

    // The look at the group and what follows from it are in `plan.rs`.

    /// Publishes a look's members and targets, with the shards owned: one change of
    /// the state, so a watcher never sees the owned shards of one moment beside the
    /// targets of another.
    pub(super) fn publish(&mut self, members: Vec<String>, target: Assignment) {
        let retargeted = (target != self.target).then(|| {
            let map = target.to_map();
            self.target = target;
            map
        });
        self.publish_with(|state| {
            let mut changed = false;
            if state.members != members {
                state.members = members;
                changed = true;
            }
            if let Some(target) = retargeted.filter(|target| state.target != *target) {
                state.target = target;
                changed = true;
            }
            changed
        });
    }

    /// Publishes the shards owned (worked on and not handing over) as the terms now
    /// are, applying only the shards in `owned_changes`, with their gauges.
    pub(super) fn publish_owned(&mut self) {
        self.publish_with(|_| false);
    }

    /// Applies `owned_changes` to the published state, and `more` (whether it changed
    /// anything else) in the same change of it.
    fn publish_with(&mut self, more: impl FnOnce(&mut ShardState) -> bool) {
        let changes = std::mem::take(&mut self.owned_changes);
        let terms = &self.terms;
        let group = &self.elector.options.group;
        let mut owned = 0;
        self.elector.state.send_if_modified(|state| {
            let mut changed = false;
            for shard in changes {
                let now = terms
                    .get(&shard)
                    .filter(|term| !term.handing_over)
                    .map(|term| term.token);
                if state.owned.get(&shard).copied() == now {
                    continue;
                }
                changed = true;
                let role = role(group, shard);
                match now {
                    Some(token) => {
                        state.owned.insert(shard, token);
                        metrics::gauge!("tenure_is_leader", "role" => role.clone()).set(1.0);
                        metrics::gauge!("tenure_fencing_token", "role" => role)
                            .set(token.get() as f64);
                    }
                    None => {
                        state.owned.remove(&shard);
                        metrics::gauge!("tenure_is_leader", "role" => role).set(0.0);
                    }
                }
            }
            owned = state.owned.len();
            more(state) || changed
        });
        metrics::gauge!("tenure_shards_owned", "group" => group.clone()).set(owned as f64);
    }
}

/// Returns when `drain` changes; never once its sender is gone (no drain role).
async fn changed(drain: &mut watch::Receiver<bool>) {
    if drain.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

pub(super) async fn work_outcome_of(task: JoinHandle<Result<()>>) -> Result<()> {
    match task.await {
        Ok(outcome) => outcome,
        Err(join) => Err(Error::WorkPanicked(join.to_string())),
    }
}
