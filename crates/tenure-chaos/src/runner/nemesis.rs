//! The nemesis: injects the planned faults into workers, proxies and the server, heals
//! them, replaces dead workers, and stops everything at the end.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use tokio::time::Instant;
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
    pub(super) proxies: &'a [Proxy],
    /// The ways this store can be cut.
    pub(super) cuts: Vec<CutFlavour>,
    /// When the current blackhole heals, and which fault record it is.
    pub(super) blackhole: Option<(Instant, usize)>,
    /// A server restart under way. It runs beside the nemesis, which goes on injecting
    /// faults meanwhile.
    pub(super) restarting: Option<Restarting>,
    /// When the last server restart was done (the server serving again) and how long
    /// it took.
    pub(super) restarted: Option<(Instant, Duration)>,
    /// The workers' wall clock offset from the real one, ms.
    pub(super) clock_offset_ms: i64,
    /// The worker names holding a live lease, as last observed.
    pub(super) holders: Arc<Mutex<Vec<String>>>,
    pub(super) slots: Vec<Slot>,
    pub(super) faults: Vec<FaultRecord>,
    pub(super) skipped: u64,
    pub(super) respawned: u64,
}

impl Nemesis<'_> {
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
                .chain(self.blackhole.map(|b| b.0))
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
            if self.blackhole.is_some_and(|(until, _)| until <= now) {
                self.heal();
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

    /// Ends the current blackhole, if any.
    pub(super) fn heal(&mut self) {
        if let Some((_, record)) = self.blackhole.take() {
            for proxy in self.proxies {
                proxy.heal();
            }
            self.faults[record].healed = mono_ns();
        }
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
    /// the plan's pick; a cut during a blackhole drops the held connections).
    pub(super) async fn cut(&mut self, fault: &PlannedFault, at: u64) {
        let mut flavour = self.cuts[((fault.pick >> 32) % self.cuts.len() as u64) as usize];
        if self.blackhole.is_some() && flavour != CutFlavour::Terminate {
            flavour = CutFlavour::Drop;
        }
        match flavour {
            CutFlavour::Drop => {
                let n: usize = self.proxies.iter().map(Proxy::drop_all).sum();
                debug!(connections = n, "reset worker connections");
            }
            CutFlavour::Blackhole => {
                for proxy in self.proxies {
                    proxy.blackhole();
                }
                let until = Instant::now() + self.config.ttl.mul_f64(fault.factor);
                self.blackhole = Some((until, self.faults.len()));
                self.record(fault.kind, Some(flavour.name()), None, at, 0);
                return;
            }
            CutFlavour::Terminate => {
                match self
                    .backend
                    .terminate_connections(&self.spawner.app_name)
                    .await
                {
                    Ok(n) => debug!(connections = n, "terminated worker connections"),
                    Err(error) => warn!(%error, "cannot terminate worker connections"),
                }
            }
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
