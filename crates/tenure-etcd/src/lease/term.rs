//! The steps of `try_acquire_or_renew`: acquire a free or lapsed role, renew the
//! caller's own term, or move a term to another TTL, each in one transaction.

use std::time::Duration;

use super::*;

impl EtcdLeaseStore {
    /// Starts a new term advertising `value`: one transaction `key absent => put` (the
    /// lease key, the term record and the value), with the etcd lease kept alive
    /// concurrently (so the term's TTL counts from this round trip).
    pub(super) async fn acquire(
        &self,
        role: &str,
        owner: &str,
        ttl: Duration,
        secs: i64,
        value: Option<&str>,
    ) -> Result<Step> {
        let (lease, lease_secs, started) = self.lease_for(secs).await?;
        let lease_ttl = lease_duration(ttl, secs, lease_secs);
        let sent = self.sent();
        let record = TermRecord {
            owner: owner.to_owned(),
            token: None,
            expires_at_ns: to_ns(round_trip(sent.wall + lease_ttl)),
            ttl_secs: secs,
            lease_secs,
            released: false,
        };
        let txn = acquire_txn_with(
            &self.keys,
            role,
            owner,
            lease,
            encode(&record)?,
            encode_value(value)?,
            None,
        );
        let (txn_result, alive) = tokio::join!(
            self.conn.txn("acquiring a lease", txn),
            self.conn.keep_alive_once(lease),
        );
        let response = match txn_result {
            Ok(response) => response,
            Err(error) => {
                self.conn.revoke_quietly(lease).await;
                if lease_missing(&error) {
                    return Ok(Step::Reread);
                }
                return Err(error);
            }
        };
        if !response.succeeded() {
            if matches!(alive, Ok(true)) {
                self.put_back_spare(SpareLease {
                    id: lease,
                    ttl_secs: secs,
                    lease_secs,
                    started: sent,
                    usable_until: sent.mono + lease_ttl / 2,
                })
                .await;
            } else {
                self.conn.revoke_quietly(lease).await;
            }
            let (lease_kv, term_kv) = two_gets(&response);
            return Ok(Step::Saw(seen_in(lease_kv.as_ref(), term_kv.as_ref()).0));
        }
        let revision = response.header().map_or(0, |h| h.revision());
        if !matches!(alive, Ok(true)) {
            // The put succeeded with the lease attached, so the lease existed; without
            // the keep-alive its TTL counts from the grant, which was earlier still.
            tracing::debug!(
                role,
                "keep-alive beside an acquire failed; the term is shorter"
            );
        }
        self.terms.lock().insert(
            role.to_owned(),
            OwnTerm {
                owner: owner.to_owned(),
                token: revision,
                lease,
                ttl_secs: secs,
                lease_secs,
                in_session: false,
            },
        );
        let (expires_at, now) = if matches!(alive, Ok(true)) {
            sent.answer(lease_ttl)
        } else {
            // The lease's TTL counts from when it was last started, not from this
            // attempt: tell the holder the earlier end, timed on the monotonic clock from
            // then (the wall clock may have stepped since). (The record keeps the later
            // one; contenders are woken by the delete event anyway.)
            started.answer(lease_ttl)
        };
        Ok(held(owner, revision, expires_at, now))
    }

    /// Renews our term `(token, lease)`: a transaction checking the key is still that
    /// term and recording the new expiry, and a keep-alive of its lease, sent together.
    pub(super) async fn renew(
        &self,
        role: &str,
        owner: &str,
        ttl: Duration,
        term: &OwnTerm,
    ) -> Result<Step> {
        let sent = self.sent();
        let (expires_at, _) = sent.answer(lease_duration(ttl, term.ttl_secs, term.lease_secs));
        let record = TermRecord {
            owner: owner.to_owned(),
            token: Some(u64::try_from(term.token).unwrap_or(0)),
            expires_at_ns: to_ns(expires_at),
            ttl_secs: term.ttl_secs,
            lease_secs: term.lease_secs,
            released: false,
        };
        let txn = renew_txn(&self.keys, role, owner, term.token, &record)?;
        let (txn_result, alive) = if self.keep_alive_first {
            // The transaction then sees any key deletion the keep-alive raced with.
            let alive = self.conn.keep_alive_once(term.lease).await;
            if !matches!(alive, Ok(true)) {
                self.terms.lock().remove(role);
                return alive.map(|_| term.lapsing());
            }
            (self.conn.txn("renewing a lease", txn).await, alive)
        } else {
            tokio::join!(
                self.conn.txn("renewing a lease", txn),
                self.conn.keep_alive_once(term.lease),
            )
        };
        let response = match txn_result {
            Ok(response) => response,
            Err(error) => {
                self.terms.lock().remove(role);
                return Err(error);
            }
        };
        if !response.succeeded() {
            self.terms.lock().remove(role);
            let (lease_kv, term_kv) = two_gets(&response);
            return Ok(Step::Saw(seen_in(lease_kv.as_ref(), term_kv.as_ref()).0));
        }
        match alive {
            Ok(true) => {}
            // etcd has expired the lease and is about to delete the key: the term is
            // over, and a lapsed term is never resumed.
            Ok(false) => {
                self.terms.lock().remove(role);
                return Ok(term.lapsing());
            }
            Err(error) => {
                self.terms.lock().remove(role);
                return Err(error);
            }
        }
        self.terms.lock().insert(role.to_owned(), term.clone());
        let (expires_at, now) = sent.answer(lease_duration(ttl, term.ttl_secs, term.lease_secs));
        Ok(held(owner, term.token, expires_at, now))
    }

    /// Moves our live term onto a new etcd lease with another TTL, keeping the key (and
    /// so its create revision, the token). A term held under a session leaves it this
    /// way (the session's lease stays: it holds other roles).
    pub(super) async fn change_ttl(
        &self,
        role: &str,
        owner: &str,
        ttl: Duration,
        secs: i64,
        old: &OwnTerm,
    ) -> Result<Step> {
        let sent = self.sent();
        let (lease, lease_secs) = self.conn.grant(secs).await?;
        let length = lease_duration(ttl, secs, lease_secs);
        let (expires_at, _) = sent.answer(length);
        let record = TermRecord {
            owner: owner.to_owned(),
            token: Some(u64::try_from(old.token).unwrap_or(0)),
            expires_at_ns: to_ns(expires_at),
            ttl_secs: secs,
            lease_secs,
            released: false,
        };
        let lease_key = self.keys.lease(role);
        let term_key = self.keys.term(role);
        let txn = Txn::new()
            .when(own_term_compares(&self.keys, role, owner, old.token))
            .and_then([
                TxnOp::put(
                    lease_key.clone(),
                    owner,
                    Some(PutOptions::new().with_lease(lease)),
                ),
                TxnOp::put(term_key.clone(), encode(&record)?, None),
            ])
            .or_else([TxnOp::get(lease_key, None), TxnOp::get(term_key, None)]);
        let response = self.conn.txn("moving a lease to a new ttl", txn).await;
        let response = match response {
            Ok(response) => response,
            Err(error) => {
                self.conn.revoke_quietly(lease).await;
                return Err(error);
            }
        };
        if !response.succeeded() {
            self.conn.revoke_quietly(lease).await;
            self.terms.lock().remove(role);
            let (lease_kv, term_kv) = two_gets(&response);
            return Ok(Step::Saw(seen_in(lease_kv.as_ref(), term_kv.as_ref()).0));
        }
        if !old.in_session {
            self.conn.revoke_quietly(old.lease).await;
        }
        let term = OwnTerm {
            owner: owner.to_owned(),
            token: old.token,
            lease,
            ttl_secs: secs,
            lease_secs,
            in_session: false,
        };
        self.terms.lock().insert(role.to_owned(), term);
        let (expires_at, now) = sent.answer(length);
        Ok(held(owner, old.token, expires_at, now))
    }
}
