//! `tenure status`, `tenure members` and `tenure fence`: look at and use a store.

use std::time::Duration;

use serde::Serialize;
use tenure::{Error, FencingToken, LeaseInfo, NodeInfo};

use crate::output::{human, table};
use crate::store::Stores;
use crate::{exit, UsageError};

#[derive(Serialize)]
struct LeaseRow<'a> {
    role: &'a str,
    holder: Option<&'a str>,
    live: bool,
    fencing_token: u64,
    expires_in_ms: Option<u128>,
}

fn lease_rows(leases: &[LeaseInfo]) -> Vec<Vec<String>> {
    leases
        .iter()
        .map(|lease| {
            let (holder, expires) = match (lease.live_holder(), &lease.holder) {
                (Some(holder), _) => (
                    holder.to_owned(),
                    format!("in {}", human(lease.remaining())),
                ),
                (None, Some(holder)) => (format!("({holder})"), "expired".to_owned()),
                (None, None) => ("-".to_owned(), "released".to_owned()),
            };
            vec![
                lease.role.clone(),
                holder,
                lease.fencing_token.to_string(),
                expires,
            ]
        })
        .collect()
}

/// Prints leases once, or every second with `watch` until interrupted.
pub async fn status(
    stores: &Stores,
    role: Option<&str>,
    json: bool,
    watch: bool,
) -> anyhow::Result<u8> {
    loop {
        let leases = match role {
            Some(role) => stores.leases.get(role).await?.into_iter().collect(),
            None => stores.leases.list().await?,
        };
        if json {
            let rows: Vec<LeaseRow> = leases
                .iter()
                .map(|l| LeaseRow {
                    role: &l.role,
                    holder: l.live_holder(),
                    live: l.live_holder().is_some(),
                    fencing_token: l.fencing_token.get(),
                    expires_in_ms: l.live_holder().map(|_| l.remaining().as_millis()),
                })
                .collect();
            println!("{}", serde_json::to_string(&rows)?);
        } else if leases.is_empty() {
            println!(
                "{}",
                match role {
                    Some(role) => format!("no lease for role {role:?}"),
                    None => "no leases".to_owned(),
                }
            );
        } else {
            print!(
                "{}",
                table(
                    &["ROLE", "HOLDER", "TOKEN", "EXPIRES"],
                    &lease_rows(&leases)
                )
            );
        }
        if !watch {
            return Ok(exit::OK);
        }
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(exit::OK),
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        if !json {
            println!();
        }
    }
}

#[derive(Serialize)]
struct MemberRow<'a> {
    node_id: &'a str,
    last_heartbeat_age_ms: u128,
    member_for_ms: u128,
    metadata: &'a tenure::Metadata,
}

/// Prints the live members.
pub async fn members(stores: &Stores, json: bool) -> anyhow::Result<u8> {
    let members: Vec<NodeInfo> = stores.registry.members().await?;
    if json {
        let rows: Vec<MemberRow> = members
            .iter()
            .map(|m| MemberRow {
                node_id: &m.node_id,
                last_heartbeat_age_ms: m.heartbeat_age().as_millis(),
                member_for_ms: m
                    .now
                    .duration_since(m.first_seen)
                    .unwrap_or_default()
                    .as_millis(),
                metadata: &m.metadata,
            })
            .collect();
        println!("{}", serde_json::to_string(&rows)?);
        return Ok(exit::OK);
    }
    if members.is_empty() {
        println!("no live members");
        return Ok(exit::OK);
    }
    let rows: Vec<Vec<String>> = members
        .iter()
        .map(|m| {
            let metadata = m
                .metadata
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ");
            vec![
                m.node_id.clone(),
                format!("{} ago", human(m.heartbeat_age())),
                human(m.now.duration_since(m.first_seen).unwrap_or_default()),
                metadata,
            ]
        })
        .collect();
    print!(
        "{}",
        table(&["NODE", "LAST HEARTBEAT", "MEMBER FOR", "METADATA"], &rows)
    );
    Ok(exit::OK)
}

/// Parses `tenure fence --token`, before any store is opened.
pub fn parse_token(token: &str) -> Result<u64, UsageError> {
    // Every backend stores tokens as a signed 64-bit integer.
    let parsed = token
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|t| i64::try_from(*t).is_ok());
    parsed.ok_or_else(|| {
        UsageError(format!(
            "--token {token:?} is not a fencing token (a whole number from 0 to {})",
            i64::MAX
        ))
    })
}

/// Admits `token` on the store's fence for `resource`: exit 0, or [`exit::FENCED`] with
/// the highest admitted token on stderr.
pub async fn fence(stores: &Stores, resource: &str, token: u64) -> anyhow::Result<u8> {
    match stores
        .fence
        .admit(resource, FencingToken::from(token))
        .await
    {
        Ok(()) => Ok(exit::OK),
        Err(Error::Fenced { presented, highest }) => {
            eprintln!(
                "tenure: fenced: token {presented} is older than the highest admitted token for {resource:?}"
            );
            eprintln!("highest={highest}");
            Ok(exit::FENCED)
        }
        Err(other) => Err(other.into()),
    }
}
