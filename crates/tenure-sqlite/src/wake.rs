//! Wake-ups between processes on one host: a release that hands a role to a candidate
//! in another process tells that process at once, instead of leaving it to its next
//! poll of the file; so does a join or a leave, to the processes of the other live
//! nodes (the message is then the membership's signal name, see `registry.rs`).
//!
//! Every owner that queues through a database, and every node that heartbeats through
//! it, listens on a datagram socket of its own,
//! named after the file (device and inode) and the owner, in Linux's abstract socket
//! namespace (no file to create or clean up; it goes with the process). A store that
//! hands a role to an owner sends the role's name there, and the listener wakes its
//! process's waiters on that role, which read the row as any poll would. A wake carries
//! no authority: a lost one (no listener, another network namespace) costs a poll
//! interval, a forged one a read. Elsewhere than Linux nothing listens and waiters poll.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// The change signals of one database's waiters, by role (see `SqliteDatabase`).
pub(crate) type Signals = Mutex<HashMap<String, Arc<Notify>>>;

/// Wakes the waiters on `role` in `signals`, if any wait.
pub(crate) fn notify(signals: &Signals, role: &str) {
    let signal = signals.lock().get(role).cloned();
    if let Some(signal) = signal {
        signal.notify_waiters();
    }
}

/// The longest role name a wake carries; a longer datagram is not a wake.
const MAX_WAKE: usize = 1024;

/// The listeners of one database file's queued owners in this process.
pub(crate) struct Wakes {
    /// The file's device and inode, so that two files never share a socket name.
    file: (u64, u64),
    /// Every owner that queued through this database: its listener, or `None` when it
    /// could not listen (its name taken, or no abstract sockets) and its waiters must
    /// keep polling at the full rate.
    owners: Mutex<HashMap<String, Option<JoinHandle<()>>>>,
}

impl Wakes {
    /// Wake-ups for the file with device `dev` and inode `ino`.
    pub(crate) fn new(dev: u64, ino: u64) -> Self {
        Wakes {
            file: (dev, ino),
            owners: Mutex::new(HashMap::new()),
        }
    }

    /// Listens for wake-ups addressed to `owner` (once per owner), waking the waiters
    /// in `signals`. Whether `owner` hears them: `false` when it could not bind.
    pub(crate) fn listen(&self, owner: &str, signals: Weak<Signals>) -> bool {
        // One lock over the check and the bind: two queue calls of one owner at once
        // bind once.
        let mut owners = self.owners.lock();
        if let Some(listener) = owners.get(owner) {
            return listener.is_some();
        }
        let listener = match socket::bind(&self.name(owner)) {
            Ok(socket) => Some(tokio::spawn(receive(socket, signals))),
            Err(error) => {
                tracing::debug!(owner, %error, "cannot listen for wake-ups; polling instead");
                None
            }
        };
        let listens = listener.is_some();
        owners.insert(owner.to_owned(), listener);
        listens
    }

    /// Whether every owner that queued through this database hears its wake-ups.
    pub(crate) fn all_listening(&self) -> bool {
        let owners = self.owners.lock();
        !owners.is_empty() && owners.values().all(Option::is_some)
    }

    /// Tells `owner`'s process that `role` changed; a failure is only logged (the
    /// owner's poll finds the change).
    pub(crate) fn wake(&self, owner: &str, role: &str) {
        if let Err(error) = socket::send(&self.name(owner), role.as_bytes()) {
            tracing::debug!(owner, role, %error, "no wake-up sent; the owner polls");
        }
    }

    /// The socket name of `owner` on this file.
    fn name(&self, owner: &str) -> String {
        let (dev, ino) = self.file;
        format!(
            "tenure-sqlite/{dev:x}/{ino:x}/{:016x}",
            fnv1a(owner.as_bytes())
        )
    }
}

impl Drop for Wakes {
    fn drop(&mut self) {
        for task in self.owners.lock().values().flatten() {
            task.abort();
        }
    }
}

/// Receives wake-ups until the database is gone.
async fn receive(socket: tokio::net::UnixDatagram, signals: Weak<Signals>) {
    let mut buf = vec![0u8; MAX_WAKE + 1];
    loop {
        let len = match socket.recv(&mut buf).await {
            Ok(len) => len,
            Err(error) => {
                // Not expected of a bound datagram socket; the owner's poll goes on.
                tracing::debug!(%error, "stopped listening for wake-ups");
                return;
            }
        };
        let Some(signals) = signals.upgrade() else {
            return;
        };
        let Ok(role) = std::str::from_utf8(&buf[..len.min(MAX_WAKE)]) else {
            continue;
        };
        notify(&signals, role);
    }
}

/// FNV-1a, 64 bits: a stable name for an owner of any length (the same in every build,
/// as the processes that share a file need).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(target_os = "linux")]
mod socket {
    use std::io;
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};

    pub(super) fn bind(name: &str) -> io::Result<tokio::net::UnixDatagram> {
        let socket = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name)?)?;
        socket.set_nonblocking(true)?;
        tokio::net::UnixDatagram::from_std(socket)
    }

    pub(super) fn send(name: &str, message: &[u8]) -> io::Result<()> {
        let socket = UnixDatagram::unbound()?;
        socket.set_nonblocking(true)?;
        socket
            .send_to_addr(message, &SocketAddr::from_abstract_name(name)?)
            .map(drop)
    }
}

#[cfg(not(target_os = "linux"))]
mod socket {
    use std::io;

    fn unsupported() -> io::Error {
        io::Error::new(io::ErrorKind::Unsupported, "no abstract sockets here")
    }

    pub(super) fn bind(_name: &str) -> io::Result<tokio::net::UnixDatagram> {
        Err(unsupported())
    }

    pub(super) fn send(_name: &str, _message: &[u8]) -> io::Result<()> {
        Err(unsupported())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_names_are_stable_and_distinct() {
        // The published FNV-1a test vectors: every build names an owner alike.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        let wakes = Wakes::new(1, 2);
        assert_ne!(wakes.name("node-a"), wakes.name("node-b"));
        assert_ne!(wakes.name("node-a"), Wakes::new(1, 3).name("node-a"));
        // Within the 107 bytes of an abstract socket name, whatever the owner.
        assert!(Wakes::new(u64::MAX, u64::MAX).name(&"o".repeat(300)).len() < 100);
    }
}
