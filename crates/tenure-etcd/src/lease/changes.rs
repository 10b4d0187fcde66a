//! Reads of a prefix's leases: all of them ([`LeaseStore::list_prefix`]), or what changed
//! since a revision ([`LeaseStore::list_prefix_changes`]).
//!
//! Every term that begins or ends writes its role's `terms/R` record (a beginning also
//! puts `leases/R`, an end deletes it), and so does every renewal of a lease held
//! without a session. So the records whose mod revision is past the last read's
//! revision name every role whose term changed, and every such lease renewed since. What
//! no write announces is a lapse: etcd deletes the expired key and no record changes. A
//! lease under a session lapses with its session, whose key goes with it: a read lists
//! every session. A lease of its own that lapsed is found by count: a read also counts
//! the prefix's lease keys, and a reader whose copy counts otherwise reads everything
//! again ([`PrefixChanges::held`]). A lease of its own whose holder has not renewed
//! since the last read is not listed; the reader keeps what it had.
//!
//! The mark is the read's revision. etcd filters by mod revision after reading the
//! range, so the server still reads every term record of the prefix; what a read sends
//! and what its reader decodes is what changed. (A watch from the mark would spare the
//! server that too, but needs the history since the mark kept, and a way to tell that
//! the watch caught up.)

use tenure::lease::ListedLease;
use tenure::ChangeMark;

use super::*;

/// Roles a read's second step reads per transaction (two keys each): etcd allows 128
/// operations in one by default.
const ROLES_PER_TXN: usize = 60;

/// The keys of one role a read saw.
#[derive(Default)]
struct RoleKeys {
    lease: Option<KeyValue>,
    term: Option<KeyValue>,
    value: Option<KeyValue>,
}

/// Which key of a role a range holds.
#[derive(Clone, Copy)]
enum Part {
    Lease,
    Term,
    Value,
}

impl EtcdLeaseStore {
    /// Every lease of `prefix`, each with the session it is held under; marked with the
    /// read's revision.
    pub(super) async fn list_complete(&self, prefix: &str) -> Result<PrefixChanges> {
        let all = || Some(GetOptions::new().with_prefix());
        let txn = Txn::new().and_then([
            TxnOp::get(format!("{}{prefix}", self.keys.leases_dir()), all()),
            TxnOp::get(format!("{}{prefix}", self.keys.terms_dir()), all()),
            TxnOp::get(format!("{}{prefix}", self.keys.values_dir()), all()),
            TxnOp::get(self.keys.sessions_dir(), all()),
        ]);
        let response = self.conn.txn("listing leases", txn).await?;
        let (revision, gets) = answer(response)?;
        let [leases, terms, values, sessions] = gets_of(gets)?;
        let mut roles = BTreeMap::new();
        self.gather(&mut roles, leases.kvs(), Part::Lease);
        self.gather(&mut roles, terms.kvs(), Part::Term);
        self.gather(&mut roles, values.kvs(), Part::Value);
        let leases = listed(roles, &session_expiries(&sessions), self.wall());
        let held = leases
            .iter()
            .filter(|l| l.info.live_holder().is_some())
            .count();
        Ok(PrefixChanges {
            leases,
            complete: true,
            sessions: Vec::new(),
            mark: Some(revision),
            held: Some(held),
        })
    }

    /// What changed under `read.prefix` since `read.since` (see the module docs).
    pub(super) async fn list_changes(&self, read: ChangesRead<'_>) -> Result<PrefixChanges> {
        let Some(since) = read.since else {
            return self.list_complete(read.prefix).await;
        };
        let after = i64::try_from(since.get())
            .ok()
            .and_then(|mark| mark.checked_add(1))
            .ok_or_else(|| Error::invalid("since", "not a mark this store made"))?;
        let prefix = read.prefix;
        let changed = || Some(GetOptions::new().with_prefix().with_min_mod_revision(after));
        let leases_dir = format!("{}{prefix}", self.keys.leases_dir());
        let txn = Txn::new().and_then([
            TxnOp::get(format!("{}{prefix}", self.keys.terms_dir()), changed()),
            TxnOp::get(leases_dir.clone(), changed()),
            TxnOp::get(format!("{}{prefix}", self.keys.values_dir()), changed()),
            TxnOp::get(
                self.keys.sessions_dir(),
                Some(GetOptions::new().with_prefix()),
            ),
            TxnOp::get(
                leases_dir,
                Some(GetOptions::new().with_prefix().with_count_only()),
            ),
        ]);
        let response = self.conn.txn("listing changed leases", txn).await?;
        let (revision, gets) = answer(response)?;
        if revision < since {
            // The revision went back: another cluster answers at these endpoints (one
            // restored, or made anew), and its changes are not numbered from the mark.
            return self.list_complete(prefix).await;
        }
        let [terms, leases, values, sessions, count] = gets_of(gets)?;
        let mut roles = BTreeMap::new();
        self.gather(&mut roles, terms.kvs(), Part::Term);
        self.gather(&mut roles, leases.kvs(), Part::Lease);
        self.gather(&mut roles, values.kvs(), Part::Value);
        self.read_unchanged_keys(&mut roles, revision).await?;
        let now = self.wall();
        let expiries = session_expiries(&sessions);
        let asked = read
            .sessions
            .iter()
            .filter_map(|&id| {
                let expiry = expiries.get(&session::lease_of(id)?)?;
                Some((id, session_left(*expiry, now)))
            })
            .collect();
        Ok(PrefixChanges {
            leases: listed(roles, &expiries, now),
            complete: false,
            sessions: asked,
            mark: Some(revision),
            held: Some(usize::try_from(count.count()).unwrap_or(usize::MAX)),
        })
    }

    /// Reads, at `revision`, the lease key and value of each role whose term record
    /// changed while its lease key did not (a lease of its own renewed, or a term that
    /// ended): the key is there or not, and the value belongs to whichever term it shows.
    async fn read_unchanged_keys(
        &self,
        roles: &mut BTreeMap<String, RoleKeys>,
        revision: ChangeMark,
    ) -> Result<()> {
        let unread: Vec<String> = roles
            .iter()
            .filter(|(_, keys)| {
                keys.lease.is_none()
                    && keys
                        .term
                        .as_ref()
                        .and_then(parse_term)
                        .is_some_and(|(record, _)| !record.released)
            })
            .map(|(role, _)| role.clone())
            .collect();
        let at = i64::try_from(revision.get()).unwrap_or(i64::MAX);
        for chunk in unread.chunks(ROLES_PER_TXN) {
            let get = |key: String| TxnOp::get(key, Some(GetOptions::new().with_revision(at)));
            let ops: Vec<TxnOp> = chunk
                .iter()
                .flat_map(|role| [get(self.keys.lease(role)), get(self.keys.value(role))])
                .collect();
            let response = self
                .conn
                .txn("reading changed leases", Txn::new().and_then(ops))
                .await?;
            let found = first_kvs(&response);
            if found.len() != 2 * chunk.len() {
                return Err(Error::store_msg(
                    BACKEND,
                    "a read answered another number of keys",
                ));
            }
            for (role, pair) in chunk.iter().zip(found.chunks(2)) {
                if let Some(keys) = roles.get_mut(role) {
                    keys.lease = pair[0].clone();
                    keys.value = pair[1].clone();
                }
            }
        }
        Ok(())
    }

    /// Files each of `kvs` (one directory's keys) under its role.
    fn gather(&self, roles: &mut BTreeMap<String, RoleKeys>, kvs: &[KeyValue], part: Part) {
        let dir = match part {
            Part::Lease => self.keys.leases_dir(),
            Part::Term => self.keys.terms_dir(),
            Part::Value => self.keys.values_dir(),
        };
        for kv in kvs {
            if let Some(role) = name_under(kv.key(), &dir) {
                let keys = roles.entry(role.to_owned()).or_default();
                let slot = match part {
                    Part::Lease => &mut keys.lease,
                    Part::Term => &mut keys.term,
                    Part::Value => &mut keys.value,
                };
                *slot = Some(kv.clone());
            }
        }
    }
}

/// The leases `roles` show at `now`, each with the session it is held under; a term
/// under a session lasts what the session does (`expiries`, by etcd lease).
fn listed(
    roles: BTreeMap<String, RoleKeys>,
    expiries: &HashMap<i64, SystemTime>,
    now: SystemTime,
) -> Vec<ListedLease> {
    roles
        .into_iter()
        .filter_map(|(role, keys)| {
            let (seen, record) = seen_in(keys.lease.as_ref(), keys.term.as_ref(), None);
            let mut session = None;
            let seen = match seen {
                Seen::Held(mut holder) => {
                    if let Some(lease) = holder.session {
                        holder.expires_at = expiries.get(&lease).copied();
                        session = Some(session::session_id(lease));
                    }
                    Seen::Held(holder)
                }
                absent => absent,
            };
            let value = keys.value.as_ref().and_then(parse_value);
            let info = lease_info(&role, &seen, record.as_ref(), value.as_ref(), now)?;
            Some(ListedLease { info, session })
        })
        .collect()
}

/// What a live session whose record says it expires at `expiry` has left at `now`: as
/// its terms show it.
fn session_left(expiry: SystemTime, now: SystemTime) -> Duration {
    seen::reported_expiry(Some(expiry), now)
        .duration_since(now)
        .unwrap_or_default()
}

/// Every session's expiry, by etcd lease, from a range of the sessions' keys.
fn session_expiries(sessions: &etcd_client::GetResponse) -> HashMap<i64, SystemTime> {
    sessions
        .kvs()
        .iter()
        .filter_map(session::expiry_of)
        .collect()
}

/// A read-only transaction's revision, as a mark, and its ranges' answers.
fn answer(response: TxnResponse) -> Result<(ChangeMark, Vec<etcd_client::GetResponse>)> {
    let revision = response
        .header()
        .map(|header| header.revision())
        .and_then(|revision| u64::try_from(revision).ok())
        .ok_or_else(|| Error::store_msg(BACKEND, "a read's answer names no revision"))?;
    Ok((ChangeMark::new(revision), ranges(&response)))
}
