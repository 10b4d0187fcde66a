//! Planned handoff asked from anywhere: a request kept in the store, which the leading
//! elector acts on.
//!
//! [`LeaseLeaderElector::hand_off`](crate::LeaseLeaderElector::hand_off) needs the
//! elector in hand; an operator draining a host, or a deploy script, has only the store.
//! [`request_handoff`] leaves a request there: a term on the role's *request role*
//! ([`request_role`]: `tenure.handoff/` + the role) whose value names the leader's token
//! and the successor wanted. A leading elector with
//! [`LeaseLeaderOptions::accept_handoff_requests`](crate::LeaseLeaderOptions::accept_handoff_requests)
//! (`tenure run` sets it) watches that role by the store's push, and when a request names its own
//! term it hands off as `hand_off` does. The requester waits until another term leads the
//! role, then withdraws its request. A request naming an older term is ignored, so a
//! request left behind (its requester died) never moves a later leader; it lapses with its
//! TTL.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::lease::{validate_name, validate_successor};
use crate::{Error, FencingToken, Leader, LeaseStore, Result};

/// The prefix of request roles: `tenure.handoff/ROLE` carries requests to hand `ROLE`
/// over. Roles of one's own should not start with it.
pub const REQUEST_ROLE_PREFIX: &str = "tenure.handoff/";

/// The request role of `role`; an error naming `role` when the two together pass the
/// 255-byte limit of role names.
pub fn request_role(role: &str) -> Result<String> {
    validate_name("role", role)?;
    let request = format!("{REQUEST_ROLE_PREFIX}{role}");
    validate_name("role", &request).map_err(|_| {
        Error::invalid(
            "role",
            format!(
                "is {} bytes long; a role that can be handed off on request is at most {} \
                 (its request role adds {REQUEST_ROLE_PREFIX:?})",
                role.len(),
                crate::lease::MAX_NAME_LEN - REQUEST_ROLE_PREFIX.len()
            ),
        )
    })?;
    Ok(request)
}

/// A handoff request as kept in the request role's value: the term to hand off, and the
/// successor wanted (`None`: the contender that waited longest).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandoffAsk {
    /// The token of the term the requester saw leading.
    pub fencing_token: FencingToken,
    /// The owner id of the successor wanted.
    pub successor: Option<String>,
}

impl HandoffAsk {
    /// `TOKEN` or `TOKEN SUCCESSOR`.
    pub fn encode(&self) -> String {
        match &self.successor {
            Some(successor) => format!("{} {successor}", self.fencing_token),
            None => self.fencing_token.to_string(),
        }
    }

    /// The request in a request role's value; `None` for anything else.
    pub fn decode(value: &str) -> Option<HandoffAsk> {
        let (token, successor) = match value.split_once(' ') {
            Some((token, successor)) => (token, Some(successor.to_owned())),
            None => (value, None),
        };
        let fencing_token = FencingToken::from(token.parse::<u64>().ok()?);
        if let Some(successor) = &successor {
            validate_name("successor", successor).ok()?;
        }
        Some(HandoffAsk {
            fencing_token,
            successor,
        })
    }
}

/// How a [`request_handoff`] ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandoffOutcome {
    /// The leader handed over: `from` led before, `to` leads now.
    HandedOver {
        /// The leader asked.
        from: Leader,
        /// The leader after the handoff.
        to: Leader,
    },
    /// Nobody led the role when asked.
    NoLeader,
    /// Another handoff of the role is being asked for, by `by`; nothing was asked.
    AlreadyAsked {
        /// The requester of the handoff in flight.
        by: String,
    },
    /// The leader did not hand over within the timeout: nobody (or not the successor
    /// named) was waiting, or the leader does not accept requests (an elector with
    /// `accept_handoff_requests` off, or an older tenure).
    NotHandedOver {
        /// The leader asked, still leading when the timeout passed (or gone without a
        /// successor).
        from: Leader,
    },
}

/// Asks the leader of `role` to hand its term to `successor` (an owner id of a
/// contender waiting in the role's queue; `None`: the one that waited longest) and waits
/// up to `timeout` for another term to lead. `requester` names the asker (an owner id:
/// unique per process). While another request for the role is in flight nothing is
/// asked ([`HandoffOutcome::AlreadyAsked`]).
pub async fn request_handoff(
    store: Arc<dyn LeaseStore>,
    role: &str,
    successor: Option<&str>,
    requester: &str,
    timeout: Duration,
) -> Result<HandoffOutcome> {
    let request = request_role(role)?;
    validate_successor(successor)?;
    validate_name("requester", requester)?;
    if timeout.is_zero() {
        return Err(Error::invalid("timeout", "must be greater than zero"));
    }
    let Some(from) = store.get(role).await?.as_ref().and_then(Leader::of) else {
        return Ok(HandoffOutcome::NoLeader);
    };
    let ask = HandoffAsk {
        fencing_token: from.fencing_token,
        successor: successor.map(str::to_owned),
    };
    // The request lasts as long as the requester waits (at least a second, for etcd and
    // Kubernetes, which take whole seconds).
    let ttl = Duration::from_secs(timeout.as_secs().max(1)).max(store.min_ttl());
    let asked = store
        .try_acquire_or_renew_with_value(&request, requester, ttl, Some(&ask.encode()))
        .await?;
    if !asked.acquired {
        return Ok(HandoffOutcome::AlreadyAsked { by: asked.holder });
    }
    let deadline = Instant::now() + timeout;
    let outcome = wait_for_new_leader(&*store, role, &from, deadline).await;
    // Done either way: a request left behind would only lapse.
    let _ = store
        .release(&request, requester, asked.fencing_token)
        .await;
    Ok(match outcome? {
        Some(to) => HandoffOutcome::HandedOver { from, to },
        None => HandoffOutcome::NotHandedOver { from },
    })
}

/// Waits until a live term other than `from`'s leads `role`, or `deadline`.
async fn wait_for_new_leader(
    store: &dyn LeaseStore,
    role: &str,
    from: &Leader,
    deadline: Instant,
) -> Result<Option<Leader>> {
    loop {
        let info = store.get(role).await?;
        let leader = info.as_ref().and_then(Leader::of);
        match leader {
            Some(leader) if leader.fencing_token != from.fencing_token => return Ok(Some(leader)),
            _ if Instant::now() >= deadline => return Ok(None),
            Some(_) => {
                store
                    .wait_for_change(role, from.fencing_token, deadline)
                    .await
            }
            None => {
                let after = info.map_or(from.fencing_token, |info| info.fencing_token);
                store.wait_for_term(role, after, deadline).await;
            }
        }
    }
}

/// A request the leader acts on: the request role's token (so it is acted on once) and
/// the successor it asks for.
pub(crate) struct Asked {
    /// The token of the request's own term on the request role.
    pub request_token: FencingToken,
    /// The successor asked for; `None` for the contender that waited longest.
    pub successor: Option<String>,
}

/// Waits for a request naming the term `token` (see the [module](self) docs) whose own
/// token on the request role is above `acted`, the last one acted on. Pending forever
/// when requests cannot be read: a leader keeps leading.
pub(crate) async fn next_request(
    store: &dyn LeaseStore,
    request: &str,
    token: FencingToken,
    acted: FencingToken,
    poll: Duration,
) -> Asked {
    loop {
        let info = match store.get(request).await {
            Ok(info) => info,
            Err(error) => {
                tracing::debug!(%error, request, "reading handoff requests failed; trying again");
                tokio::time::sleep(poll).await;
                continue;
            }
        };
        let deadline = Instant::now() + poll;
        match info {
            Some(info) if info.live_holder().is_some() => {
                let ask = info.value.as_deref().and_then(HandoffAsk::decode);
                if let Some(ask) = ask {
                    if ask.fencing_token == token && info.fencing_token > acted {
                        return Asked {
                            request_token: info.fencing_token,
                            successor: ask.successor,
                        };
                    }
                }
                // Another term's request, one acted on, or not a request at all: wait
                // for it to end.
                store
                    .wait_for_change(request, info.fencing_token, deadline)
                    .await;
            }
            Some(info) => {
                store
                    .wait_for_term(request, info.fencing_token, deadline)
                    .await
            }
            None => {
                store
                    .wait_for_term(request, FencingToken::from(0), deadline)
                    .await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asks_round_trip_and_junk_is_not_one() {
        for ask in [
            HandoffAsk {
                fencing_token: FencingToken::from(7),
                successor: None,
            },
            HandoffAsk {
                fencing_token: FencingToken::from(u64::MAX),
                successor: Some("node-b.ünï-3".to_owned()),
            },
        ] {
            assert_eq!(HandoffAsk::decode(&ask.encode()), Some(ask));
        }
        for junk in ["", " ", "x", "-1", "7 ", "7 a\u{7}b", "http://leader:80"] {
            assert_eq!(HandoffAsk::decode(junk), None, "{junk:?}");
        }
    }

    #[test]
    fn request_roles_fit_the_name_limit() {
        assert_eq!(request_role("reports").unwrap(), "tenure.handoff/reports");
        let longest = "r".repeat(crate::lease::MAX_NAME_LEN - REQUEST_ROLE_PREFIX.len());
        assert!(request_role(&longest).is_ok());
        let error = request_role(&format!("{longest}r")).unwrap_err();
        assert!(error.to_string().contains("request role"), "{error}");
        assert!(request_role("").is_err());
    }
}
