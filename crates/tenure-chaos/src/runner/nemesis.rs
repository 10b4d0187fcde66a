//! The nemesis: injects the planned faults into workers, proxies and the server, heals
//! them, replaces dead workers, and stops everything at the end.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{kill, killpg, Signal};
use tenure_throwaway::postgres::PgServer;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::servers::{restart, Owned, Restarting};
use super::workers::{Slot, Spawner};
use crate::backend::Backend;
use crate::checker::FaultRecord;
use crate::config::{ChaosConfig, CutFlavour, FaultKind};
use crate::history::mono_ns;
use crate::proxy::Proxy;
use crate::schedule::PlannedFault;
use crate::ChaosError;

pub(super) struct Nemesis<'a> {
    pub(super) config: &'a ChaosConfig,
    pub(super) spawner: &'a Spawner,
    pub(super) backend: &'a Backend,
    pub(super) owned: &'a Owned,
    /// The proxies of each worker slot.
    pub(super) proxies: &'a [Vec<Proxy>],
    /// The ways this store can be cut.
    pub(super) cuts: Vec<CutFlavour>,
    /// The blackhole under way (every worker's, or a wedge's).
    pub(super) held: Option<Held>,
    /// The lease row (SQLite: the file) held locked, if any.
    pub(super) locked: Option<Locked>,
    /// A server restart under way. It runs beside the nemesis, which goes on injecting
    /// faults meanwhile.
    pub(super) restarting: Option<Restarting>,
    /// When the last server restart was done (the server serving again) and how long
    /// it took.
    pub(super) restarted: Option<(Instant, Duration)>,
    /// The workers' wall clock offset from the real one, ms.
    pub(super) clock_offset_ms: i64,
    /// Lock faults made so far: on SQLite the file's lock, a stalled disk (`lock/disk`)
    /// and a failing disk (`lock/disk-error`) take turns; on a PostgreSQL server the run
    /// owns, a row lock and the server's stalled WAL disk (`lock/wal-disk`); on an etcd
    /// server the run owns, or the API server's etcd, every one stalls its WAL disk.
    pub(super) lock_faults: u64,
    /// The worker names holding a live lease, as last observed.
    pub(super) holders: Arc<Mutex<Vec<String>>>,
    pub(super) slots: Vec<Slot>,
    pub(super) faults: Vec<FaultRecord>,
    pub(super) skipped: u64,
    pub(super) respawned: u64,
}

/// A blackhole under way: when it heals, which fault record it is, and the one slot it
/// cuts off (a wedge) or `None` for every worker.
#[derive(Clone, Copy, Debug)]
pub(super) struct Held {
    until: Instant,
    record: usize,
    slot: Option<usize>,
}

/// A lock under way: when it is freed, which fault record it is, and who holds it.
pub(super) struct Locked {
    until: Instant,
    record: usize,
    holder: LockHolder,
}

/// Who holds a lock fault's lock.
pub(super) enum LockHolder {
    /// A transaction of the nemesis's own, rolled back when `release` is cancelled.
    Nemesis {
        release: CancellationToken,
        task: JoinHandle<Result<(), ChaosError>>,
    },
    /// A SQLite worker whose disk stalls inside its commit, or fails its syncs
    /// (`failing`; see [`crate::disk`]), this incarnation of this slot; SIGUSR2 heals
    /// it.
    Disk {
        slot: usize,
        name: String,
        failing: bool,
    },
    /// The PostgreSQL server's WAL disk, stalled: every commit hangs inside the server
    /// ([`tenure_throwaway::postgres::PgServer::stall_wal`]).
    WalDisk(Arc<PgServer>),
    /// The etcd server's WAL disk (on Kubernetes, the API server's etcd's), stalled
    /// for the lock's length ([`tenure_throwaway::etcd::EtcdMember::stall_wal_for`]):
    /// it answers again on its own when the lock is due to be freed.
    EtcdWalDisk,
}

impl Nemesis<'_> {
    /// The proxies of `slot`, or of every slot for `None`.
    fn proxies_of(&self, slot: Option<usize>) -> impl Iterator<Item = &Proxy> {
        self.proxies
            .iter()
            .enumerate()
            .filter(move |(i, _)| slot.is_none_or(|slot| slot == *i))
            .flat_map(|(_, proxies)| proxies)
    }

    pub(super) async fn run(&mut self, schedule: &[PlannedFault]) -> Result<(), ChaosError> {
        let start = Instant::now();
        let mut next = 0;
        loop {
            self.reap_exited()?;
            let fault_at = schedule.get(next).map(|f| start + f.at);
            let resume_at = self
                .slots
                .iter()
                .filter_map(|s| s.paused.map(|p| p.0))
                .chain(self.held.map(|held| held.until))
                .chain(self.locked.as_ref().map(|locked| locked.until))
                .min();
            let wake = match (fault_at, resume_at) {
                (None, None) => break,
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) | (None, Some(a)) => a,
            };
            // Wake at least every 100 ms to notice workers that died on their own.
            tokio::time::sleep_until(wake.min(Instant::now() + Duration::from_millis(100))).await;
            let now = Instant::now();
            for i in 0..self.slots.len() {
                if self.slots[i].paused.is_some_and(|(until, _)| until <= now) {
                    self.resume(i);
                }
            }
            if self.held.is_some_and(|held| held.until <= now) {
                self.heal();
            }
            if self
                .locked
                .as_ref()
                .is_some_and(|locked| locked.until <= now)
            {
                self.unlock().await;
            }
            self.finish_restart(false).await?;
            if fault_at.is_some_and(|at| at <= now) {
                self.inject(&schedule[next]).await?;
                next += 1;
            }
        }
        self.finish_restart(true).await?;
        // Let the last faults heal and be measured before stopping.
        tokio::time::sleep(self.config.ttl * 2 + self.config.retry_every()).await;
        Ok(())
    }

    /// Records the end of the server restart under way once it is done (`wait`: waits
    /// for it); a restart that failed ends the run.
    pub(super) async fn finish_restart(&mut self, wait: bool) -> Result<(), ChaosError> {
        if !wait
            && !self
                .restarting
                .as_ref()
                .is_some_and(|r| r.task.is_finished())
        {
            return Ok(());
        }
        let Some(Restarting {
            record,
            task,
            began,
        }) = self.restarting.take()
        else {
            return Ok(());
        };
        task.await
            .map_err(|e| ChaosError::Setup(format!("a server restart panicked: {e}")))??;
        self.faults[record].healed = mono_ns();
        self.restarted = Some((Instant::now(), began.elapsed()));
        Ok(())
    }

    /// Ends the current blackhole or wedge, if any.
    pub(super) fn heal(&mut self) {
        if let Some(held) = self.held.take() {
            for proxy in self.proxies_of(held.slot) {
                proxy.heal();
            }
            self.faults[held.record].healed = mono_ns();
        }
    }

    /// Frees the lock under way, if any: a worker's stalled disk answers again (unless
    /// the worker was killed meanwhile), the nemesis's transaction rolls back (or fails:
    /// a server restarted meanwhile has dropped it already). A rollback unanswered
    /// within a TTL is left behind (its task ended), so the nemesis never waits on it.
    pub(super) async fn unlock(&mut self) {
        let Some(locked) = self.locked.take() else {
            return;
        };
        match locked.holder {
            LockHolder::Disk { slot, name, .. } => {
                if self.slots[slot].name == name {
                    let _ = kill(self.slots[slot].pgid, Signal::SIGUSR2);
                }
            }
            LockHolder::WalDisk(server) => server.heal_wal(),
            LockHolder::EtcdWalDisk => {}
            LockHolder::Nemesis { release, mut task } => {
                release.cancel();
                match tokio::time::timeout(self.config.ttl, &mut task).await {
                    Ok(Ok(Ok(()))) => {}
                    Ok(Ok(Err(error))) => debug!(%error, "the lock fault's transaction failed"),
                    Ok(Err(error)) => warn!(%error, "the lock fault's task failed"),
                    Err(_) => {
                        warn!("the lock fault's rollback did not answer within a TTL; left behind");
                        task.abort();
                    }
                }
            }
        }
        self.faults[locked.record].healed = mono_ns();
    }

    pub(super) fn resume(&mut self, i: usize) {
        if let Some((_, record)) = self.slots[i].paused.take() {
            let _ = killpg(self.slots[i].pgid, Signal::SIGCONT);
            self.faults[record].healed = mono_ns();
        }
    }

    /// A worker that exited on its own (it should not) is restarted and counted.
    pub(super) fn reap_exited(&mut self) -> Result<(), ChaosError> {
        for i in 0..self.slots.len() {
            if let Ok(Some(status)) = self.slots[i].child.try_wait() {
                warn!(worker = %self.slots[i].name, %status, "worker exited unexpectedly; restarting it");
                self.respawned += 1;
                self.replace(i)?;
            }
        }
        Ok(())
    }

    pub(super) fn replace(&mut self, i: usize) -> Result<(), ChaosError> {
        let (index, incarnation) = (self.slots[i].index, self.slots[i].incarnation + 1);
        self.slots[i] = self.spawner.spawn(index, incarnation)?;
        Ok(())
    }

    /// The slots of current incarnations holding a live lease (the role's, or any
    /// shard's), paused ones only when `paused_too`.
    pub(super) fn leaders(&self, paused_too: bool) -> Vec<usize> {
        let holders = self.holders.lock().unwrap_or_else(|e| e.into_inner());
        (0..self.slots.len())
            .filter(|&i| paused_too || self.slots[i].paused.is_none())
            .filter(|&i| holders.contains(&self.slots[i].name))
            .collect()
    }

    pub(super) fn pick(
        &self,
        pick: u64,
        prefer_leader: bool,
        unpaused_only: bool,
    ) -> Option<usize> {
        let pick_of = |candidates: Vec<usize>| {
            (!candidates.is_empty()).then(|| candidates[(pick % candidates.len() as u64) as usize])
        };
        if prefer_leader {
            if let Some(i) = pick_of(self.leaders(!unpaused_only)) {
                return Some(i);
            }
        }
        pick_of(
            (0..self.slots.len())
                .filter(|&i| !unpaused_only || self.slots[i].paused.is_none())
                .collect(),
        )
    }

    pub(super) async fn inject(&mut self, fault: &PlannedFault) -> Result<(), ChaosError> {
        let at = mono_ns();
        match fault.kind {
            FaultKind::Pause => {
                // Keep one worker running: with every worker stopped there is nothing
                // left to fence out.
                let running = self.slots.iter().filter(|s| s.paused.is_none()).count();
                let Some(i) = self.pick(fault.pick, true, true).filter(|_| running > 1) else {
                    self.skipped += 1;
                    return Ok(());
                };
                let _ = killpg(self.slots[i].pgid, Signal::SIGSTOP);
                let until = Instant::now() + self.config.ttl.mul_f64(fault.factor);
                self.slots[i].paused = Some((until, self.faults.len()));
                self.record(fault.kind, None, Some(i), at, 0);
            }
            FaultKind::Kill => {
                // Half the kills hit the leader, half anyone.
                let Some(i) = self.pick(fault.pick, fault.pick.is_multiple_of(2), false) else {
                    self.skipped += 1;
                    return Ok(());
                };
                self.kill_and_replace(i, fault.kind, at).await?;
            }
            // A server restart takes 0.2 s (PostgreSQL), 1 s (etcd) or several seconds (a
            // kube-apiserver), longer than the gap between faults: back to back, the
            // store would do nothing but restart and no restart's recovery could be seen.
            // Restarts are spaced by two TTLs, and by at least as long as the last one
            // took, so the server serves at least half the time.
            FaultKind::Restart
                if !matches!(self.owned, Owned::None)
                    && (self.restarting.is_some()
                        || self.restarted.is_some_and(|(done, took)| {
                            done.elapsed() < (self.config.ttl * 2).max(took)
                        })) =>
            {
                self.skipped += 1;
            }
            // The restart runs beside the nemesis.
            FaultKind::Restart => match restart(self.owned, fault.pick) {
                Some((flavour, task)) => {
                    self.restarting = Some(Restarting {
                        record: self.faults.len(),
                        task,
                        began: Instant::now(),
                    });
                    self.record(fault.kind, Some(flavour), None, at, 0);
                }
                // SQLite has no server: kill the leader, which writes continuously and
                // so is almost always inside a transaction.
                None => {
                    let Some(i) = self.pick(fault.pick, true, false) else {
                        self.skipped += 1;
                        return Ok(());
                    };
                    self.kill_and_replace(i, fault.kind, at).await?;
                }
            },
            FaultKind::Cut => self.cut(fault, at).await,
            FaultKind::Lock => {
                let Some((holder, slot)) = self.lock(fault) else {
                    self.skipped += 1;
                    return Ok(());
                };
                let flavour = match holder {
                    LockHolder::Disk { failing: true, .. } => Some("disk-error"),
                    LockHolder::Disk { .. } => Some("disk"),
                    LockHolder::WalDisk(_) | LockHolder::EtcdWalDisk => Some("wal-disk"),
                    LockHolder::Nemesis { .. } => None,
                };
                self.locked = Some(Locked {
                    until: Instant::now() + self.lock_length(fault),
                    record: self.faults.len(),
                    holder,
                });
                self.record(fault.kind, flavour, slot, at, 0);
            }
            FaultKind::Handoff => {
                // Asked beside the nemesis: the asker waits for the handover, as
                // `tenure handoff` does; a leader with nobody waiting leads on.
                let Some(i) = self.leaders(false).first().copied() else {
                    self.skipped += 1;
                    return Ok(());
                };
                let leases = self.backend.leases();
                let role = self.spawner.role.clone();
                let wait = self.config.ttl * 3;
                tokio::spawn(async move {
                    match tenure::handoff::request_handoff(
                        leases,
                        &role,
                        None,
                        "tenure-chaos",
                        wait,
                    )
                    .await
                    {
                        Ok(outcome) => debug!(?outcome, "handoff asked"),
                        Err(error) => debug!(%error, "handoff could not be asked"),
                    }
                });
                self.record(fault.kind, None, Some(i), at, 0);
            }
            FaultKind::Clock => {
                let Some(fake_time) = &self.spawner.fake_time else {
                    self.skipped += 1;
                    return Ok(());
                };
                // More than a TTL each time, so a store on the wall clock would expire
                // (forward) or keep alive (back) every live lease.
                let step = self.config.ttl.mul_f64(1.0 + fault.factor).as_millis();
                let step = i64::try_from(step).unwrap_or(i64::MAX / 4);
                let (offset, flavour) = if self.clock_offset_ms > 0 {
                    (self.clock_offset_ms - step, "back")
                } else {
                    (self.clock_offset_ms + step, "forward")
                };
                fake_time.set_offset(offset)?;
                self.clock_offset_ms = offset;
                self.record(fault.kind, Some(flavour), None, at, mono_ns());
            }
        }
        Ok(())
    }

    /// Takes a lock for a `lock` fault, unless one is held already: on SQLite the file's
    /// write lock, a leader's stalled disk and a leader's failing disk in turn (for a
    /// disk, the slot is returned); on a PostgreSQL server the run owns, the role's row
    /// and the server's stalled WAL disk in turn; elsewhere a transaction of the
    /// nemesis's own on the role's row (in shard mode one shard's).
    fn lock(&mut self, fault: &PlannedFault) -> Option<(LockHolder, Option<usize>)> {
        if self.locked.is_some() {
            return None;
        }
        // etcd has no lock a client can hold; its disk stalls instead, every time.
        if let Some(etcd) = self.owned.etcd() {
            return match etcd.stall_wal_for(self.lock_length(fault)) {
                Ok(()) => {
                    self.lock_faults += 1;
                    Some((LockHolder::EtcdWalDisk, None))
                }
                Err(error) => {
                    warn!(%error, "cannot stall the etcd server's WAL disk");
                    None
                }
            };
        }
        // In turn, not by the plan's pick: a short run with as many locks as the store
        // has kinds has each kind. Turn 0 is the row's (SQLite: the file's) lock.
        let kinds = match (self.backend, self.owned) {
            (Backend::Sqlite(_), _) => 3,
            (_, Owned::Postgres(_)) => 2,
            _ => 1,
        };
        let turn = self.lock_faults % kinds;
        if turn > 0 {
            if let Some(held) = self.lock_of_turn(fault, turn) {
                self.lock_faults += 1;
                return Some(held);
            }
            // This turn's kind cannot be made now (no leader seen yet whose disk could
            // stall): the row's lock now, this kind at the next lock fault.
        }
        let role = match self.config.shards {
            Some(shards) => tenure::shard::role(
                &self.spawner.role,
                u32::try_from(fault.pick % u64::from(shards)).unwrap_or(0),
            ),
            None => self.spawner.role.clone(),
        };
        let release = CancellationToken::new();
        let task = self.backend.hold_lock(&role, release.clone())?;
        if turn == 0 {
            self.lock_faults += 1;
        }
        Some((LockHolder::Nemesis { release, task }, None))
    }

    /// How long `fault`, a lock, holds: 1-3 TTLs by the plan.
    fn lock_length(&self, fault: &PlannedFault) -> Duration {
        self.config.ttl.mul_f64(fault.factor)
    }

    /// The lock of `turn` (above 0) that is not the row's: on SQLite a leader's disk
    /// stalls (1) or fails (2), on an owned PostgreSQL server its WAL disk stalls (1).
    /// `None` when it cannot be made now.
    fn lock_of_turn(
        &mut self,
        fault: &PlannedFault,
        turn: u64,
    ) -> Option<(LockHolder, Option<usize>)> {
        match self.owned {
            Owned::Postgres(server) => match server.stall_wal() {
                Ok(()) => Some((LockHolder::WalDisk(server.clone()), None)),
                Err(error) => {
                    warn!(%error, "cannot stall the server's WAL disk");
                    None
                }
            },
            _ => self.stall_disk(fault, turn == 2),
        }
    }

    /// Stalls the disk of a worker seen holding a lease (`failing`: makes every sync of
    /// it answer EIO instead), chosen by the plan's pick: its own commit then holds the
    /// file's write lock. `None` when no such worker is known or the signal fails.
    fn stall_disk(
        &mut self,
        fault: &PlannedFault,
        failing: bool,
    ) -> Option<(LockHolder, Option<usize>)> {
        // Only a worker seen holding a lease has surely set up its stalling disk (and
        // its signal handlers: before them, the signal would end the process).
        let leaders = self.leaders(false);
        let slot = *leaders.get((fault.pick % leaders.len().max(1) as u64) as usize)?;
        let signal = if failing {
            Signal::SIGPWR
        } else {
            Signal::SIGUSR1
        };
        kill(self.slots[slot].pgid, signal).ok()?;
        let name = self.slots[slot].name.clone();
        Some((
            LockHolder::Disk {
                slot,
                name,
                failing,
            },
            Some(slot),
        ))
    }

    pub(super) async fn kill_and_replace(
        &mut self,
        i: usize,
        kind: FaultKind,
        at: u64,
    ) -> Result<(), ChaosError> {
        let _ = killpg(self.slots[i].pgid, Signal::SIGKILL);
        let _ = self.slots[i].child.wait().await;
        let name = self.slots[i].name.clone();
        if let Some((_, record)) = self.slots[i].paused.take() {
            self.faults[record].healed = mono_ns();
        }
        self.replace(i)?;
        self.faults.push(FaultRecord {
            kind,
            flavour: None,
            target: Some(name),
            at,
            healed: mono_ns(),
        });
        Ok(())
    }

    /// Severs the workers from the store one of the ways this store allows (chosen by
    /// the plan's pick; a cut during a blackhole or wedge drops the held connections).
    pub(super) async fn cut(&mut self, fault: &PlannedFault, at: u64) {
        let mut flavour = self.cuts[((fault.pick >> 32) % self.cuts.len() as u64) as usize];
        if self.held.is_some() && flavour != CutFlavour::Terminate {
            flavour = CutFlavour::Drop;
        }
        let slot = match flavour {
            CutFlavour::Drop => {
                let n: usize = self.proxies_of(None).map(Proxy::drop_all).sum();
                debug!(connections = n, "reset worker connections");
                None
            }
            CutFlavour::Blackhole => None,
            // Half the wedges cut off the leader, half anyone.
            CutFlavour::Wedge => match self.pick(fault.pick, fault.pick.is_multiple_of(2), false) {
                Some(i) => Some(i),
                None => {
                    self.skipped += 1;
                    return;
                }
            },
            CutFlavour::Terminate => {
                match self
                    .backend
                    .terminate_connections(&self.spawner.app_name)
                    .await
                {
                    Ok(n) => debug!(connections = n, "terminated worker connections"),
                    Err(error) => warn!(%error, "cannot terminate worker connections"),
                }
                None
            }
        };
        if matches!(flavour, CutFlavour::Blackhole | CutFlavour::Wedge) {
            for proxy in self.proxies_of(slot) {
                proxy.blackhole();
            }
            self.held = Some(Held {
                until: Instant::now() + self.config.ttl.mul_f64(fault.factor),
                record: self.faults.len(),
                slot,
            });
            let name = match slot {
                Some(i) if self.spawner.registry_direct(i) => "wedge-store",
                _ => flavour.name(),
            };
            self.record(fault.kind, Some(name), slot, at, 0);
            return;
        }
        self.record(fault.kind, Some(flavour.name()), None, at, mono_ns());
    }

    pub(super) fn record(
        &mut self,
        kind: FaultKind,
        flavour: Option<&'static str>,
        slot: Option<usize>,
        at: u64,
        healed: u64,
    ) {
        self.faults.push(FaultRecord {
            kind,
            flavour,
            target: slot.map(|i| self.slots[i].name.clone()),
            at,
            healed,
        });
    }

    /// Resumes the paused, asks every worker to stop (SIGTERM: release and exit), and
    /// kills whoever has not stopped within a term and a bit.
    pub(super) async fn stop_all(&mut self) -> Result<(), ChaosError> {
        self.heal();
        self.unlock().await;
        for i in 0..self.slots.len() {
            self.resume(i);
        }
        for slot in &self.slots {
            let _ = killpg(slot.pgid, Signal::SIGTERM);
        }
        let deadline = Instant::now() + self.config.ttl * 2 + Duration::from_secs(3);
        for slot in &mut self.slots {
            if tokio::time::timeout_at(deadline, slot.child.wait())
                .await
                .is_err()
            {
                warn!(worker = %slot.name, "worker did not stop on SIGTERM; killing it");
                let _ = killpg(slot.pgid, Signal::SIGKILL);
                let _ = slot.child.wait().await;
            }
        }
        Ok(())
    }
}
