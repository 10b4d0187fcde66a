//! A loopback TCP proxy in front of the store, so `cut` can sever or blackhole the
//! workers' connections the way a network does, whatever protocol runs over them.
//!
//! Workers connect to [`Proxy::local_addr`] instead of the store. The nemesis can
//! [`drop_all`](Proxy::drop_all) current connections (both sides get a TCP reset, as
//! after a crashed middlebox), or [`blackhole`](Proxy::blackhole) them: sockets stay
//! open but no byte is forwarded either way, and new connections are accepted but not
//! connected through, until [`heal`](Proxy::heal). Bytes held back during a blackhole
//! are delivered after the heal, as TCP retransmission would after a partition.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// Forwards `127.0.0.1:<ephemeral>` to one upstream address until dropped.
#[derive(Debug)]
pub struct Proxy {
    local: SocketAddr,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

#[derive(Debug)]
struct Shared {
    /// True while bytes flow; false while blackholed.
    open: watch::Sender<bool>,
    /// Cancelled (and replaced) to reset every connection opened before.
    generation: Mutex<CancellationToken>,
    /// Connections currently forwarded (or held by a blackhole).
    live: AtomicUsize,
}

impl Shared {
    fn generation(&self) -> CancellationToken {
        self.generation
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Counts a connection for as long as its task runs.
struct Live<'a>(&'a AtomicUsize);

impl Drop for Live<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> io::Result<Proxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let local = listener.local_addr()?;
        let shared = Arc::new(Shared {
            open: watch::Sender::new(true),
            generation: Mutex::new(CancellationToken::new()),
            live: AtomicUsize::new(0),
        });
        let stop = CancellationToken::new();
        tokio::spawn(accept_loop(
            listener,
            upstream,
            shared.clone(),
            stop.clone(),
        ));
        Ok(Proxy {
            local,
            upstream,
            shared,
            stop,
        })
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The address forwarded to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Connections open through the proxy now.
    pub fn connections(&self) -> usize {
        self.shared.live.load(Ordering::Relaxed)
    }

    /// Resets every current connection (both sides see a TCP reset); returns how many
    /// there were. Connections opened afterwards are forwarded as usual (or held, while
    /// blackholed).
    pub fn drop_all(&self) -> usize {
        let old = std::mem::replace(
            &mut *self
                .shared
                .generation
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
            CancellationToken::new(),
        );
        let count = self.connections();
        old.cancel();
        count
    }

    /// Stops forwarding in both directions, keeping every socket open.
    pub fn blackhole(&self) {
        self.shared.open.send_replace(false);
    }

    /// Forwards again after [`blackhole`](Proxy::blackhole).
    pub fn heal(&self) {
        self.shared.open.send_replace(true);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
        self.shared.generation().cancel();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((client, _)) => {
                shared.live.fetch_add(1, Ordering::Relaxed);
                let shared = shared.clone();
                tokio::spawn(async move {
                    let _live = Live(&shared.live);
                    let cut = shared.generation();
                    forward(client, upstream, shared.open.subscribe(), cut).await;
                });
            }
            // Out of file descriptors and the like: the client sees a refused or
            // dropped connection, as it would from a struggling network; keep serving.
            Err(error) => debug!(%error, "proxy accept failed"),
        }
    }
}

/// Forwards one connection until either side closes or `cut` fires (then resets both).
async fn forward(
    mut client: TcpStream,
    upstream: SocketAddr,
    mut open: watch::Receiver<bool>,
    cut: CancellationToken,
) {
    let _ = client.set_nodelay(true);
    let connected = tokio::select! {
        _ = cut.cancelled() => None,
        // A blackholed network does not connect anyone through either.
        server = async {
            open.wait_for(|open| *open).await.ok()?;
            TcpStream::connect(upstream).await.ok()
        } => server,
    };
    let Some(mut server) = connected else {
        reset(&client);
        return;
    };
    let _ = server.set_nodelay(true);
    let finished = {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        let both = async {
            tokio::try_join!(
                pump(client_read, server_write, open.clone()),
                pump(server_read, client_write, open.clone()),
            )
        };
        tokio::select! {
            _ = cut.cancelled() => false,
            _ = both => true,
        }
    };
    if !finished {
        reset(&client);
        reset(&server);
    }
}

/// Sets a zero linger time so dropping the socket sends a reset, not a clean close.
fn reset(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
}

/// Copies `from` to `to`, waiting whenever the proxy is blackholed (before reading, so
/// unread bytes stay in the kernel's buffers, and before writing what was read).
async fn pump(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut open: watch::Receiver<bool>,
) -> io::Result<()> {
    let mut buf = vec![0u8; 16 * 1024];
    let closed = || io::Error::other("proxy stopped");
    loop {
        open.wait_for(|open| *open).await.map_err(|_| closed())?;
        let n = from.read(&mut buf).await?;
        if n == 0 {
            // Half-close: pass the end of stream on; the other direction carries on.
            return to.shutdown().await;
        }
        open.wait_for(|open| *open).await.map_err(|_| closed())?;
        to.write_all(&buf[..n]).await?;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::timeout;

    use super::*;

    /// An echo server on loopback: what goes in comes back.
    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = stream.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(stream: &mut TcpStream, bytes: &[u8]) -> io::Result<Vec<u8>> {
        stream.write_all(bytes).await?;
        let mut back = vec![0u8; bytes.len()];
        stream.read_exact(&mut back).await?;
        Ok(back)
    }

    /// Forwarding, a blackhole that holds bytes back until the heal (on an existing and
    /// on a new connection), and a drop that resets current connections but not later
    /// ones.
    #[tokio::test]
    async fn forwards_blackholes_heals_and_drops() {
        let proxy = Proxy::start(echo_server().await).await.unwrap();
        let mut a = TcpStream::connect(proxy.local_addr()).await.unwrap();
        assert_eq!(round_trip(&mut a, b"ping").await.unwrap(), b"ping");
        assert_eq!(proxy.connections(), 1);

        proxy.blackhole();
        let held = timeout(Duration::from_millis(300), round_trip(&mut a, b"held")).await;
        assert!(held.is_err(), "a blackholed connection answered");
        let mut b = TcpStream::connect(proxy.local_addr()).await.unwrap();
        b.write_all(b"new!").await.unwrap();
        let mut buf = [0u8; 4];
        let early = timeout(Duration::from_millis(200), b.read_exact(&mut buf)).await;
        assert!(
            early.is_err(),
            "a connection opened in a blackhole answered"
        );

        proxy.heal();
        // What was sent into the blackhole arrives after the heal, on both.
        let mut back = [0u8; 4];
        timeout(Duration::from_secs(5), a.read_exact(&mut back))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&back, b"held");
        timeout(Duration::from_secs(5), b.read_exact(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf, b"new!");
        assert_eq!(proxy.connections(), 2);

        assert_eq!(proxy.drop_all(), 2);
        for stream in [&mut a, &mut b] {
            let after = timeout(Duration::from_secs(5), round_trip(stream, b"gone")).await;
            assert!(
                matches!(after, Ok(Err(_))),
                "a dropped connection still works"
            );
        }
        let mut c = TcpStream::connect(proxy.local_addr()).await.unwrap();
        assert_eq!(round_trip(&mut c, b"next").await.unwrap(), b"next");
        timeout(Duration::from_secs(5), async {
            while proxy.connections() != 1 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap();
    }
}
