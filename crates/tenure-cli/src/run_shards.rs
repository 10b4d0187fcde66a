//! `tenure run --group G --shards N`: this process is one member of a shard group and
//! runs the command once per shard it owns.
//!
//! Each shard's command gets `TENURE_SHARD` (k), `TENURE_SHARDS` (N), `TENURE_ROLE`
//! (`G/k`), that shard's `TENURE_FENCING_TOKEN`, `TENURE_OWNER` (the node id) and
//! `TENURE_STORE`. It is started as a session leader, and stopped (SIGTERM, then SIGKILL
//! after `--kill-after`, the whole session) when the shard is lost or handed over; it starts
//! again when a new term of that shard begins here. A command that exits on its own ends
//! its term (the shard is released and taken again after `--retry-every`). SIGINT, SIGTERM,
//! SIGHUP or SIGQUIT to tenure stops every command, releases every shard at once and leaves
//! the group; SIGUSR1, SIGUSR2 and SIGALRM are ignored (nothing is forwarded to the shards'
//! commands), and SIGTTOU and SIGTTIN too. A process that starts its own session (`setsid`) escapes the stop: fence its
//! writes.

use std::sync::Arc;

use anyhow::Context;

use nix::sys::signal::Signal;
use tenure::{FencingToken, ShardElector, ShardOptions};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::exit;
use crate::exporter::{Exporter, Subject};
use crate::run::{ChildSpec, Outcome, RunArgs, ScopeKind};
use crate::store::Stores;

/// The shard-group options these arguments stand for; `node_id` is the member's id.
pub fn options(args: &RunArgs, group: &str, shards: u32, node_id: String) -> ShardOptions {
    ShardOptions {
        group: group.to_owned(),
        shards,
        node_id,
        lease_ttl: args.ttl,
        renew_interval: args.renew_every(),
        retry_interval: args.retry_every,
        work_grace: args.work_grace(),
        ..Default::default()
    }
}

/// Runs the member until SIGINT, SIGTERM, SIGHUP or SIGQUIT, serving `exporter` if given;
/// returns tenure's exit code.
pub async fn run(
    mut stores: Stores,
    args: RunArgs,
    group: String,
    shards: u32,
    exporter: Option<Exporter>,
) -> anyhow::Result<u8> {
    let exporter = exporter.map(|e| e.watch_store(&mut stores, args.health_window()));
    let node_id = match &args.node_id {
        Some(node_id) => node_id.clone(),
        None => args.owner_id()?,
    };
    let elector = ShardElector::new(
        stores.leases.clone(),
        stores.registry.clone(),
        options(&args, &group, shards, node_id.clone()),
    )?;
    // Orphans of the commands re-parent to tenure rather than to init: each command's
    // processes are then all in tenure's tree, which is read instead of all of `/proc`.
    nix::sys::prctl::set_child_subreaper(true)
        .context("cannot become a child subreaper (PR_SET_CHILD_SUBREAPER)")?;
    let _guard_follows = crate::guard::follow(elector.deadline(), args.kill_after());
    if let Some(exporter) = exporter {
        exporter.serve(Subject::Group {
            group: group.clone(),
            state: elector.watch(),
        })?;
    }
    info!(group, shards, node = %node_id, ttl = ?args.ttl, renew_every = ?args.renew_every(),
        kill_after = ?args.kill_after(), "member of the shard group");
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let mut signals = crate::run::Signals::new()?;
        // Ctrl-Z and fg are not for a member: it keeps renewing, its commands keep running.
        while let Some(signal) = signals.recv().await {
            if crate::run::asks_to_stop(signal) {
                info!(?signal, "stopping: every shard's command, then the session");
                break;
            }
            if !matches!(signal, Signal::SIGTSTP | Signal::SIGCONT) {
                info!(
                    ?signal,
                    "ignored: signals are not forwarded to the shards' commands"
                );
            }
        }
        stop.cancel();
        anyhow::Ok(())
    });
    let command = Arc::new(args.command.clone());
    let store_url = Arc::new(args.store_url.clone());
    let kill_after = args.kill_after();
    let deadline = elector.deadline();
    elector
        .run(
            move |shard, token, leadership| {
                let spec = ChildSpec {
                    command: command.as_ref().clone(),
                    token,
                    role: tenure::shard::role(&group, shard),
                    owner: node_id.clone(),
                    store_url: store_url.as_ref().clone(),
                    kill_after,
                    suspended: Arc::default(),
                    extra_env: vec![
                        ("TENURE_SHARD", shard.to_string()),
                        ("TENURE_SHARDS", shards.to_string()),
                    ],
                    scope: ScopeKind::OwnSession,
                    deadline: deadline.clone(),
                };
                run_shard(spec, shard, token, leadership)
            },
            shutdown,
        )
        .await?;
    Ok(exit::OK)
}

async fn run_shard(
    spec: ChildSpec,
    shard: u32,
    token: FencingToken,
    leadership: CancellationToken,
) {
    // Signals go to tenure, not to a shard's command: nothing is forwarded.
    let (_forward_tx, mut forward) = mpsc::unbounded_channel();
    match spec.run(&leadership, &mut forward).await {
        Outcome::Exited(status) => {
            info!(shard, token = %token, ?status, "the shard's command exited; ending its term")
        }
        Outcome::Lost(_) => info!(shard, token = %token, "the shard's command was stopped"),
        Outcome::SpawnFailed(error) => {
            warn!(shard, token = %token, %error, "cannot run the shard's command")
        }
        Outcome::NotStarted => {}
    }
}
