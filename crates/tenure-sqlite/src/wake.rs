//! Wake-ups between processes on one host: a release that hands a role to a candidate
//! in another process tells that process at once, instead of leaving it to its next
//! poll of the file; so does a join or a leave, to the processes of the other live
//! nodes (the message is then the membership's signal name, see `registry.rs`); and so
//! does every write that begins or ends a term, to the process watching the role.
//!
//! Every owner that queues through a database, and every node that heartbeats through
//! it, listens on a datagram socket of its own,
//! named after the file (device and inode) and the owner, in Linux's abstract socket
//! namespace (no file to create or clean up; it goes with the process). A store that
//! hands a role to an owner sends the role's name there, and the listener wakes its
//! process's waiters on that role, which read the row as any poll would.
//!
//! A wait on a role's terms (a leader watching for handoff requests, a member for drain
//! requests, `observe`, a contender waiting for its turn) watches the role on a socket
//! named after the file and the role. One process at a time holds that name (the waits
//! themselves receive on it, so it is free again the moment the last of them ends), and
//! every store writing a new or ended term of the role sends its name there (a failed
//! send to nobody costs one system call). The watching process then polls the file
//! rarely instead of every poll interval; the others waiting on the role poll as
//! before, trying to take the watch at every poll.
//!
//! A wake carries no authority: a lost one (no listener, another network namespace)
//! costs a poll, a forged one a read. Elsewhere than Linux nothing listens and waiters
//! poll.

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

/// The listeners of one database file's queued owners and watched roles in this
/// process, and the socket it sends wake-ups through.
pub(crate) struct Wakes {
    /// The file's device and inode, so that two files never share a socket name.
    file: (u64, u64),
    /// Sends every wake-up of this database (`None` where there are none to send).
    sender: Option<socket::Sender>,
    /// The sockets of the roles this database's waits watch, each shared by the waits
    /// on it in this process and closed when the last of them ends.
    watches: Mutex<HashMap<String, Weak<tokio::net::UnixDatagram>>>,
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
            sender: socket::Sender::new().ok(),
            watches: Mutex::new(HashMap::new()),
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
        let listener = match socket::bind(&self.owner_name(owner)) {
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
        if let Err(error) = self.send(&self.owner_name(owner), role) {
            tracing::debug!(owner, role, %error, "no wake-up sent; the owner polls");
        }
    }

    /// Watches `role` for a wait of this process: the socket another process's write
    /// of a term of it is announced on, shared with this process's other waits on it
    /// and closed when the last of them ends. `None` when another process watches it
    /// (or nothing can listen here), and then the wait polls.
    pub(crate) fn watch(&self, role: &str) -> Option<RoleWatch> {
        let mut watches = self.watches.lock();
        if let Some(socket) = watches.get(role).and_then(Weak::upgrade) {
            return Some(RoleWatch(socket));
        }
        watches.retain(|_, socket| socket.strong_count() > 0);
        match socket::bind(&self.role_name(role)) {
            Ok(socket) => {
                let socket = Arc::new(socket);
                watches.insert(role.to_owned(), Arc::downgrade(&socket));
                Some(RoleWatch(socket))
            }
            Err(error) => {
                tracing::trace!(role, %error, "cannot watch the role; its wait polls");
                None
            }
        }
    }

    /// Tells the process watching `role`, if any, that a term of it began or ended. No
    /// watcher is the common case, and then the send fails at once, unlogged.
    pub(crate) fn announce(&self, role: &str) {
        let _ = self.send(&self.role_name(role), role);
    }

    fn send(&self, name: &str, role: &str) -> std::io::Result<()> {
        match &self.sender {
            Some(sender) => sender.send(name, role.as_bytes()),
            None => Err(std::io::ErrorKind::Unsupported.into()),
        }
    }

    /// The socket name of `owner` on this file.
    fn owner_name(&self, owner: &str) -> String {
        let (dev, ino) = self.file;
        format!(
            "tenure-sqlite/{dev:x}/{ino:x}/{:016x}",
            fnv1a(owner.as_bytes())
        )
    }

    /// The socket name of the watch of `role` on this file (apart from every owner's).
    fn role_name(&self, role: &str) -> String {
        let (dev, ino) = self.file;
        format!(
            "tenure-sqlite/{dev:x}/{ino:x}/role/{:016x}",
            fnv1a(role.as_bytes())
        )
    }
}

/// A wait's share of its process's watch of a role (see [`Wakes::watch`]).
pub(crate) struct RoleWatch(Arc<tokio::net::UnixDatagram>);

impl RoleWatch {
    /// Waits for an announcement, then wakes every waiter of this process on the role
    /// it names (`signals`). An error says the socket is broken: stop waiting on it.
    pub(crate) async fn heard(&self, signals: &Signals) -> std::io::Result<()> {
        let mut buf = vec![0u8; MAX_WAKE + 1];
        let len = self.0.recv(&mut buf).await?;
        notify_named(signals, &buf[..len]);
        Ok(())
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
        notify_named(&signals, &buf[..len]);
    }
}

/// Wakes the waiters in `signals` on the role a received wake-up names (its first
/// [`MAX_WAKE`] bytes); one that is not UTF-8 names none.
fn notify_named(signals: &Signals, wake: &[u8]) {
    if let Ok(role) = std::str::from_utf8(&wake[..wake.len().min(MAX_WAKE)]) {
        notify(signals, role);
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

    /// An unbound socket that sends datagrams to abstract names, never blocking.
    pub(super) struct Sender(UnixDatagram);

    impl Sender {
        pub(super) fn new() -> io::Result<Self> {
            let socket = UnixDatagram::unbound()?;
            socket.set_nonblocking(true)?;
            Ok(Sender(socket))
        }

        pub(super) fn send(&self, name: &str, message: &[u8]) -> io::Result<()> {
            self.0
                .send_to_addr(message, &SocketAddr::from_abstract_name(name)?)
                .map(drop)
        }
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

    pub(super) struct Sender;

    impl Sender {
        pub(super) fn new() -> io::Result<Self> {
            Err(unsupported())
        }

        pub(super) fn send(&self, _name: &str, _message: &[u8]) -> io::Result<()> {
            Err(unsupported())
        }
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
        assert_ne!(wakes.owner_name("node-a"), wakes.owner_name("node-b"));
        assert_ne!(
            wakes.owner_name("node-a"),
            Wakes::new(1, 3).owner_name("node-a")
        );
        // A role's watch is never an owner's socket, whatever the names.
        assert_ne!(wakes.owner_name("node-a"), wakes.role_name("node-a"));
        // Within the 107 bytes of an abstract socket name, whatever the owner.
        let far = Wakes::new(u64::MAX, u64::MAX);
        assert!(far.owner_name(&"o".repeat(300)).len() < 100);
        assert!(far.role_name(&"r".repeat(300)).len() < 100);
    }
}
