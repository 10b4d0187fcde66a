//! A member's look at its group and what it does about it: read the live members and
//! owners, place every shard, contend for the shards targeted here (see `contend.rs`),
//! hand the others over, rescue orphans, release strays.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::assignment::Assignment;
use super::member::{Term, Wake};
use super::probe::Probes;
use super::*;
use crate::placement::NO_MEMBER;

/// How a member starts, once it joined (see [`Member::prepare_to_join`]).
#[derive(Debug)]
pub(super) enum Joining {
    /// Every shard targeted here is held elsewhere and waited on: the first look a
    /// retry interval after joining (a look sooner would hold the pushes of the first
    /// handovers behind it: wakes are acted on between looks), or sooner when the
    /// members change.
    Prepared(MembersSeen),
    /// No live member holds a shard of the group (a new group, or every member stopped):
    /// the first look once no member joined for a quiet spell (an eighth of the retry
    /// interval), and no later than a retry interval after joining, so members starting
    /// together plan with each other. Looking at once, the first would plan alone, take
    /// every shard, and hand nearly all of them over again, a few at a time, as the
    /// others join.
    Cold(MembersSeen),
    /// Looks at once: the group or its members could not be read, a shard targeted here
    /// is free, or the members changed while the member got ready.
    Unprepared,
}

/// What one read of the membership showed.
#[derive(Clone, Debug, Default)]
pub(super) struct MembersSeen {
    /// The group's live members, in the registry's order (sorted).
    pub(super) group: Vec<String>,
    /// Every live node of the registry, other groups' too: what a wait for a change of
    /// the members compares with. Compared with the group's alone, a registry shared
    /// with any other node would always differ, and every wait would return at once.
    pub(super) registry: Vec<String>,
    /// How soon the first other member's membership lapses unless it heartbeats (on
    /// store time), if the group has another member.
    pub(super) lapse: Option<Duration>,
}

impl Member<'_> {
    /// Reads the group and acts on it: contend for the shards targeted here, hand over
    /// the ones targeted elsewhere, rescue orphans. Returns the live members seen.
    pub(super) async fn reconcile<W, Fut>(
        &mut self,
        work: &mut W,
        wake_tx: &mpsc::UnboundedSender<Wake>,
    ) -> Result<MembersSeen>
    where
        W: FnMut(u32, FencingToken, CancellationToken) -> Fut,
        Fut: Future + Send + 'static,
        Fut::Output: WorkOutcome,
    {
        let options = self.options().clone();
        let now = Instant::now();
        let seen = self.group_members().await?;
        let (live, lapse) = (&seen.group, seen.lapse);
        for member in live {
            self.last_seen.insert(member.clone(), now);
        }
        self.last_seen
            .retain(|_, seen| now.duration_since(*seen) < options.rebalance_delay);
        let mut planned: BTreeSet<String> = live.iter().cloned().collect();
        planned.extend(self.last_seen.keys().cloned());
        // Drained, it plans as the others do once they saw it leave.
        if self.draining {
            planned.remove(&options.node_id);
        } else {
            planned.insert(options.node_id.clone());
        }
        let planned: Vec<String> = planned.into_iter().collect();
        let (departed, departed_target) = self.departed_shards(&planned);
        if !departed.is_empty() {
            debug!(
                shards = departed.len(),
                "taking the shards of members that left before reading the group"
            );
            let refused_until = self
                .contend(departed, work, wake_tx, Some(&seen.registry))
                .await;
            if let Some(until) = self.put_off_until(refused_until, now) {
                // The departed member's session outlives its membership (a registry TTL
                // is at most `lease_ttl`): its shards free when the session ends. Read
                // the group then, not now: the read grows with the group, and the acquire
                // that takes the shards would wait behind it. Until then each look
                // contends for them again (and the pushes of those waited on are acted
                // on, by the plan published here).
                debug!(
                    ?until,
                    "a departed member's shards are still held; looking again when they free"
                );
                self.settled = false;
                self.next_lapse = lapse.map(|lapse| now + lapse + LAPSE_NUDGE);
                self.next_look = Some(until.min(now + options.retry_interval) + LAPSE_NUDGE);
                if let Some(target) = departed_target {
                    self.publish(live.clone(), target);
                }
                return Ok(seen);
            }
        }
        self.look_put_off = None;

        // Every term the store counted as handed here so far, and every change it
        // numbered so far, is in the read that follows.
        if let Some(session) = self.session.as_mut() {
            session.see_what_was_told();
        }
        self.read_group().await?;
        if self.still_settled(&planned, now) {
            // The last look found nothing to do, and neither the group nor the members
            // changed since: its plan stands, and this look costs what changed, not a
            // pass over every shard.
            self.next_lapse = lapse.map(|lapse| now + lapse + LAPSE_NUDGE);
            self.next_look = self.probes.next_due();
            return Ok(seen);
        }
        let owners = Assignment::owners(&self.view, options.shards, &planned);
        // A look at a large group is long work between awaits (a store that answers at
        // once, as in memory, never yields): let the session's keep-alive and the other
        // tasks of this worker run between its parts.
        tokio::task::yield_now().await;
        let target = Assignment::placed(&options.group, &planned, &owners);
        tokio::task::yield_now().await;
        // Owners and targets share the planned members' indices; this member's is one of
        // them unless it is drained (then, holding shards, it is named after them).
        let me = owners.index_of(&options.node_id);
        let is_me = |m: u32| Some(m) == me;
        // A crashed member's shards free when its session ends and its targets move when
        // its membership lapses; neither is pushed, so look again right after the session
        // ends, and read the members right after the membership is due to lapse (a look
        // only if it did), rather than up to a retry interval later.
        let expiry = self
            .view
            .iter()
            .filter(|(shard, _)| {
                let owner = owners.at(**shard);
                owner != NO_MEMBER && !is_me(owner) && is_me(target.at(**shard))
            })
            .map(|(_, lease)| lease.left)
            .min();
        self.check_terms(&owners);
        self.working = owners.members_with_shards();
        self.release_strays(&target).await;
        self.next_lapse = lapse.map(|lapse| now + lapse + LAPSE_NUDGE);
        self.next_look = expiry
            .map(|expiry| now + expiry + LAPSE_NUDGE)
            .into_iter()
            .chain(self.probes.next_due())
            .min();

        // Hand over what is targeted at another member, a few at a time.
        self.probes.settle(|shard| owners.get(shard), now);
        self.probes.seen(&self.working, &planned);
        let handing_over = start_handovers(
            &mut self.terms,
            &options,
            |shard| target.elsewhere(shard, me),
            &self.working,
            &mut self.probes,
            now,
        );
        self.owned_changes.extend(handing_over);

        // Contend for what is targeted here, and rescue long orphans.
        let mut wanted = Vec::new();
        let mut worked_on = self.terms.keys().copied().peekable();
        for shard in 0..options.shards {
            if worked_on.next_if_eq(&shard).is_some() {
                continue;
            }
            let owned = owners.at(shard) != NO_MEMBER;
            let orphan_for = if owned {
                if !self.orphaned_since.is_empty() {
                    self.orphaned_since.remove(&shard);
                }
                Duration::ZERO
            } else {
                now.duration_since(*self.orphaned_since.entry(shard).or_insert(now))
            };
            let mine = is_me(target.at(shard));
            // A probe its target did not take is taken back at once, not left an orphan.
            let taken_back = !owned && self.probes.take_back(shard, now);
            let rescue = !owned && (orphan_for > options.lease_ttl || taken_back) && !self.draining;
            if !(mine || rescue) {
                continue;
            }
            // Held elsewhere with a waiter on it already (set by the contention for a
            // departed member's shards just before): its push, or its wait running out,
            // brings the next acquire, not this look.
            let waited = owned && self.waiting.contains(&shard);
            if self.cooled(shard, now) && !waited {
                wanted.push((shard, !mine));
            }
        }
        // Settled only when the whole group is as planned from here: every shard held by
        // the member the plan targets, and this member working on exactly its own. A
        // shard of its own with no term here (cooling down after its work returned, or
        // freed by a stray release above, after `owners` was read), or one held by a
        // member that should hand it over, frees with no push to this member, which would
        // not look again for many TTLs. Nothing may be pending either: a handover (one
        // begun when the shard was targeted elsewhere releases it whatever the target is
        // now), a wait, a release, an acquire that may still land.
        let mine = target.shards_of(me);
        self.settled = wanted.is_empty()
            && owners
                .of
                .iter()
                .zip(&target.of)
                .all(|(owner, target)| *owner != NO_MEMBER && owner == target)
            && self.works_on_only(&mine, now);
        self.owners = owners;
        self.publish(live.clone(), target);
        self.contend(wanted, work, wake_tx, Some(&seen.registry))
            .await;
        self.look_soon_if_short(&mine, now);
        self.planned = planned;
        self.targeted_here = mine;
        Ok(seen)
    }

    /// Whether this member works on exactly the shards `mine`, with nothing of its own
    /// pending: no handover, wait or release, and no lost acquire that may still land.
    fn works_on_only(&self, mine: &[u32], now: Instant) -> bool {
        let ttl = self.options().lease_ttl;
        self.terms.keys().eq(mine)
            && self.terms.values().all(|term| !term.handing_over)
            && self.waiting.is_empty()
            && self.pending_releases.is_empty()
            && self
                .lost_acquire_at
                .is_none_or(|at| now.duration_since(at) >= ttl * LOST_ACQUIRE_LANDS_TTLS)
    }

    /// Whether the last look's plan stands: that look was settled and no read of the
    /// group since showed a change (see [`Member::read_group`]), it planned for the same
    /// members (`planned`), and nothing happened here since that did not reach the store
    /// (a term's release that failed, a lost acquire; what did reach it changed the
    /// group).
    fn still_settled(&self, planned: &[String], now: Instant) -> bool {
        self.settled && self.planned == planned && self.works_on_only(&self.targeted_here, now)
    }

    /// Brings the next look forward when shards of `mine` (this look's targets here)
    /// are not worked on here once its acquires were answered (see
    /// [`Member::short_looks`]).
    fn look_soon_if_short(&mut self, mine: &[u32], now: Instant) {
        // Both in shard order: one pass, not a lookup per shard.
        let mut worked_on = self.terms.keys().peekable();
        let short = mine
            .iter()
            .any(|shard| seek(&mut worked_on, shard, |k| *k).is_none());
        if !short {
            self.short_looks = 0;
            return;
        }
        let retry = self.options().retry_interval;
        let soon = (retry / SHORT_LOOK_DIVISOR)
            .checked_mul(1 << self.short_looks.min(16))
            .filter(|soon| *soon < retry);
        self.short_looks = self.short_looks.saturating_add(1);
        if let Some(soon) = soon {
            let at = now + soon;
            self.next_look = Some(self.next_look.map_or(at, |next| next.min(at)));
        }
    }

    /// Whether to put off reading the group until the departed member's session ends,
    /// and until when: `refused_until` (the latest end of a term that refused the
    /// departed contention just made), if within `lease_ttl`, and no later than the end
    /// the first such refusal said.
    fn put_off_until(&mut self, refused_until: Option<Instant>, now: Instant) -> Option<Instant> {
        let until = refused_until.filter(|until| *until <= now + self.options().lease_ttl)?;
        match self.look_put_off {
            None => {
                self.look_put_off = Some(until);
                Some(until)
            }
            Some(first) if until <= first + LAPSE_NUDGE => Some(until),
            Some(_) => None,
        }
    }

    /// The shards that the last look saw owned by members now gone (not in `planned`)
    /// and that the placement now targets here: contended for before the group is read,
    /// so a crashed member's shards run again without waiting for that read, which lists
    /// every shard of the group. The view may be stale, but an acquire is conditional: a
    /// shard still held (its owner's session outlives its membership) is refused, and
    /// waited on as any shard held elsewhere; one already waited on is left to its
    /// waiter's push (a look soon after the last, as one left short makes, would ask
    /// again for every shard the leaver has not yet released), except while looks are
    /// put off until the departed member's session ends: a session that lapses pushes
    /// nothing. Also returns the placement they were chosen by, if any.
    fn departed_shards(&self, planned: &[String]) -> (Vec<(u32, bool)>, Option<Assignment>) {
        let options = self.options();
        let node = &options.node_id;
        let last = &self.owners;
        // The last look's owners as this look plans them: an index into `planned`, or
        // none for a member not planned now. `planned` is sorted (it comes from a set).
        let now_planned: Vec<Option<u32>> = last
            .names
            .iter()
            .map(|name| planned.binary_search(name).ok().map(|i| i as u32))
            .collect();
        let departed: Vec<bool> = (last.names.iter().zip(&now_planned))
            .map(|(name, now)| name != node && now.is_none())
            .collect();
        let gone = |member: u32| departed.get(member as usize) == Some(&true);
        if self.draining || !departed.contains(&true) || !last.of.iter().any(|m| gone(*m)) {
            return (Vec::new(), None);
        }
        let owners = Assignment {
            names: planned.to_vec(),
            of: last
                .of
                .iter()
                .map(|m| {
                    now_planned
                        .get(*m as usize)
                        .copied()
                        .flatten()
                        .unwrap_or(NO_MEMBER)
                })
                .collect(),
        };
        let target = Assignment::placed(&options.group, planned, &owners);
        let me = target.index_of(node);
        let now = Instant::now();
        let wanted = (0..options.shards)
            .filter(|shard| {
                gone(last.at(*shard))
                    && me.is_some_and(|me| target.at(*shard) == me)
                    && !self.terms.contains_key(shard)
                    && (self.look_put_off.is_some() || !self.waiting.contains(shard))
                    && self.cooled(*shard, now)
            })
            .map(|shard| (shard, false))
            .collect();
        (wanted, Some(target))
    }

    /// Cancels every term the store no longer shows as this member's under its token
    /// (the copy, read after each of them began, and `owners` named from it): a release
    /// or takeover this member did not see (applied late, or answered with an error)
    /// ended it, and its work must not go on while another member may take the shard.
    pub(super) fn check_terms(&mut self, owners: &Assignment) {
        let me = owners.index_of(&self.elector.options.node_id);
        // Both in shard order: one pass over the copy, not a lookup per term.
        let mut leases = self.view.iter().peekable();
        for (shard, term) in &self.terms {
            let lease = seek(&mut leases, shard, |(k, _)| *k).map(|(_, lease)| *lease);
            let shown = me.is_some_and(|me| owners.at(*shard) == me)
                && lease.is_some_and(|lease| lease.fencing_token == term.token);
            if !shown && !term.leadership.is_cancelled() {
                warn!(shard, token = %term.token, store = ?lease,
                    "the store no longer shows this term: cancelling its work");
                term.leadership.cancel();
            }
        }
    }

    /// Acts on the shards the store may hold for this member with no work on them
    /// (`held` and `target` from this look): a pending release is sent again, whatever
    /// the target, so the next term takes a new token; a lost acquire that the store
    /// granted, or a term handed to this session, is let go when the shard is targeted
    /// elsewhere (targeted here, it is taken like any other shard). Each is handed to
    /// its target's session when that target works on some shard (`working`, from this
    /// look), so the target hears of it even if its plan did not expect it (see
    /// [`SessionGrant::terms_handed`](crate::SessionGrant::terms_handed)); a release
    /// would free it with no push to a target that waits on nothing.
    pub(super) async fn release_strays(&mut self, target: &Assignment) {
        let node = self.elector.options.node_id.clone();
        let held_here = |view: &crate::LeaseCopy<u32>, shard: u32| {
            view.get(&shard)
                .filter(|lease| lease.live_holder() == Some(node.as_str()))
                .map(|lease| lease.fencing_token)
        };
        // Shown under another token (or not at all), that term is over: a late release
        // of it is a no-op.
        let pending: Vec<(u32, FencingToken)> = std::mem::take(&mut self.pending_releases)
            .into_iter()
            .filter(|(shard, token)| {
                held_here(&self.view, *shard) == Some(*token) && !self.terms.contains_key(shard)
            })
            .collect();
        let to = |working: &BTreeSet<String>, shard: u32| {
            target
                .get(shard)
                .filter(|to| *to != node && working.contains(*to))
                .map(str::to_owned)
        };
        for (shard, token) in pending {
            let to = to(&self.working, shard);
            self.end_term(shard, token, to.as_deref()).await;
        }
        // Also a shard handed to this session (see `LeaseStore::hand_to_session`) by a
        // member whose plan differed from this look's: held under this very session, so
        // no other process of this node works on it.
        // Every shard worked on here is held under this session too: skip those in one
        // pass in shard order (a member of a million shards holds a million).
        let current = self.session.as_ref().map(|session| session.id);
        let mut worked_on = self.terms.keys().peekable();
        let handed: Vec<u32> = self
            .view
            .iter()
            .filter(|(_, lease)| lease.session.is_some() && lease.session == current)
            .map(|(shard, _)| *shard)
            .filter(|shard| seek(&mut worked_on, shard, |k| *k).is_none())
            .collect();
        let stranded: Vec<(u32, FencingToken)> = self
            .lost_acquires
            .iter()
            .copied()
            .chain(handed)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter(|shard| !self.terms.contains_key(shard) && target.get(*shard) != Some(&node))
            .filter_map(|shard| Some((shard, held_here(&self.view, shard)?)))
            .collect();
        for (shard, token) in stranded {
            let to = to(&self.working, shard);
            info!(shard, token = %token, to, "letting go of a shard held here with no term here");
            self.end_term(shard, token, to.as_deref()).await;
        }
    }

    /// Gets ready before joining: reads the members and the group as a look would, and
    /// begins waiting on the shards that the plan with this member in it targets here
    /// and others hold, so their handovers are heard as soon as the others see the join,
    /// not after this member's first look. Acquires nothing: members starting together
    /// would each contend for every free shard. The reads also open the store's
    /// connections before anyone waits on this member (a newcomer's first look over new
    /// connections took 10-17 ms on PostgreSQL), and leave the copy of the group current,
    /// so the first look reads only what changed since.
    ///
    /// When every shard targeted here is held elsewhere and waited on, the first look
    /// after joining would only be refused them: the plan is published (so pushes are
    /// acted on) and the members seen, as they will be once joined, are returned for the
    /// member to wait on pushes first and look a short while later
    /// ([`Joining::Prepared`]). When no live member holds a shard, the member waits for
    /// others starting with it ([`Joining::Cold`]).
    pub(super) async fn prepare_to_join(
        &mut self,
        wake_tx: &mpsc::UnboundedSender<Wake>,
    ) -> Joining {
        let options = self.options().clone();
        let me = &options.node_id;
        let mut seen = match self.group_members().await {
            Ok(seen) => seen,
            Err(error) => {
                debug!(%error, "could not read the members before joining");
                return Joining::Unprepared;
            }
        };
        if let Err(error) = self.read_group().await {
            debug!(%error, "could not read the group before joining");
            return Joining::Unprepared;
        }
        for members in [&mut seen.group, &mut seen.registry] {
            members.push(me.clone());
            members.sort();
            members.dedup();
        }
        if self
            .view
            .iter()
            .all(|(_, lease)| lease.live_holder().is_none())
        {
            debug!(
                members = seen.group.len(),
                "a cold group: waiting a retry interval for members starting too"
            );
            return Joining::Cold(seen);
        }
        let owners = Assignment::owners(&self.view, options.shards, &seen.group);
        let target = Assignment::placed(&options.group, &seen.group, &owners);
        let here = target.index_of(me);
        let mut all_waited = true;
        for shard in target.shards_of(here) {
            let held_elsewhere =
                owners.at(shard) != NO_MEMBER && owners.index_of(me) != Some(owners.at(shard));
            match self.view.get(&shard).filter(|_| held_elsewhere) {
                Some(lease) => {
                    self.wait_for_push(
                        shard,
                        role(&options.group, shard),
                        lease.fencing_token,
                        wake_tx,
                    );
                    all_waited &= self.waiting.contains(&shard);
                }
                None => all_waited = false,
            }
        }
        // The waits run as tasks of their own: let them begin (subscribe, read the
        // term). Then the members again: a plan made for members that changed meanwhile
        // is not acted on. The read also queues behind the waits' own first reads, so
        // the heartbeat that follows does not.
        tokio::task::yield_now().await;
        let unchanged = matches!(
            self.group_members().await,
            Ok(again) if again.group.iter().chain([me]).collect::<BTreeSet<_>>()
                == seen.group.iter().collect::<BTreeSet<_>>()
        );
        debug!(
            waiting = self.waiting.len(),
            all_waited, unchanged, "ready to join"
        );
        if !all_waited || !unchanged || self.waiting.is_empty() {
            return Joining::Unprepared;
        }
        self.publish(seen.group.clone(), target);
        Joining::Prepared(seen)
    }

    /// One read of the membership: this group's live members, the registry's, and how
    /// soon the first other member's membership lapses unless it heartbeats.
    pub(super) async fn group_members(&self) -> Result<MembersSeen> {
        let options = self.options();
        let ttl = self.elector.registry.ttl();
        let members = self.elector.registry.members().await?;
        let registry = members.iter().map(|m| m.node_id.clone()).collect();
        let mine: Vec<_> = members
            .into_iter()
            .filter(|m| m.metadata.get(GROUP_KEY) == Some(&options.group))
            .collect();
        let lapse = mine
            .iter()
            .filter(|m| m.node_id != options.node_id)
            .map(|m| ttl.saturating_sub(m.heartbeat_age()))
            .min();
        Ok(MembersSeen {
            group: mine.into_iter().map(|m| m.node_id).collect(),
            registry,
            lapse,
        })
    }

    /// Brings the member's copy of the group up to date with what changed in the store
    /// since the last read. A change of any shard's holder, token or liveness unsettles
    /// the member: its next look plans again.
    pub(super) async fn read_group(&mut self) -> Result<()> {
        let options = &self.elector.options;
        let prefix = format!("{}/", options.group);
        let shards = options.shards;
        let shard = |role: &str| role.parse::<u32>().ok().filter(|k| *k < shards);
        let changed = self
            .view
            .read(self.elector.store.as_ref(), &prefix, shard)
            .await?;
        self.settled &= !changed;
        Ok(())
    }
}

/// Starts handing over shards targeted at other members (`elsewhere`: a shard's
/// target when that is another member), as many as `max_moves_in_flight` leaves room
/// for. A target that works on no shard (`working`,
/// from the last look) gets a probe first (see [`super::probe`]); a rescued shard goes
/// only to a target that works, or as a probe after [`RESCUE_HOLD`] TTLs. Returns the
/// shards it began handing over.
pub(super) fn start_handovers<'a>(
    terms: &mut BTreeMap<u32, Term>,
    options: &ShardOptions,
    elsewhere: impl Fn(u32) -> Option<&'a str>,
    working: &BTreeSet<String>,
    probes: &mut Probes,
    now: Instant,
) -> Vec<u32> {
    let mut started = Vec::new();
    let moving = terms.values().filter(|t| t.handing_over).count();
    let mut room = options.max_moves_in_flight.saturating_sub(moving);
    // A probe is the shard held here longest of those a target that works on none may
    // get, so a wedged target's failed probes fall on each of its shards in turn.
    let mut probe_of: BTreeMap<&str, (Instant, u32)> = BTreeMap::new();
    for (shard, term) in terms.iter() {
        let Some(to) = elsewhere(*shard) else {
            continue;
        };
        let held_long = now.duration_since(term.started) >= options.lease_ttl * RESCUE_HOLD;
        if working.contains(to) || term.handing_over || term.rescued && !held_long {
            continue;
        }
        let oldest = probe_of.entry(to).or_insert((term.started, *shard));
        if term.started < oldest.0 {
            *oldest = (term.started, *shard);
        }
    }
    for (shard, term) in terms.iter_mut() {
        if room == 0 {
            break;
        }
        let Some(to) = elsewhere(*shard) else {
            continue;
        };
        if term.handing_over {
            continue;
        }
        let probe = !working.contains(to);
        if probe
            && (probe_of.get(to).map(|(_, k)| k) != Some(shard)
                || !probes.try_probe(to, now, options.lease_ttl))
        {
            continue;
        }
        info!(shard, to = %to, probe, "handing the shard over");
        term.handing_over = true;
        term.probe = probe;
        term.leadership.cancel();
        started.push(*shard);
        room -= 1;
    }
    started
}

/// Advances `sorted` (in ascending order of `key_of`) past the items before `key`, and
/// returns the item at `key` if there is one, left in place: walking two sequences in
/// shard order in one pass, where a lookup per shard would search a map of a million.
fn seek<'a, I, T, K>(
    sorted: &'a mut std::iter::Peekable<I>,
    key: &K,
    key_of: impl Fn(&T) -> &K,
) -> Option<&'a T>
where
    I: Iterator<Item = T>,
    K: Ord + ?Sized,
{
    while sorted.next_if(|item| key_of(item) < key).is_some() {}
    sorted.peek().filter(|item| key_of(item) == key)
}
