//! Writes fenced by a term: transactions that commit only while a role's term is live.

use super::*;

impl EtcdLeaseStore {
    /// Builds a transaction guarded by `create_revision(<prefix>/leases/<role>) ==
    /// token`: its `and_then` operations commit only while that term is live.
    ///
    /// ```no_run
    /// # async fn demo(store: &tenure_etcd::EtcdLeaseStore, token: tenure::FencingToken) -> tenure::Result<()> {
    /// use etcd_client::TxnOp;
    /// let txn = store
    ///     .fenced_txn("reports", token)?
    ///     .and_then([TxnOp::put("/myapp/report", "done", None)]);
    /// let committed = store.client().clone().txn(txn).await
    ///     .map_err(|e| tenure::Error::store("etcd", "fenced write", e))?
    ///     .succeeded();
    /// # Ok(()) }
    /// ```
    pub fn fenced_txn(&self, role: &str, token: FencingToken) -> Result<Txn> {
        Ok(Txn::new().when([self.fence_compare(role, token)?]))
    }

    /// The compare behind [`fenced_txn`](Self::fenced_txn), to combine with your own.
    pub fn fence_compare(&self, role: &str, token: FencingToken) -> Result<Compare> {
        validate_name("role", role)?;
        // A token beyond i64 was never handed out by etcd; compare against -1, which
        // no key's create revision equals, so the write is refused.
        let revision = i64::try_from(token.get()).unwrap_or(-1);
        Ok(Compare::create_revision(
            self.keys.lease(role),
            CompareOp::Equal,
            revision,
        ))
    }

    /// Runs `ops` in one transaction that commits only while the term `(role, token)`
    /// is live; otherwise nothing is written and the result is `Error::Fenced`, with
    /// `highest` the role's latest token.
    pub async fn commit_fenced(
        &self,
        role: &str,
        token: FencingToken,
        ops: Vec<TxnOp>,
    ) -> Result<TxnResponse> {
        let txn = Txn::new()
            .when([self.fence_compare(role, token)?])
            .and_then(ops)
            .or_else([
                TxnOp::get(self.keys.lease(role), None),
                TxnOp::get(self.keys.term(role), None),
            ]);
        let response = self
            .conn
            .txn("committing a fenced transaction", txn)
            .await?;
        if response.succeeded() {
            return Ok(response);
        }
        let (lease_kv, term_kv) = two_gets(&response);
        let highest = match (&lease_kv, term_kv.as_ref().and_then(parse_term)) {
            (Some(kv), _) => u64::try_from(kv.create_revision()).unwrap_or(0),
            (None, Some((record, mod_revision))) => record.token_at(mod_revision),
            (None, None) => token.get(),
        };
        Err(Error::Fenced {
            presented: token,
            highest: FencingToken::from(highest),
        })
    }
}
