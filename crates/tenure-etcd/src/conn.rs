//! The connection: the caller's etcd client with a per-request timeout and resends of
//! requests that never reached a server, and the mapping of etcd's errors and watch
//! responses to tenure's.

use std::future::Future;
use std::time::Duration;

use etcd_client::{
    Client, DeleteOptions, DeleteResponse, GetOptions, GetResponse, KvClient,
    LeaseTimeToLiveOptions, Txn, TxnResponse, WatchOptions, WatchStream,
};
use tenure::{Error, Result};

/// The backend's name in errors.
pub(crate) const BACKEND: &str = "etcd";

/// The largest answer a read decodes. A shard group is read whole, about 300 bytes a
/// shard (its lease, term and value keys): 40,000 shards are 11.8 MB, past gRPC's default
/// 4 MB, which refused the read, so no member could look at the group. This bounds a
/// million shards (about 300 MB) with room; the server is the one the user configured.
const MAX_ANSWER_BYTES: usize = 1 << 30;

pub(crate) fn store_err(what: &str, error: etcd_client::Error) -> Error {
    Error::store(BACKEND, what.to_owned(), error)
}

/// Whether an etcd error says the lease does not exist (expired or revoked).
pub(crate) fn is_lease_not_found(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::LeaseKeepAliveError(message) => message.contains("not found"),
        etcd_client::Error::GRpcStatus(status) => status.message().contains("lease not found"),
        _ => false,
    }
}

/// Whether the request provably never reached a server: the connection to the endpoint
/// the client's balancer picked could not be opened. Such a request is safe to resend,
/// and resending lets the balancer pick a live member (it keeps picking dead ones).
fn never_sent(error: &etcd_client::Error) -> bool {
    let etcd_client::Error::GRpcStatus(status) = error else {
        return false;
    };
    // gRPC status 14, UNAVAILABLE.
    if status.code() as i32 != 14 {
        return false;
    }
    if status.message().contains("tcp connect error") {
        return true;
    }
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::ConnectionRefused;
        }
        source = cause.source();
    }
    false
}

/// The caller's etcd client and the per-request timeout, with the few calls the
/// backend makes. Every call is bounded by the timeout and resent (within it) when it
/// never reached a server.
#[derive(Clone)]
pub(crate) struct Conn {
    pub(crate) client: Client,
    pub(crate) timeout: Duration,
}

const MAX_SENDS: usize = 4;

impl Conn {
    /// Sets the timeout of each request; a zero one is refused (nothing would ever be
    /// answered in time).
    pub(crate) fn set_timeout(&mut self, timeout: Duration) -> Result<()> {
        if timeout.is_zero() {
            return Err(Error::invalid(
                "request_timeout",
                "must be greater than zero",
            ));
        }
        self.timeout = timeout;
        Ok(())
    }

    async fn call<T, F, Fut>(&self, what: &str, mut make: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut sends = 0;
        loop {
            sends += 1;
            match tokio::time::timeout_at(deadline, make()).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(error)) if sends < MAX_SENDS && never_sent(&error) => {
                    tracing::trace!(what, %error, "request not sent; resending");
                }
                Ok(Err(error)) => return Err(store_err(what, error)),
                Err(elapsed) => {
                    return Err(Error::store(
                        BACKEND,
                        format!("{what}: no answer within {:?}", self.timeout),
                        elapsed,
                    ))
                }
            }
        }
    }

    /// A KV client that decodes answers up to [`MAX_ANSWER_BYTES`].
    fn kv(&self) -> KvClient {
        self.client
            .kv_client()
            .max_decoding_message_size(MAX_ANSWER_BYTES)
    }

    pub(crate) async fn txn(&self, what: &str, txn: Txn) -> Result<TxnResponse> {
        self.call(what, || {
            let mut kv = self.kv();
            let txn = txn.clone();
            async move { kv.txn(txn).await }
        })
        .await
    }

    pub(crate) async fn get(
        &self,
        what: &str,
        key: &str,
        options: Option<GetOptions>,
    ) -> Result<GetResponse> {
        self.call(what, || {
            let mut kv = self.kv();
            let options = options.clone();
            async move { kv.get(key, options).await }
        })
        .await
    }

    pub(crate) async fn delete(
        &self,
        what: &str,
        key: &str,
        options: Option<DeleteOptions>,
    ) -> Result<DeleteResponse> {
        self.call(what, || {
            let mut kv = self.kv();
            let options = options.clone();
            async move { kv.delete(key, options).await }
        })
        .await
    }

    /// Grants an etcd lease: its id and the granted TTL (at least `ttl_secs`; etcd raises
    /// TTLs below its minimum). Callers read the clocks before calling: the lease's TTL
    /// counts from some time after that.
    pub(crate) async fn grant(&self, ttl_secs: i64) -> Result<(i64, i64)> {
        let granted = self
            .call("granting an etcd lease", || {
                let mut leases = self.client.lease_client();
                async move { leases.grant(ttl_secs, None).await }
            })
            .await?;
        Ok((granted.id(), granted.ttl().max(ttl_secs)))
    }

    pub(crate) async fn watch(
        &self,
        what: &str,
        key: &str,
        options: WatchOptions,
    ) -> Result<WatchStream> {
        self.call(what, || {
            let mut watches = self.client.watch_client();
            let options = options.clone();
            async move { watches.watch(key, Some(options)).await }
        })
        .await
    }

    /// Keeps `lease` alive once; `Ok(false)` when etcd no longer has it.
    pub(crate) async fn keep_alive_once(&self, lease: i64) -> Result<bool> {
        #[cfg(test)]
        if faults::keep_alive_fails(lease) {
            return Err(Error::store_msg(BACKEND, "injected keep-alive failure"));
        }
        let answer = self
            .call("keeping the etcd lease alive", || {
                let mut leases = self.client.lease_client();
                async move {
                    match leases.keep_alive(lease).await {
                        Ok(_keeper_and_stream) => Ok(true),
                        Err(error) if is_lease_not_found(&error) => Ok(false),
                        Err(error) => Err(error),
                    }
                }
            })
            .await;
        answer
    }

    /// The keys attached to `lease`; `None` when etcd no longer has it.
    pub(crate) async fn attached_keys(&self, lease: i64) -> Result<Option<Vec<Vec<u8>>>> {
        let answer = self
            .call("listing an etcd lease's keys", || {
                let mut leases = self.client.lease_client();
                let options = LeaseTimeToLiveOptions::new().with_keys();
                async move { leases.time_to_live(lease, Some(options)).await }
            })
            .await?;
        // etcd answers a TTL of -1 for a lease it does not have.
        Ok((answer.ttl() >= 0).then(|| answer.keys().to_vec()))
    }

    /// Revokes `lease`: `Ok(false)` when etcd no longer had it (expired or revoked).
    pub(crate) async fn revoke(&self, lease: i64) -> Result<bool> {
        self.call("revoking an etcd lease", || {
            let mut leases = self.client.lease_client();
            async move {
                match leases.revoke(lease).await {
                    Ok(_) => Ok(true),
                    Err(error) if is_lease_not_found(&error) => Ok(false),
                    Err(error) => Err(error),
                }
            }
        })
        .await
    }

    /// Revokes `lease`, logging (not returning) failures: callers revoke only to clean
    /// up after the key that mattered is already gone or moved.
    pub(crate) async fn revoke_quietly(&self, lease: i64) {
        if lease == 0 {
            return;
        }
        if let Err(error) = self.revoke(lease).await {
            tracing::debug!(lease, %error, "revoking an unused etcd lease failed; it expires by itself");
        }
    }
}

/// The next response of a watch on `what` (for messages): `None` when the stream ended,
/// an error when it broke or etcd cancelled it.
pub(crate) async fn next_response(
    stream: &mut etcd_client::WatchStream,
    what: &str,
) -> Result<Option<etcd_client::WatchResponse>> {
    let message = stream
        .message()
        .await
        .map_err(|e| Error::store(BACKEND, format!("watching {what}"), e))?;
    match message {
        Some(response) if response.canceled() => Err(Error::store_msg(
            BACKEND,
            format!(
                "the {what} watch was cancelled: {}",
                response.cancel_reason()
            ),
        )),
        other => Ok(other),
    }
}

/// Faults the unit tests inject where no real etcd fault hits one request of two sent
/// together (the keep-alive beside an acquire's transaction, but not the transaction).
#[cfg(test)]
pub(crate) mod faults {
    use parking_lot::Mutex;

    static FAILING_KEEP_ALIVES: Mutex<Vec<i64>> = Mutex::new(Vec::new());

    /// The next keep-alive of `lease` fails (a transport error, nothing sent).
    pub(crate) fn fail_next_keep_alive(lease: i64) {
        FAILING_KEEP_ALIVES.lock().push(lease);
    }

    /// Whether a keep-alive of `lease` is still due to fail.
    pub(crate) fn keep_alive_pending(lease: i64) -> bool {
        FAILING_KEEP_ALIVES.lock().contains(&lease)
    }

    pub(super) fn keep_alive_fails(lease: i64) -> bool {
        let mut failing = FAILING_KEEP_ALIVES.lock();
        let at = failing.iter().position(|&l| l == lease);
        at.map(|at| failing.swap_remove(at)).is_some()
    }
}
