//! `tenure drain`: move every shard away from one member of a shard group before it is
//! stopped, from anywhere the store is reachable (see `tenure::shard::drain`).

use std::time::Duration;

use serde::Serialize;
use tenure::shard::{cancel_drain, request_drain, DrainOutcome};

use crate::exit;
use crate::store::Stores;

/// One line of `tenure drain --json`.
#[derive(Serialize)]
struct DrainLine<'a> {
    group: &'a str,
    node: &'a str,
    /// `drained`, `already_asked`, `not_drained` or `cancelled` / `not_draining`.
    outcome: &'static str,
    /// Shards the member held when asked.
    held: Option<usize>,
    /// Shards it still held at the timeout.
    left: Option<usize>,
    /// From the request until every shard ran elsewhere, in milliseconds.
    took_ms: Option<f64>,
    /// The requester of a drain already in force.
    asked_by: Option<&'a str>,
}

/// Drains `node` of `group` and waits up to `timeout`; the drain stays in force for
/// `hold`. Exit 0 once every shard it held runs elsewhere, 75 when a drain of it is
/// already in force, 124 when it still held shards at the timeout.
pub async fn drain(
    stores: &Stores,
    group: &str,
    node: &str,
    hold: Duration,
    timeout: Duration,
    json: bool,
) -> anyhow::Result<u8> {
    let requester = tenure::owner_id_with_label("drain")?;
    let outcome = request_drain(
        stores.leases.clone(),
        group,
        node,
        &requester,
        hold,
        timeout,
    )
    .await?;
    let mut line = DrainLine {
        group,
        node,
        outcome: "",
        held: None,
        left: None,
        took_ms: None,
        asked_by: None,
    };
    let code = match &outcome {
        DrainOutcome::Drained { held, took } => {
            line.outcome = "drained";
            line.held = Some(*held);
            line.took_ms = Some(took.as_secs_f64() * 1e3);
            exit::OK
        }
        DrainOutcome::AlreadyAsked { by } => {
            line.outcome = "already_asked";
            line.asked_by = Some(by);
            exit::BUSY
        }
        DrainOutcome::NotDrained { held, left } => {
            line.outcome = "not_drained";
            line.held = Some(*held);
            line.left = Some(*left);
            exit::TIMEOUT
        }
    };
    if json {
        println!("{}", serde_json::to_string(&line)?);
        return Ok(code);
    }
    match outcome {
        DrainOutcome::Drained { held, took } => println!(
            "{group}: {node} drained: its {held} shards run elsewhere ({}); it stays out of \
             the group for {}",
            crate::output::human(took),
            crate::output::human(hold)
        ),
        DrainOutcome::AlreadyAsked { by } => {
            eprintln!(
                "tenure drain: a drain of {node} in {group} is already in force, asked by {by}"
            )
        }
        DrainOutcome::NotDrained { held, left } => eprintln!(
            "tenure drain: {node} still held {left} of its {held} shards of {group} after {}: \
             it is not running, its shards' commands did not stop, no other member is live, \
             or it runs a tenure without drains. The drain stays in force for {}",
            crate::output::human(timeout),
            crate::output::human(hold)
        ),
    }
    Ok(code)
}

/// Ends the drain of `node` in force: it joins `group` again. Exit 0 when one was in
/// force, 1 when none was.
pub async fn cancel(stores: &Stores, group: &str, node: &str, json: bool) -> anyhow::Result<u8> {
    let ended = cancel_drain(stores.leases.as_ref(), group, node).await?;
    let (outcome, code) = if ended {
        ("cancelled", exit::OK)
    } else {
        ("not_draining", exit::FAILURE)
    };
    if json {
        let line = DrainLine {
            group,
            node,
            outcome,
            held: None,
            left: None,
            took_ms: None,
            asked_by: None,
        };
        println!("{}", serde_json::to_string(&line)?);
    } else if ended {
        println!("{group}: the drain of {node} ended; it joins the group again");
    } else {
        eprintln!("tenure drain: no drain of {node} in {group} is in force");
    }
    Ok(code)
}
