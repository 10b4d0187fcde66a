//! [`EtcdFence`]: the compare-and-reject fence kept in etcd, for writes outside etcd.
//!
//! Writes *to etcd itself* are best guarded by [`EtcdLeaseStore::fenced_txn`]
//! (`create_revision(lease key) == token`). For side effects elsewhere, this fence keeps
//! the highest admitted token per resource under `<prefix>/fences/RESOURCE`, as a
//! zero-padded decimal so etcd's byte-wise comparison orders it numerically; admitting
//! is one transaction.
//!
//! [`EtcdLeaseStore::fenced_txn`]: crate::EtcdLeaseStore::fenced_txn

use async_trait::async_trait;
use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use tenure::lease::validate_name;
use tenure::{Error, FenceStore, FencingToken, Result};

use crate::conn::Conn;
use crate::lease::DEFAULT_REQUEST_TIMEOUT;
use crate::schema::Keys;

/// Per resource, the highest token admitted, kept in etcd.
#[derive(Clone)]
pub struct EtcdFence {
    conn: Conn,
    keys: Keys,
}

impl std::fmt::Debug for EtcdFence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdFence")
            .field("prefix", &self.keys.prefix())
            .finish_non_exhaustive()
    }
}

/// `u64::MAX` has 20 digits.
fn encode(token: FencingToken) -> String {
    format!("{:020}", token.get())
}

fn decode(bytes: &[u8]) -> Result<FencingToken> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map(FencingToken::from)
        .ok_or_else(|| Error::store_msg("etcd", "a fence key holds something other than a token"))
}

impl EtcdFence {
    /// A fence under `prefix` on the caller's client.
    pub fn new(client: Client, prefix: &str) -> Result<Self> {
        Ok(EtcdFence {
            conn: Conn {
                client,
                timeout: DEFAULT_REQUEST_TIMEOUT,
            },
            keys: Keys::new(prefix)?,
        })
    }

    fn key(&self, resource: &str) -> Result<String> {
        validate_name("resource", resource)?;
        Ok(format!("{}/fences/{resource}", self.keys.prefix()))
    }
}

#[async_trait]
impl FenceStore for EtcdFence {
    async fn admit(&self, resource: &str, token: FencingToken) -> Result<()> {
        let key = self.key(resource)?;
        let presented = encode(token);
        // A value compare on a missing key is false in etcd, so a first token lands in
        // the Else branch too: one round trip either way.
        let txn = Txn::new()
            .when([Compare::value(
                key.as_str(),
                CompareOp::Greater,
                presented.as_str(),
            )])
            .and_then([TxnOp::get(key.as_str(), None)])
            .or_else([TxnOp::put(key.as_str(), presented.as_str(), None)]);
        let answer = self.conn.txn("admit a fencing token", txn).await?;
        if !answer.succeeded() {
            return Ok(());
        }
        let highest = answer
            .op_responses()
            .into_iter()
            .find_map(|op| match op {
                TxnOpResponse::Get(get) => get.kvs().first().map(|kv| decode(kv.value())),
                _ => None,
            })
            .ok_or_else(|| Error::store_msg("etcd", "the fence transaction returned no value"))??;
        Err(Error::Fenced {
            presented: token,
            highest,
        })
    }

    async fn highest(&self, resource: &str) -> Result<Option<FencingToken>> {
        let key = self.key(resource)?;
        let answer = self.conn.get("read a fence", &key, None).await?;
        answer
            .kvs()
            .first()
            .map(|kv| decode(kv.value()))
            .transpose()
    }
}
