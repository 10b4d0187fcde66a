//! The requests the store sends and how it reads their answers: the transactions that
//! acquire, renew and release a term, and the records, values and views parsed back.

use std::time::{Duration, SystemTime};

use etcd_client::{SortOrder, SortTarget};

use super::*;
use crate::schema::HandoffRecord;

/// The compares that hold exactly while `(owner, token)` is role's live term.
pub(super) fn own_term_compares(keys: &Keys, role: &str, owner: &str, token: i64) -> Vec<Compare> {
    let lease_key = keys.lease(role);
    vec![
        Compare::create_revision(lease_key.clone(), CompareOp::Equal, token),
        Compare::value(lease_key, CompareOp::Equal, owner),
    ]
}

/// The acquire transaction: when role's lease key is absent and no handover is under
/// way, put it (value `owner`, on etcd lease `lease`) and `record`, and remove
/// `owner`'s candidacy (an acquire ends it); otherwise read the lease key, term record
/// and handover key. The token of a new term is the answer's header revision.
#[doc(hidden)]
pub fn acquire_txn(
    keys: &Keys,
    role: &str,
    owner: &str,
    lease: i64,
    record: &TermRecord,
) -> Result<Txn> {
    Ok(acquire_txn_with(
        keys,
        role,
        owner,
        lease,
        encode(record)?,
        None,
        Extra::None,
    ))
}

/// What an acquire transaction does besides acquiring.
pub(super) enum Extra {
    None,
    /// Queue the caller when another owner holds the role or a handover is under way:
    /// put its candidate key (this encoded
    /// [`CandidateRecord`](crate::schema::CandidateRecord)) on the same etcd lease, in a
    /// transaction nested in the failure branch that skips the put when the caller
    /// holds the role itself.
    Queue(Vec<u8>),
    /// Require a session to live (`guard`) and read its key (`read`) in either branch.
    /// `batched`: the transaction is nested in a batch that puts the change key once for
    /// all (etcd refuses a transaction that puts one key twice), so it does not.
    Session {
        guard: Compare,
        read: TxnOp,
        batched: bool,
    },
}

/// The put that says a term began or ended (see the `changed` key in `schema.rs`): in
/// the same transaction as the change, so its mod revision is the change's.
pub(super) fn changed_put(keys: &Keys) -> TxnOp {
    TxnOp::put(keys.changed(), "", None)
}

/// [`acquire_txn`] with the encoded term record, the encoded value the term advertises
/// (`None`: it advertises none, and a previous term's value is deleted) and `extra`.
/// The failure branch reads, in order, the lease key, the term record, the handover key
/// (then the queue's nested transaction, then the session key, as `extra` says).
pub(super) fn acquire_txn_with(
    keys: &Keys,
    role: &str,
    owner: &str,
    lease: i64,
    record: Vec<u8>,
    value: Option<Vec<u8>>,
    extra: Extra,
) -> Txn {
    let lease_key = keys.lease(role);
    let term_key = keys.term(role);
    let mut compares = vec![
        Compare::create_revision(lease_key.clone(), CompareOp::Equal, 0),
        // A handover under way has reserved the role for a candidate.
        Compare::create_revision(keys.handoff(role), CompareOp::Equal, 0),
    ];
    let mut then = vec![
        TxnOp::put(
            lease_key.clone(),
            owner,
            Some(PutOptions::new().with_lease(lease)),
        ),
        TxnOp::put(term_key.clone(), record, None),
        // Not on the etcd lease: a lapsed term keeps its value, as its record.
        match value {
            Some(value) => TxnOp::put(keys.value(role), value, None),
            None => TxnOp::delete(keys.value(role), None),
        },
        TxnOp::delete(keys.candidate(role, owner), None),
    ];
    if !matches!(extra, Extra::Session { batched: true, .. }) {
        then.push(changed_put(keys));
    }
    let mut otherwise = vec![
        TxnOp::get(lease_key.clone(), None),
        TxnOp::get(term_key, None),
        TxnOp::get(keys.handoff(role), None),
    ];
    match extra {
        Extra::None => {}
        Extra::Queue(candidate) => {
            // A value compare fails on an absent key, so a role reserved by a handover
            // (no lease key) queues the caller too.
            otherwise.push(TxnOp::txn(
                Txn::new()
                    .when([Compare::value(lease_key, CompareOp::Equal, owner)])
                    .or_else([TxnOp::put(
                        keys.candidate(role, owner),
                        candidate,
                        Some(PutOptions::new().with_lease(lease)),
                    )]),
            ));
        }
        Extra::Session {
            guard: compare,
            read,
            batched: _,
        } => {
            compares.push(compare);
            then.push(read.clone());
            otherwise.push(read);
        }
    }
    Txn::new().when(compares).and_then(then).or_else(otherwise)
}

/// Whether an acquire transaction's failure branch queued the caller: its nested
/// transaction failed (the caller does not hold the role) and so put the candidate key.
pub(super) fn queued_by(response: &TxnResponse) -> bool {
    !response.succeeded()
        && response
            .op_responses()
            .into_iter()
            .any(|op| matches!(op, TxnOpResponse::Txn(nested) if !nested.succeeded()))
}

/// The renewal transaction of the live term `(owner, token)`: put `record`; otherwise
/// read the lease key and term record. Sent together with a keep-alive of the term's
/// etcd lease.
#[doc(hidden)]
pub fn renew_txn(
    keys: &Keys,
    role: &str,
    owner: &str,
    token: i64,
    record: &TermRecord,
) -> Result<Txn> {
    let term_key = keys.term(role);
    Ok(Txn::new()
        .when(own_term_compares(keys, role, owner, token))
        .and_then([TxnOp::put(term_key.clone(), encode(record)?, None)])
        .or_else([
            TxnOp::get(keys.lease(role), None),
            TxnOp::get(term_key, None),
        ]))
}

/// The release transaction of the live term `(owner, token)`: delete the lease key
/// (returning it, for its etcd lease to revoke next), put the released `record`
/// (returning the previous one, which says whether that lease is a session's) and
/// delete the term's value; and when candidates are queued, in a nested transaction,
/// reserve the role for the oldest (the handover key) and read it, for the transaction
/// that begins its term (see `queue.rs`).
#[doc(hidden)]
pub fn release_txn(
    keys: &Keys,
    role: &str,
    owner: &str,
    token: i64,
    record: &TermRecord,
) -> Result<Txn> {
    let handoff = handoff_put(keys, role, owner, token, None)?;
    let reserve = Txn::new()
        .when([queue_compare(keys, role)])
        .and_then([handoff, head_get(keys, role)]);
    Ok(Txn::new()
        .when(own_term_compares(keys, role, owner, token))
        .and_then(
            ending_ops(keys, role, record)?
                .chain([TxnOp::txn(reserve), changed_put(keys)])
                .collect::<Vec<_>>(),
        ))
}

/// The operations that end a live term, first in every transaction that does: delete
/// the lease key (returning it), put the ended term's `record` (returning the previous
/// one) and delete its value. Each such transaction puts the change key
/// ([`changed_put`]) last, after what it reads by position.
pub(super) fn ending_ops(
    keys: &Keys,
    role: &str,
    record: &TermRecord,
) -> Result<impl Iterator<Item = TxnOp>> {
    Ok([
        TxnOp::delete(keys.lease(role), Some(DeleteOptions::new().with_prev_key())),
        // The previous record says whether the term was held under a session.
        TxnOp::put(
            keys.term(role),
            encode(record)?,
            Some(PutOptions::new().with_prev_key()),
        ),
        TxnOp::delete(keys.value(role), None),
    ]
    .into_iter())
}

/// Holds while `role` has at least one candidate: a create-revision compare over a
/// range holds for every key in it, and against an empty range compares 0.
pub(super) fn queue_compare(keys: &Keys, role: &str) -> Compare {
    Compare::create_revision(keys.queue_dir(role), CompareOp::Greater, 0)
        .with_range(keys.queue_end(role))
}

/// Reads `role`'s oldest candidate (the least create revision).
pub(super) fn head_get(keys: &Keys, role: &str) -> TxnOp {
    TxnOp::get(
        keys.queue_dir(role),
        Some(
            GetOptions::new()
                .with_range(keys.queue_end(role))
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_limit(1),
        ),
    )
}

/// The put of `role`'s handover key: the term `(from, token)` ended for candidate `to`
/// (the oldest for `None`).
pub(super) fn handoff_put(
    keys: &Keys,
    role: &str,
    from: &str,
    token: i64,
    to: Option<&str>,
) -> Result<TxnOp> {
    let record = HandoffRecord {
        from: from.to_owned(),
        token: u64::try_from(token).unwrap_or(0),
        to: to.map(str::to_owned),
    };
    Ok(TxnOp::put(keys.handoff(role), encode(&record)?, None))
}

/// The answer for this owner's live term `token`, which ends no earlier than `expires_at`.
pub(super) fn held(owner: &str, token: i64, expires_at: SystemTime, now: SystemTime) -> Step {
    Step::Done(held_result(owner, token, expires_at, now))
}

pub(super) fn held_result(
    owner: &str,
    token: i64,
    expires_at: SystemTime,
    now: SystemTime,
) -> LeaseResult {
    LeaseResult {
        acquired: true,
        // Create revisions are positive; 0 is never a live term's token.
        fencing_token: FencingToken::from(u64::try_from(token).unwrap_or(0)),
        expires_at,
        holder: owner.to_owned(),
        now,
    }
}

/// Exactly `N` ranges' answers, in order.
pub(crate) fn gets_of<const N: usize>(
    gets: Vec<etcd_client::GetResponse>,
) -> Result<[etcd_client::GetResponse; N]> {
    gets.try_into()
        .map_err(|_| Error::store_msg(BACKEND, "a read answered another number of ranges"))
}

/// The answers of the ranges read in a transaction, in order.
pub(crate) fn ranges(response: &TxnResponse) -> Vec<etcd_client::GetResponse> {
    response
        .op_responses()
        .into_iter()
        .filter_map(|op| match op {
            TxnOpResponse::Get(get) => Some(get),
            _ => None,
        })
        .collect()
}

/// The first key of each range read in a transaction's answer, in order.
pub(super) fn first_kvs(response: &TxnResponse) -> Vec<Option<KeyValue>> {
    ranges(response)
        .iter()
        .map(|get| get.kvs().first().cloned())
        .collect()
}

pub(super) fn two_gets(response: &TxnResponse) -> (Option<KeyValue>, Option<KeyValue>) {
    let mut gets = first_kvs(response).into_iter();
    (gets.next().flatten(), gets.next().flatten())
}

pub(super) fn parse_term(kv: &KeyValue) -> Option<(TermRecord, i64)> {
    decode::<TermRecord>(kv.value()).map(|record| (record, kv.mod_revision()))
}

/// The value of a `values/R` key and its mod revision (the token of the term that
/// wrote it); `None` for bytes that are no value record.
pub(super) fn parse_value(kv: &KeyValue) -> Option<(String, i64)> {
    decode::<ValueRecord>(kv.value()).map(|record| (record.value, kv.mod_revision()))
}

/// The `values/R` record of a term advertising `value`, if it does.
pub(super) fn encode_value(value: Option<&str>) -> Result<Option<Vec<u8>>> {
    value
        .map(|value| {
            encode(&ValueRecord {
                value: value.to_owned(),
            })
        })
        .transpose()
}

/// The value term `token` advertised, from the role's `values/R` as read: only when
/// that term wrote it (see `schema.rs`).
pub(super) fn advertised(value: Option<&(String, i64)>, token: u64) -> Option<String> {
    value
        .filter(|(_, written_at)| u64::try_from(*written_at).ok() == Some(token))
        .map(|(value, _)| value.clone())
}

/// Whether an error says the etcd lease named in a put does not exist (a spare that
/// expired): retry with a fresh lease.
pub(super) fn lease_missing(error: &Error) -> bool {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<etcd_client::Error>())
        .is_some_and(crate::conn::is_lease_not_found)
}

/// The role as a read of its lease key, term record and (when read) handover key saw
/// it, and the parsed record.
pub(super) fn seen_in(
    lease_kv: Option<&KeyValue>,
    term_kv: Option<&KeyValue>,
    handoff_kv: Option<&KeyValue>,
) -> (Seen, Option<(TermRecord, i64)>) {
    let record = term_kv.and_then(parse_term);
    let session = term_kv
        .and_then(|kv| decode::<SessionMark>(kv.value()))
        .and_then(|mark| mark.session);
    let seen = match seen_from(lease_kv, record.as_ref(), session) {
        Seen::Absent if handoff_kv.is_some() => Seen::Handing,
        seen => seen,
    };
    (seen, record)
}

pub(super) fn seen_from(
    lease_kv: Option<&KeyValue>,
    record: Option<&(TermRecord, i64)>,
    session: Option<i64>,
) -> Seen {
    let Some(kv) = lease_kv else {
        return Seen::Absent;
    };
    let owner = String::from_utf8_lossy(kv.value()).into_owned();
    let token = kv.create_revision();
    let this_term = record.filter(|(r, mod_revision)| {
        i64::try_from(r.token_at(*mod_revision)).ok() == Some(token) && r.owner == owner
    });
    Seen::Held(Holder {
        owner,
        token,
        lease: kv.lease(),
        ttl_secs: this_term.map(|(r, _)| (r.ttl_secs, r.lease_secs.max(r.ttl_secs))),
        expires_at: this_term.map(|(r, _)| from_ns(r.expires_at_ns)),
        // Held under the session only while the key is still on the session's lease.
        session: this_term.and(session).filter(|&s| s == kv.lease()),
    })
}

/// What `get` and `list` show of a role: its live term, else the latest term's record;
/// with the value of `values/R` when that term wrote it.
pub(super) fn lease_info(
    role: &str,
    seen: &Seen,
    record: Option<&(TermRecord, i64)>,
    value: Option<&(String, i64)>,
    now: SystemTime,
) -> Option<LeaseInfo> {
    match seen {
        Seen::Held(holder) => Some(LeaseInfo {
            role: role.to_owned(),
            holder: Some(holder.owner.clone()),
            fencing_token: holder.token(),
            expires_at: holder.expires_at(now),
            now,
            value: advertised(value, holder.token().get()),
        }),
        // Between the two steps of a handover the role shows its ended term.
        Seen::Absent | Seen::Handing => record.map(|(r, mod_revision)| {
            let recorded = from_ns(r.expires_at_ns);
            let token = r.token_at(*mod_revision);
            LeaseInfo {
                role: role.to_owned(),
                // A released term has no holder and no value (release deletes it, but
                // an older tenure's release may not have); a lapsed one keeps both.
                holder: (!r.released).then(|| r.owner.clone()),
                fencing_token: FencingToken::from(token),
                // The key is gone, so the term ended by now at the latest.
                expires_at: recorded.min(now),
                now,
                value: advertised(value, token).filter(|_| !r.released),
            }
        }),
    }
}

/// How long an etcd lease granted `lease_secs` for a request of `ttl` (`ttl_secs`) lasts:
/// the request, unless etcd raised it to its minimum (1.5 election timeouts).
pub(super) fn lease_duration(ttl: Duration, ttl_secs: i64, lease_secs: i64) -> Duration {
    if lease_secs > ttl_secs {
        Duration::from_secs(u64::try_from(lease_secs).unwrap_or(0))
    } else {
        ttl
    }
}
