//! The queue of candidates and the handover that ends a term for the oldest of them
//! (see [`LeaseStore::try_acquire_or_queue`], [`LeaseStore::hand_over`]).
//!
//! A candidate is the key `queue/N/R/O` on an etcd lease of the candidate's TTL (see
//! `schema.rs`): a candidate that stops refreshing drops out by itself, a refresh puts
//! the key again on the same lease (its create revision, so its place, is kept) beside a
//! keep-alive, and the queue is ordered by create revision. Queueing is the failure
//! branch of the acquire transaction, so deciding the lease and the queue is one step.
//!
//! A handover cannot be one transaction here: the new term's token is its lease key's
//! create revision, so the key must be deleted and created again, and etcd refuses a
//! transaction that writes one key twice. It is two, with the role reserved between
//! them:
//!
//! 1. the release (or `hand_over`) transaction ends the term as before and, when a
//!    candidate is queued, puts the handover key `leases/R` NUL `handoff` and reads the
//!    candidate (the oldest, or the one named): no acquire succeeds while that key
//!    exists;
//! 2. the begin transaction, if the lease key is still absent and the handover key and
//!    the candidate key are as read, puts the lease key for the candidate on the
//!    candidate's own etcd lease (so its renewals extend the term, and a dead
//!    candidate's term ends when its candidacy would have), with the term record and
//!    value from its candidate record, and deletes the handover key and the candidate
//!    key. When the candidate changed or left meanwhile it reads the queue again and
//!    begins the next one's; with none left it deletes the handover key (the role is
//!    free).
//!
//! The releaser sends step 2 at once. Should it die between the steps, whoever next
//! tries to acquire the role (the candidates refresh every retry interval) finds the
//! handover key and sends step 2 itself, so a reservation never outlives the next
//! attempt.

use std::time::Duration;

use etcd_client::{DeleteOptions, TxnResponse};
use tenure::lease::{validate_release, EndRequest, Handover};

use super::*;
use crate::schema::{CandidateRecord, HandoffRecord};

/// Candidacies remembered beyond this many are pruned of those no longer usable.
const MAX_CANDIDACIES: usize = 1024;

/// A candidacy this instance queued, so its refresh reuses its etcd lease (a new lease
/// would move the key, keeping its place, but cost a grant each time).
#[derive(Clone, Copy, Debug)]
pub(super) struct Candidacy {
    pub(super) lease: i64,
    pub(super) ttl_secs: i64,
    pub(super) lease_secs: i64,
    /// Just before the request that last (re)started its etcd lease was sent.
    pub(super) kept: Sent,
    /// Until then (half its TTL after `kept`) an acquire may start a term on its lease,
    /// as on a spare one; later the lease might expire as the put lands.
    pub(super) usable_until: tokio::time::Instant,
}

/// A handover under way, as read: step 2 of the module docs is sent with it.
#[derive(Clone, Debug)]
pub(super) struct Pending {
    /// The handover key's mod revision.
    reserved_at: i64,
    /// The candidate a planned handoff named.
    to: Option<String>,
    /// The candidate to begin the term of (the named one, else the oldest), as read;
    /// `None` when the queue is empty.
    candidate: Option<KeyValue>,
}

/// The transaction of `hand_over`: when `(owner, token)` is the live term and the named
/// candidate (the oldest for `None`) is queued, end the term as [`release_txn`] does,
/// reserve the role for that candidate and read its key.
pub(super) fn handover_txn(
    keys: &Keys,
    role: &str,
    owner: &str,
    token: i64,
    record: &TermRecord,
    successor: Option<&str>,
) -> Result<Txn> {
    let mut compares = own_term_compares(keys, role, owner, token);
    let target = match successor {
        Some(name) => {
            let key = keys.candidate(role, name);
            compares.push(Compare::create_revision(key.clone(), CompareOp::Greater, 0));
            TxnOp::get(key, None)
        }
        None => {
            compares.push(queue_compare(keys, role));
            head_get(keys, role)
        }
    };
    let reserve = [handoff_put(keys, role, owner, token, successor)?, target];
    Ok(Txn::new().when(compares).and_then(
        ending_ops(keys, role, record)?
            .chain(reserve)
            .chain([changed_put(keys)])
            .collect::<Vec<_>>(),
    ))
}

/// The reads that follow a handover that did not finish: the lease key, the handover
/// key, the oldest candidate and the named one.
fn handover_reads(keys: &Keys, role: &str, to: Option<&str>) -> Vec<TxnOp> {
    let mut reads = vec![
        TxnOp::get(keys.lease(role), None),
        TxnOp::get(keys.handoff(role), None),
        head_get(keys, role),
    ];
    if let Some(name) = to {
        reads.push(TxnOp::get(keys.candidate(role, name), None));
    }
    reads
}

/// Step 2 of the module docs for `candidate`, or, with none, the delete of the handover
/// key that frees the role.
fn begin_txn(keys: &Keys, role: &str, pending: &Pending) -> Result<Txn> {
    let lease_key = keys.lease(role);
    let handoff_key = keys.handoff(role);
    let mut compares = vec![
        Compare::create_revision(lease_key.clone(), CompareOp::Equal, 0),
        Compare::mod_revision(handoff_key.clone(), CompareOp::Equal, pending.reserved_at),
    ];
    let mut then = vec![TxnOp::delete(handoff_key, None)];
    if let Some(kv) = &pending.candidate {
        let owner = candidate_owner(keys, role, kv)?;
        // A record that does not decode was not written by tenure; the term still
        // begins (the candidate's lease bounds it), advertising nothing.
        let candidate = decode::<CandidateRecord>(kv.value()).unwrap_or_default();
        let record = TermRecord {
            owner: owner.to_owned(),
            token: None,
            expires_at_ns: candidate.expires_at_ns,
            ttl_secs: candidate.ttl_secs,
            lease_secs: candidate.lease_secs,
            released: false,
        };
        compares.push(Compare::mod_revision(
            kv.key().to_vec(),
            CompareOp::Equal,
            kv.mod_revision(),
        ));
        then.extend([
            TxnOp::put(
                lease_key,
                owner,
                Some(PutOptions::new().with_lease(kv.lease())),
            ),
            TxnOp::put(keys.term(role), encode(&record)?, None),
            match encode_value(candidate.value.as_deref())? {
                Some(value) => TxnOp::put(keys.value(role), value, None),
                None => TxnOp::delete(keys.value(role), None),
            },
            TxnOp::delete(kv.key().to_vec(), None),
        ]);
    }
    // A handover with nobody next frees the role: no term begins, but a reader that saw
    // it reserved sees it free.
    then.push(changed_put(keys));
    Ok(Txn::new()
        .when(compares)
        .and_then(then)
        .or_else(handover_reads(keys, role, pending.to.as_deref())))
}

/// The owner a candidate key names.
fn candidate_owner<'a>(keys: &Keys, role: &str, kv: &'a KeyValue) -> Result<&'a str> {
    name_under(kv.key(), &keys.queue_dir(role)).ok_or_else(|| {
        Error::store_msg(
            BACKEND,
            format!("a key outside {} read as a candidate", keys.queue_dir(role)),
        )
    })
}

/// The handover still under way after [`handover_reads`] (`to` is what they assumed):
/// `None` when it is over (a term began, or nobody reserves the role); `Err(())` when
/// another handover, for another choice, took its place (read again).
fn pending_in(
    gets: &[Option<KeyValue>],
    to: Option<&str>,
) -> std::result::Result<Option<Pending>, ()> {
    let (Some(None), Some(Some(handoff))) = (gets.first(), gets.get(1)) else {
        return Ok(None);
    };
    let chosen = decode::<HandoffRecord>(handoff.value()).and_then(|record| record.to);
    if chosen.as_deref() != to {
        return Err(());
    }
    let head = gets.get(2).cloned().flatten();
    let named = gets.get(3).cloned().flatten();
    Ok(Some(Pending {
        reserved_at: handoff.mod_revision(),
        to: chosen,
        candidate: named.or(head),
    }))
}

/// What a transaction that ended a term says: its etcd lease, whether that lease is a
/// session's, and the handover it began, if any.
pub(super) struct Ended {
    pub(super) lease: i64,
    pub(super) session: Option<i64>,
    pub(super) pending: Option<Pending>,
}

impl Ended {
    /// Reads [`release_txn`]'s or [`handover_txn`]'s successful answer (the ending
    /// operations first, see [`ending_ops`]; then the reservation, nested for a
    /// release, and the candidate's read).
    pub(super) fn from(response: &TxnResponse, to: Option<&str>) -> Ended {
        let ops = response.op_responses();
        let lease = match ops.first() {
            Some(TxnOpResponse::Delete(delete)) => {
                delete.prev_kvs().first().map_or(0, |kv| kv.lease())
            }
            _ => 0,
        };
        let session = match ops.get(1) {
            Some(TxnOpResponse::Put(put)) => put
                .prev_key()
                .and_then(|kv| decode::<SessionMark>(kv.value()))
                .and_then(|mark| mark.session),
            _ => None,
        };
        let reserve = match ops.get(3) {
            Some(TxnOpResponse::Txn(nested)) if nested.succeeded() => nested.op_responses(),
            Some(TxnOpResponse::Put(_)) => ops[3..].to_vec(),
            _ => Vec::new(),
        };
        let pending = (!reserve.is_empty()).then(|| Pending {
            // The handover key was put by this transaction.
            reserved_at: response.header().map_or(0, |h| h.revision()),
            to: to.map(str::to_owned),
            candidate: reserve
                .iter()
                .find_map(|op| match op {
                    TxnOpResponse::Get(get) => Some(get.kvs().first().cloned()),
                    _ => None,
                })
                .flatten(),
        });
        Ended {
            lease,
            session,
            pending,
        }
    }
}

impl EtcdLeaseStore {
    /// The candidacy of `owner` for `role` this instance queued, when its etcd lease has
    /// the TTL `secs` and is still usable for an acquire.
    pub(super) fn candidacy(&self, role: &str, owner: &str, secs: i64) -> Option<Candidacy> {
        let now = tokio::time::Instant::now();
        self.candidacies
            .lock()
            .get(&(role.to_owned(), owner.to_owned()))
            .filter(|c| c.ttl_secs == secs && c.usable_until > now)
            .copied()
    }

    /// Notes that `owner` is queued for `role` on `candidacy`'s lease; returns the lease
    /// of the candidacy it replaces, if another (its key moved off it).
    pub(super) fn remember_candidacy(
        &self,
        role: &str,
        owner: &str,
        candidacy: Candidacy,
    ) -> Option<i64> {
        let mut candidacies = self.candidacies.lock();
        if candidacies.len() >= MAX_CANDIDACIES {
            let now = tokio::time::Instant::now();
            candidacies.retain(|_, c| c.usable_until > now);
        }
        candidacies
            .insert((role.to_owned(), owner.to_owned()), candidacy)
            .map(|old| old.lease)
            .filter(|&old| old != candidacy.lease)
    }

    /// Forgets `owner`'s candidacy for `role` (it acquired, or left); returns it.
    pub(super) fn forget_candidacy(&self, role: &str, owner: &str) -> Option<Candidacy> {
        self.candidacies
            .lock()
            .remove(&(role.to_owned(), owner.to_owned()))
    }

    /// A handover began term `token` of `owner` on etcd lease `lease`: when that is the
    /// lease of `owner`'s candidacy here, the term is ours to renew, so this instance
    /// remembers it, and the successor's first call answers from the candidacy's last
    /// keep-alive (or renews in one round trip with no read).
    pub(super) fn adopt_handed(&self, role: &str, owner: &str, token: i64, lease: i64) {
        let key = (role.to_owned(), owner.to_owned());
        let candidacy = {
            let mut candidacies = self.candidacies.lock();
            match candidacies.get(&key) {
                Some(c) if c.lease == lease => candidacies.remove(&key),
                _ => None,
            }
        };
        if let Some(c) = candidacy {
            self.terms.lock().insert(
                role.to_owned(),
                OwnTerm {
                    owner: owner.to_owned(),
                    token,
                    lease,
                    ttl_secs: c.ttl_secs,
                    lease_secs: c.lease_secs,
                    in_session: false,
                    handed: Some(c.kept),
                },
            );
        }
    }

    /// [`LeaseStore::withdraw`]: deletes the candidate key, then revokes the etcd lease it
    /// was on (it held only that key: a handover that began a term on it deleted the key
    /// in the same step, so this delete would have found nothing).
    pub(super) async fn withdraw_candidacy(&self, role: &str, owner: &str) -> Result<bool> {
        validate_release(role, owner)?;
        let response = self
            .conn
            .delete(
                "leaving a queue",
                &self.keys.candidate(role, owner),
                Some(DeleteOptions::new().with_prev_key()),
            )
            .await?;
        self.forget_candidacy(role, owner);
        let Some(lease) = response.prev_kvs().first().map(|kv| kv.lease()) else {
            return Ok(false);
        };
        self.conn.revoke_quietly(lease).await;
        Ok(true)
    }

    /// [`LeaseStore::release`] and [`LeaseStore::hand_over`]: ends the live term
    /// `(role, owner, token)` and, when it began a handover, finishes it (step 2 of the
    /// module docs) before the term's etcd lease is revoked.
    pub(super) async fn close_term(&self, end: EndRequest<'_>) -> Result<bool> {
        end.validate()?;
        let (role, owner, token, how) = (end.role, end.owner, end.token, end.how);
        let successor = how.successor();
        let Ok(revision) = i64::try_from(token.get()) else {
            return Ok(false);
        };
        let now = round_trip(self.wall());
        let (ttl_secs, lease_secs) = self
            .terms
            .lock()
            .get(role)
            .filter(|t| t.token == revision)
            .map_or((0, 0), |t| (t.ttl_secs, t.lease_secs));
        let record = TermRecord {
            owner: owner.to_owned(),
            token: Some(token.get()),
            expires_at_ns: to_ns(now),
            ttl_secs,
            lease_secs,
            released: true,
        };
        let txn = match how {
            // A token here is the lease key's create revision, and one transaction
            // cannot delete and create a key: released, and the member acquires as
            // after any release.
            Handover::Release | Handover::ToSessionOf(_) => {
                release_txn(&self.keys, role, owner, revision, &record)?
            }
            Handover::To(_) => handover_txn(&self.keys, role, owner, revision, &record, successor)?,
        };
        let response = self.conn.txn("releasing a lease", txn).await?;
        {
            let mut terms = self.terms.lock();
            if terms.get(role).is_some_and(|t| t.token == revision) {
                terms.remove(role);
            }
        }
        if !response.succeeded() {
            return Ok(false);
        }
        let ended = Ended::from(&response, successor);
        if let Some(pending) = ended.pending {
            // The term has ended either way; whoever next tries to acquire finishes a
            // handover this could not.
            if let Err(error) = self.finish_handover(role, Some(pending)).await {
                tracing::debug!(role, %error, "beginning the candidate's term failed; the next contender finishes it");
            }
        }
        // The term already ended with the delete; revoking only frees etcd's lease early.
        // A session's lease holds its other roles: it stays.
        if ended.session != Some(ended.lease) {
            self.conn.revoke_quietly(ended.lease).await;
        }
        Ok(true)
    }

    /// Finishes the handover of `role` under way (step 2 of the module docs): `pending`
    /// as the transaction that began it read it, or read afresh. Returns once a term
    /// began or the role is free, whoever finished it.
    pub(super) async fn finish_handover(&self, role: &str, pending: Option<Pending>) -> Result<()> {
        let mut pending = pending;
        for _ in 0..MAX_ATTEMPTS {
            let current = match pending.take() {
                Some(current) => current,
                None => match self.read_handover(role).await? {
                    Some(current) => current,
                    None => return Ok(()),
                },
            };
            let txn = begin_txn(&self.keys, role, &current)?;
            let response = match self.conn.txn("handing a lease over", txn).await {
                Ok(response) => response,
                // The candidate's lease ended as it was chosen (its key goes with it).
                Err(error) if lease_missing(&error) => continue,
                Err(error) => return Err(error),
            };
            if response.succeeded() {
                if let Some(kv) = &current.candidate {
                    let owner = candidate_owner(&self.keys, role, kv)?;
                    let token = response.header().map_or(0, |h| h.revision());
                    self.adopt_handed(role, owner, token, kv.lease());
                }
                return Ok(());
            }
            match pending_in(&first_kvs(&response), current.to.as_deref()) {
                Ok(None) => return Ok(()),
                Ok(next) => pending = next,
                Err(()) => {}
            }
        }
        Err(Error::store_msg(
            BACKEND,
            "the queue kept changing while a handover began the next term; the next contender finishes it",
        ))
    }

    /// The handover of `role` under way, if any, with its candidate.
    async fn read_handover(&self, role: &str) -> Result<Option<Pending>> {
        let response = self
            .conn
            .txn(
                "reading a handover",
                Txn::new().and_then(handover_reads(&self.keys, role, None)),
            )
            .await?;
        let gets = first_kvs(&response);
        let Some(Some(handoff)) = gets.get(1).filter(|_| matches!(gets.first(), Some(None))) else {
            return Ok(None);
        };
        let Some(name) = decode::<HandoffRecord>(handoff.value()).and_then(|record| record.to)
        else {
            return Ok(pending_in(&gets, None).unwrap_or(None));
        };
        // A planned handoff: its candidate, or the oldest once it left.
        let named = self
            .conn
            .get(
                "reading a candidate",
                &self.keys.candidate(role, &name),
                None,
            )
            .await?;
        let mut gets = gets;
        gets.truncate(3);
        gets.push(named.kvs().first().cloned());
        Ok(pending_in(&gets, Some(&name)).unwrap_or(None))
    }
}

/// The record of a candidacy refreshed with `sent` on an etcd lease of `length`.
pub(super) fn candidate_record(
    value: Option<&str>,
    sent: &Sent,
    length: Duration,
    ttl_secs: i64,
    lease_secs: i64,
) -> Result<Vec<u8>> {
    encode(&CandidateRecord {
        value: value.map(str::to_owned),
        expires_at_ns: to_ns(round_trip(sent.wall + length)),
        ttl_secs,
        lease_secs,
    })
}
