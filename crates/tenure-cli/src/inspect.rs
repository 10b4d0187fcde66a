//! `tenure status`, `tenure leader`, `tenure members` and `tenure fence`: look at and
//! use a store.

use std::time::Duration;

use serde::Serialize;
use tenure::{Error, FencingToken, Leader, LeaseInfo, NodeInfo};

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
    /// The live term's advertised value.
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<&'a str>,
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

#[derive(Serialize)]
struct GroupReport<'a> {
    group: &'a str,
    shards: Vec<ShardRow<'a>>,
    per_member: std::collections::BTreeMap<&'a str, usize>,
    unowned: usize,
}

#[derive(Serialize)]
struct ShardRow<'a> {
    shard: u32,
    owner: Option<&'a str>,
    fencing_token: u64,
    expires_in_ms: Option<u128>,
}

/// The leases of `group`'s shards (roles `group/k`), sorted by shard number.
fn shard_leases(group: &str, leases: Vec<LeaseInfo>) -> Vec<(u32, LeaseInfo)> {
    let prefix = format!("{group}/");
    let mut shards: Vec<(u32, LeaseInfo)> = leases
        .into_iter()
        .filter_map(|lease| {
            let shard = lease.role.strip_prefix(&prefix)?.parse().ok()?;
            Some((shard, lease))
        })
        .collect();
    shards.sort_by_key(|(shard, _)| *shard);
    shards
}

/// Prints a shard group once, or every second with `watch`: shard, owner, token and
/// expiry, then how many shards each member owns.
pub async fn group_status(
    stores: &Stores,
    group: &str,
    json: bool,
    watch: bool,
) -> anyhow::Result<u8> {
    loop {
        let shards = shard_leases(
            group,
            stores.leases.list_prefix(&format!("{group}/")).await?,
        );
        let mut per_member = std::collections::BTreeMap::new();
        for (_, lease) in &shards {
            if let Some(owner) = lease.live_holder() {
                *per_member.entry(owner).or_insert(0) += 1;
            }
        }
        let unowned = shards
            .iter()
            .filter(|(_, lease)| lease.live_holder().is_none())
            .count();
        if json {
            let report = GroupReport {
                group,
                shards: shards
                    .iter()
                    .map(|(shard, lease)| ShardRow {
                        shard: *shard,
                        owner: lease.live_holder(),
                        fencing_token: lease.fencing_token.get(),
                        expires_in_ms: lease.live_holder().map(|_| lease.remaining().as_millis()),
                    })
                    .collect(),
                per_member,
                unowned,
            };
            println!("{}", serde_json::to_string(&report)?);
        } else if shards.is_empty() {
            println!("no shards of group {group:?}");
        } else {
            let leases: Vec<LeaseInfo> = shards.iter().map(|(_, lease)| lease.clone()).collect();
            let mut rows = lease_rows(&leases);
            for (row, (shard, _)) in rows.iter_mut().zip(&shards) {
                row[0] = shard.to_string();
            }
            print!("{}", table(&["SHARD", "OWNER", "TOKEN", "EXPIRES"], &rows));
            println!();
            let mut members: Vec<Vec<String>> = per_member
                .iter()
                .map(|(member, n)| vec![(*member).to_owned(), n.to_string()])
                .collect();
            if unowned > 0 {
                members.push(vec!["(unowned)".to_owned(), unowned.to_string()]);
            }
            print!("{}", table(&["MEMBER", "SHARDS"], &members));
        }
        if !again(watch, json).await {
            return Ok(exit::OK);
        }
    }
}

/// One line of `tenure leader --json`.
#[derive(Serialize)]
struct LeaderLine<'a> {
    role: &'a str,
    leader: Option<&'a Leader>,
}

/// Prints `role`'s live leader and its advertised value; with `watch`, then each change
/// as the store pushes it, until interrupted. Reads only: it never contends.
pub async fn leader(stores: &Stores, role: &str, json: bool, watch: bool) -> anyhow::Result<u8> {
    let mut observer = tenure::observe(stores.leases.clone(), role)?;
    loop {
        let change = tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(exit::OK),
            change = observer.changed() => change,
        };
        match change {
            Ok(leader) => print_leader(role, leader.as_ref(), json)?,
            // A watcher outlives a store outage: say so and keep watching.
            Err(error) if watch => {
                tracing::warn!(%error, "reading the leader failed; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(error) => return Err(error.into()),
        }
        if !watch {
            return Ok(exit::OK);
        }
    }
}

fn print_leader(role: &str, leader: Option<&Leader>, json: bool) -> anyhow::Result<()> {
    use std::io::Write;
    let line = if json {
        serde_json::to_string(&LeaderLine { role, leader })?
    } else {
        match leader {
            None => format!("{role}: no leader"),
            Some(leader) => {
                let value = leader
                    .value
                    .as_deref()
                    .map_or(String::new(), |value| format!(" at {value}"));
                format!(
                    "{role}: {} (token {}){value}",
                    leader.owner, leader.fencing_token
                )
            }
        }
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    // A pipe reader (`tenure leader --watch | ...`) sees each change as it happens.
    out.flush()?;
    Ok(())
}

/// After one view: `false` to stop (not watching, or interrupted); `true` a second
/// later, with a blank line between human-readable views.
async fn again(watch: bool, json: bool) -> bool {
    if !watch {
        return false;
    }
    tokio::select! {
        _ = tokio::signal::ctrl_c() => return false,
        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
    }
    if !json {
        println!();
    }
    true
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
                    value: l.live_holder().and(l.value.as_deref()),
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
        if !again(watch, json).await {
            return Ok(exit::OK);
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
