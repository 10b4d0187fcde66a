//! `try_acquire_or_renew` and `try_acquire_or_queue`, and their steps: acquire a free or
//! lapsed role (queueing the caller when it does not), renew the caller's own term, or
//! move a term to another TTL, each in one transaction.

use std::time::Duration;

use super::queue::{candidate_record, Candidacy};
use super::*;

impl EtcdLeaseStore {
    /// [`LeaseStore::try_acquire_or_renew_with_value`], queueing the caller when `queue`
    /// is set and another owner holds the role.
    pub(super) async fn acquire_or_renew(
        &self,
        request: AcquireRequest<'_>,
    ) -> Result<LeaseResult> {
        let (role, owner, ttl) = (request.role, request.owner, request.ttl);
        let (value, queue) = (request.value, request.queue);
        request.validate(self.min_ttl(), self.wall())?;
        let secs = ttl_secs(ttl)?;
        let cached = self
            .terms
            .lock()
            .get(role)
            .filter(|t| t.owner == owner)
            .cloned();
        let mut step = match cached {
            Some(term) if term.ttl_secs == secs => match self.answer_handed(role, ttl, &term) {
                Some(result) => return Ok(result),
                None => self.renew(role, owner, ttl, &term).await?,
            },
            // No read first: the acquire transaction answers with the current term when
            // it fails, and a contender that lost keeps its etcd lease as a spare, so a
            // woken contender takes a released role in one round trip.
            _ => self.acquire(role, owner, ttl, secs, value, queue).await?,
        };
        // Whether this call's acquire transaction queued the caller already.
        let mut queued = false;
        for _ in 0..MAX_ATTEMPTS {
            let seen = match step {
                Step::Done(result) => return Ok(result),
                Step::Saw(seen) => seen,
                Step::Queued(seen) => {
                    queued = true;
                    seen
                }
                Step::Reread => self.read_role(role).await?.0,
                Step::Lapsing(token) => {
                    let gone =
                        tokio::time::timeout(EXPIRY_GRACE * 3, self.watch_term(role, token)).await;
                    if !matches!(gone, Ok(Ok(()))) {
                        tracing::debug!(role, "a lapsed term's key outlived etcd's expiry check");
                    }
                    self.read_role(role).await?.0
                }
            };
            step = match seen {
                Seen::Absent => self.acquire(role, owner, ttl, secs, value, queue).await?,
                Seen::Handing => {
                    // A releaser reserved the role for a candidate and has not begun its
                    // term (yet): begin it, as anyone may, and look again.
                    self.finish_handover(role, None).await?;
                    Step::Reread
                }
                Seen::Held(holder) if holder.owner == owner => {
                    // Our term; a handover that began it on our candidacy's lease ended
                    // the candidacy (the lease is the term's now).
                    self.forget_candidacy(role, owner);
                    let (ttl_secs, lease_secs) = holder.ttl_secs.unwrap_or((secs, secs));
                    let term = OwnTerm {
                        owner: owner.to_owned(),
                        token: holder.token,
                        lease: holder.lease,
                        ttl_secs,
                        lease_secs,
                        in_session: holder.session.is_some(),
                        handed: None,
                    };
                    // A session's term becomes a plain lease of its own: renewing the
                    // session's etcd lease would renew the whole session instead.
                    if term.ttl_secs == secs && !term.in_session {
                        self.renew(role, owner, ttl, &term).await?
                    } else {
                        self.change_ttl(role, owner, ttl, secs, &term).await?
                    }
                }
                // The term was read by a renewal or a read: queue in a transaction that
                // decides again.
                Seen::Held(_) if queue && !queued => {
                    self.acquire(role, owner, ttl, secs, value, true).await?
                }
                Seen::Held(holder) => return self.refusal(holder).await,
            };
        }
        Err(Error::store_msg(
            BACKEND,
            "the lease kept changing during the call; try again",
        ))
    }

    /// The first answer for a term a handover began on our candidacy's etcd lease,
    /// without a request: the lease lasts its TTL from the candidacy's last keep-alive
    /// (etcd counts it from when the keep-alive arrived), and only we end the term
    /// before that (a release, or a `withdraw` that revokes the lease). So the successor
    /// starts its work one round trip sooner and the handover costs two requests less.
    /// `None` (renew instead) after the first answer, when less than half the lease is
    /// left, or against an etcd whose keep-alive may answer for a lease it is revoking
    /// (then only a transaction sent after the keep-alive proves the term outlived it).
    fn answer_handed(&self, role: &str, ttl: Duration, term: &OwnTerm) -> Option<LeaseResult> {
        let kept = term.handed?;
        if let Some(cached) = self.terms.lock().get_mut(role) {
            if cached.token == term.token {
                cached.handed = None;
            }
        }
        if self.keep_alive_first {
            return None;
        }
        let length = lease_duration(ttl, term.ttl_secs, term.lease_secs);
        if tokio::time::Instant::now() >= kept.mono + length / 2 {
            return None;
        }
        let (expires_at, now) = kept.answer(length);
        Some(held_result(&term.owner, term.token, expires_at, now))
    }

    /// Starts a new term advertising `value`: one transaction `key absent and no
    /// handover under way => put` (the lease key, the term record and the value), with
    /// the etcd lease kept alive concurrently (so the term's TTL counts from this round
    /// trip). With `queue`, the same transaction queues the caller when it does not
    /// acquire (see `queue.rs`), on the etcd lease of its candidacy when this instance
    /// has one (so the candidacy keeps its lease, and a term it acquires starts on it).
    pub(super) async fn acquire(
        &self,
        role: &str,
        owner: &str,
        ttl: Duration,
        secs: i64,
        value: Option<&str>,
        queue: bool,
    ) -> Result<Step> {
        let candidacy = queue.then(|| self.candidacy(role, owner, secs)).flatten();
        let (lease, lease_secs, started) = match candidacy {
            Some(c) => (c.lease, c.lease_secs, c.kept),
            None => self.lease_for(secs).await?,
        };
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
        let extra = if queue {
            Extra::Queue(candidate_record(value, &sent, lease_ttl, secs, lease_secs)?)
        } else {
            Extra::None
        };
        let txn = acquire_txn_with(
            &self.keys,
            role,
            owner,
            lease,
            encode(&record)?,
            encode_value(value)?,
            extra,
        );
        let (txn_result, alive) = tokio::join!(
            self.conn.txn("acquiring a lease", txn),
            self.conn.keep_alive_once(lease),
        );
        let response = match txn_result {
            Ok(response) => response,
            Err(error) => {
                if candidacy.is_some() {
                    // Never revoked on an error: it holds our place, and maybe a term a
                    // handover began on it.
                    self.forget_candidacy(role, owner);
                } else {
                    self.conn.revoke_quietly(lease).await;
                }
                if lease_missing(&error) {
                    return Ok(Step::Reread);
                }
                return Err(error);
            }
        };
        if !response.succeeded() {
            let mut gets = first_kvs(&response).into_iter();
            let (lease_kv, term_kv) = (gets.next().flatten(), gets.next().flatten());
            let handoff_kv = gets.next().flatten();
            let seen = seen_in(lease_kv.as_ref(), term_kv.as_ref(), handoff_kv.as_ref()).0;
            if queue && queued_by(&response) {
                let kept = if matches!(alive, Ok(true)) {
                    sent
                } else {
                    started
                };
                let moved_off = self.remember_candidacy(
                    role,
                    owner,
                    Candidacy {
                        lease,
                        ttl_secs: secs,
                        lease_secs,
                        kept,
                        usable_until: kept.mono + lease_ttl / 2,
                    },
                );
                // The candidate key moved to `lease` (keeping its place); the lease it
                // was on holds nothing now (we do not hold the role, so no term is on it).
                if let Some(old) = moved_off {
                    self.conn.revoke_quietly(old).await;
                }
                return Ok(Step::Queued(seen));
            }
            if candidacy.is_none() {
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
            }
            // With a candidacy and not queued, we hold the role: on this lease when a
            // handover began our term on it (the caller takes the term up from `seen`).
            return Ok(Step::Saw(seen));
        }
        // Our candidacy ended with this acquire (the transaction deleted its key); its
        // own lease holds nothing unless it is the term's.
        if let Some(old) = self.forget_candidacy(role, owner) {
            if old.lease != lease {
                self.conn.revoke_quietly(old.lease).await;
            }
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
                handed: None,
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
            return Ok(Step::Saw(
                seen_in(lease_kv.as_ref(), term_kv.as_ref(), None).0,
            ));
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
            return Ok(Step::Saw(
                seen_in(lease_kv.as_ref(), term_kv.as_ref(), None).0,
            ));
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
            handed: None,
        };
        self.terms.lock().insert(role.to_owned(), term);
        let (expires_at, now) = sent.answer(length);
        Ok(held(owner, old.token, expires_at, now))
    }
}
