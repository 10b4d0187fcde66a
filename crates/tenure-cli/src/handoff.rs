//! `tenure handoff`: ask the leader of a role to hand its term over, from anywhere the
//! store is reachable, and wait until it has (see `tenure::handoff`).

use std::time::Duration;

use serde::Serialize;
use tenure::handoff::{request_handoff, HandoffOutcome};
use tenure::Leader;

use crate::exit;
use crate::store::Stores;

/// One line of `tenure handoff --json`.
#[derive(Serialize)]
struct HandoffLine<'a> {
    role: &'a str,
    /// `handed_over`, `no_leader`, `already_asked` or `not_handed_over`.
    outcome: &'static str,
    from: Option<&'a Leader>,
    to: Option<&'a Leader>,
    /// The requester of a handoff already in flight.
    asked_by: Option<&'a str>,
}

/// Asks `role`'s leader to hand over to `to` (or the longest-waiting contender), waits
/// up to `timeout`, and says what happened. Exit 0 once another term leads; 1 when
/// nobody leads; 75 when another handoff is being asked; 124 when the leader did not
/// hand over in time.
pub async fn handoff(
    stores: &Stores,
    role: &str,
    to: Option<&str>,
    timeout: Duration,
    json: bool,
) -> anyhow::Result<u8> {
    let requester = tenure::owner_id_with_label("handoff")?;
    let outcome = request_handoff(stores.leases.clone(), role, to, &requester, timeout).await?;
    let (name, code, from, next, by) = match &outcome {
        HandoffOutcome::HandedOver { from, to } => {
            ("handed_over", exit::OK, Some(from), Some(to), None)
        }
        HandoffOutcome::NoLeader => ("no_leader", exit::FAILURE, None, None, None),
        HandoffOutcome::AlreadyAsked { by } => {
            ("already_asked", exit::BUSY, None, None, Some(by.as_str()))
        }
        HandoffOutcome::NotHandedOver { from } => {
            ("not_handed_over", exit::TIMEOUT, Some(from), None, None)
        }
    };
    if json {
        let line = HandoffLine {
            role,
            outcome: name,
            from,
            to: next,
            asked_by: by,
        };
        println!("{}", serde_json::to_string(&line)?);
        return Ok(code);
    }
    match &outcome {
        HandoffOutcome::HandedOver { from, to } => println!(
            "{role}: handed over from {} (token {}) to {} (token {})",
            from.owner, from.fencing_token, to.owner, to.fencing_token
        ),
        HandoffOutcome::NoLeader => eprintln!("tenure handoff: nobody leads {role}"),
        HandoffOutcome::AlreadyAsked { by } => {
            eprintln!("tenure handoff: a handoff of {role} is already being asked for by {by}")
        }
        HandoffOutcome::NotHandedOver { from } => eprintln!(
            "tenure handoff: {} (token {}) did not hand {role} over within {}: {} was not \
             waiting in the queue, or the leader does not accept handoff requests",
            from.owner,
            from.fencing_token,
            crate::output::human(timeout),
            to.map_or_else(|| "nobody".to_owned(), |to| format!("{to:?}")),
        ),
    }
    Ok(code)
}
