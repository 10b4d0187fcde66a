//! Throwaway etcd servers: one member, or a small cluster, on loopback.
//!
//! [`EtcdServer::start`] runs one `etcd` member (from `$ETCD_BIN`, `PATH` or
//! `/usr/bin/etcd`, the Debian `etcd-server` package) on free loopback ports with a fresh
//! data directory (on `/dev/shm` when it exists, so fsync is cheap on a loaded machine);
//! [`EtcdServer::start_with`] runs a given binary (the Kubernetes harness runs the etcd 3.6
//! that `scripts/build-servers` builds). [`EtcdCluster::start`] runs several members that
//! form one cluster. Each member can be
//! stopped (SIGTERM), killed (SIGKILL), restarted on the same ports and data, paused
//! (SIGSTOP) and resumed (SIGCONT), and, when its binary has etcd's failpoints (the etcd of
//! `scripts/build-servers`), its disk stalled for a while ([`EtcdMember::stall_wal_for`]:
//! writes hang inside the server, as on a disk that stopped answering).
//!
//! Nothing outlives its owner: `Drop` kills the members and removes their data, and every
//! member is started with `PR_SET_PDEATHSIG` from one long-lived spawner thread, so it is
//! killed even when the owner dies abruptly. Data directories left by an owner that died
//! are swept on the next start.
//!
//! The harness manages processes only; it speaks no etcd protocol beyond the plain
//! HTTP `/health` probe (and the failpoints' HTTP endpoint), so building it needs no
//! `protoc`.

use std::fs;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{Result, ThrowawayError};
use crate::process::{free_ports, fresh_dir, on_path, shared_server, sweep_once, ServerProcess};

const DIR_PREFIX: &str = "tenure-etcd-";
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The failpoint before each fsync of etcd's write-ahead log (`storage/wal`), which
/// `scripts/build-servers` enables.
const WAL_SYNC_FAILPOINT: &str = "walBeforeSync";

/// Where the `etcd` binary is: `$ETCD_BIN`, then `PATH`, then `/usr/bin/etcd`.
pub fn etcd_binary() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os("ETCD_BIN") {
        let bin = PathBuf::from(bin);
        return bin.is_file().then_some(bin);
    }
    on_path("etcd").or_else(|| {
        ["/usr/bin/etcd", "/usr/local/bin/etcd"]
            .into_iter()
            .map(PathBuf::from)
            .find(|candidate| candidate.is_file())
    })
}

/// One member of a throwaway cluster: its ports, data directory and process.
#[derive(Debug)]
pub struct EtcdMember {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// Where etcd's failpoints are set over HTTP (`GOFAIL_HTTP`; a binary without
    /// failpoints ignores it and listens on nothing there).
    failpoint_port: u16,
    data_dir: PathBuf,
    process: ServerProcess,
}

impl EtcdMember {
    /// The member's name in the cluster (`m0`, `m1`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The client endpoint, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// The client endpoint without a scheme, `127.0.0.1:PORT` (the form `etcd://` URLs use).
    pub fn host_port(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// The peer (raft) port.
    pub fn peer_port(&self) -> u16 {
        self.peer_port
    }

    /// The member's data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The process id while the member runs.
    pub fn pid(&self) -> Option<libc::pid_t> {
        self.process.pid()
    }

    /// Whether the member's process is running (or paused).
    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    /// The member's log (stdout and stderr of every run so far).
    pub fn log(&self) -> String {
        self.process.log()
    }

    /// Stops the member gracefully (SIGTERM, then SIGKILL after 10 s). Data is kept.
    pub fn stop(&self) {
        self.process.stop(Duration::from_secs(10));
    }

    /// Kills the member at once (SIGKILL), as a crash would. Data is kept.
    pub fn kill(&self) {
        self.process.kill();
    }

    /// Freezes the member (SIGSTOP): its sockets stay open but it answers nothing.
    pub fn pause(&self) {
        self.process.pause();
    }

    /// Thaws a paused member (SIGCONT).
    pub fn resume(&self) {
        self.process.resume();
    }

    /// Starts the member again on the same ports and data (stopping it first if it runs)
    /// and waits until its client port accepts connections. It serves requests once it
    /// sees a quorum; use [`wait_healthy`](EtcdMember::wait_healthy) for that.
    pub fn restart(&self) -> Result<()> {
        self.stop();
        self.process.spawn()?;
        self.process.wait_until(
            "listening",
            START_TIMEOUT,
            Duration::from_millis(20),
            || TcpStream::connect_timeout(&self.client_addr(), Duration::from_millis(200)).is_ok(),
        )
    }

    /// Whether the member answers `/health` with `"health":"true"` (it has a leader and
    /// can serve a linearizable read).
    pub fn is_healthy(&self) -> bool {
        health_probe(self.client_addr()).unwrap_or(false)
    }

    /// Waits until [`is_healthy`](EtcdMember::is_healthy); an error with the log when
    /// `within` passes or the member is not running.
    pub fn wait_healthy(&self, within: Duration) -> Result<()> {
        self.process
            .wait_until("healthy", within, Duration::from_millis(50), || {
                self.is_healthy()
            })
    }

    /// Whether the member's binary has the failpoint [`stall_wal_for`](Self::stall_wal_for)
    /// sets (the etcd `scripts/build-servers` builds has it; Debian's has no failpoints).
    pub fn can_stall_wal(&self) -> bool {
        http(self.failpoint_addr(), "GET", "/", "", HTTP_WAIT)
            .is_ok_and(|(status, body)| status == 200 && body.contains(WAL_SYNC_FAILPOINT))
    }

    /// Stalls the member's disk for `stall` from now on: its next fsync of the
    /// write-ahead log waits that long first, and with it every write the member makes
    /// durable (a single member answers no write, nor a linearizable read, meanwhile;
    /// requests given up by their callers are still applied when it ends). The harness
    /// writes a key of its own (`tenure-throwaway/disk-stall`) at once, so the stall
    /// begins now rather than at the next client's write. It cannot be ended early; a
    /// kill ends it with the process. Needs a binary with etcd's failpoints
    /// ([`can_stall_wal`](Self::can_stall_wal)).
    pub fn stall_wal_for(&self, stall: Duration) -> Result<()> {
        let what = format!("stalling the disk of etcd member {}", self.name);
        // One sleep, once: gofail's `COUNT*sleep(MILLISECONDS)`.
        let term = format!("1*sleep({})", stall.as_millis().max(1));
        let path = format!("/{WAL_SYNC_FAILPOINT}");
        match http(self.failpoint_addr(), "PUT", &path, &term, HTTP_WAIT) {
            Ok((status, _)) if (200..300).contains(&status) => {
                // The JSON gateway's put (key and value in base64): it waits out the
                // stall it starts, on a thread of its own.
                let addr = self.client_addr();
                let put = r#"{"key":"dGVudXJlLXRocm93YXdheS9kaXNrLXN0YWxs","value":"MQ=="}"#;
                thread::spawn(move || http(addr, "POST", "/v3/kv/put", put, stall + HTTP_WAIT));
                Ok(())
            }
            Ok((status, body)) => Err(ThrowawayError::failed(
                what,
                format!("the failpoint endpoint answered {status}: {body}"),
            )),
            Err(source) => Err(ThrowawayError::Io {
                what: format!(
                    "{what} (its failpoints: an etcd without them, such as Debian's, has \
                     none; scripts/build-servers builds one that has)"
                ),
                source,
            }),
        }
    }

    fn client_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.client_port))
    }

    fn failpoint_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.failpoint_port))
    }
}

/// A throwaway etcd cluster of one or more members on loopback.
#[derive(Debug)]
pub struct EtcdCluster {
    root: PathBuf,
    members: Vec<EtcdMember>,
}

impl EtcdCluster {
    /// Starts `size` members of [`etcd_binary`] forming one cluster and waits until every
    /// member is healthy; the error carries the logs. Tries again on fresh ports (three
    /// tries in all) in case another process took a port between probe and bind.
    pub fn start(size: usize) -> Result<EtcdCluster> {
        let bin = etcd_binary().ok_or(ThrowawayError::NotInstalled {
            program: "etcd",
            looked_in: "$ETCD_BIN, PATH, /usr/bin",
            package: "etcd-server",
        })?;
        Self::start_with(size, &bin)
    }

    /// [`start`](EtcdCluster::start) with the etcd binary `bin`.
    pub fn start_with(size: usize, bin: &Path) -> Result<EtcdCluster> {
        if size == 0 {
            return Err(ThrowawayError::failed(
                "starting an etcd cluster",
                "a cluster needs at least one member",
            ));
        }
        static SWEPT: OnceLock<()> = OnceLock::new();
        sweep_once(DIR_PREFIX, &SWEPT);
        let mut last_failure = String::new();
        for _attempt in 0..3 {
            let cluster = Self::create(size, bin)?;
            for member in &cluster.members {
                member.process.spawn()?;
            }
            match cluster.wait_all_healthy(START_TIMEOUT) {
                Ok(()) => return Ok(cluster),
                Err(failure) => last_failure = failure,
            }
        }
        Err(ThrowawayError::failed(
            format!("an etcd cluster of {size} did not start"),
            last_failure,
        ))
    }

    fn create(size: usize, bin: &Path) -> Result<EtcdCluster> {
        let root = fresh_dir(DIR_PREFIX)?;
        let ports = free_ports(size * 3)?;
        let token = root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "tenure-etcd".into());
        let initial_cluster = (0..size)
            .map(|i| format!("m{i}=http://127.0.0.1:{}", ports[3 * i + 1]))
            .collect::<Vec<_>>()
            .join(",");
        let members = (0..size)
            .map(|i| {
                let name = format!("m{i}");
                let client_port = ports[3 * i];
                let peer_port = ports[3 * i + 1];
                let failpoint_port = ports[3 * i + 2];
                let data_dir = root.join(&name);
                let client_url = format!("http://127.0.0.1:{client_port}");
                let peer_url = format!("http://127.0.0.1:{peer_port}");
                let args = vec![
                    format!("--name={name}"),
                    format!("--data-dir={}", data_dir.display()),
                    format!("--listen-client-urls={client_url}"),
                    format!("--advertise-client-urls={client_url}"),
                    format!("--listen-peer-urls={peer_url}"),
                    format!("--initial-advertise-peer-urls={peer_url}"),
                    format!("--initial-cluster={initial_cluster}"),
                    "--initial-cluster-state=new".to_string(),
                    format!("--initial-cluster-token={token}"),
                    // Short raft timers: failover in tests takes about a second.
                    "--heartbeat-interval=50".to_string(),
                    "--election-timeout=500".to_string(),
                    "--log-level=warn".to_string(),
                    "--logger=zap".to_string(),
                ];
                EtcdMember {
                    process: ServerProcess::new(
                        format!("etcd member {name}"),
                        bin.to_path_buf(),
                        args,
                        root.join(format!("{name}.log")),
                    )
                    .with_env("GOFAIL_HTTP", format!("127.0.0.1:{failpoint_port}")),
                    name,
                    client_port,
                    peer_port,
                    failpoint_port,
                    data_dir,
                }
            })
            .collect();
        Ok(EtcdCluster { root, members })
    }

    fn wait_all_healthy(&self, within: Duration) -> std::result::Result<(), String> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(dead) = self.members.iter().find(|m| !m.is_running()) {
                return Err(format!("member {} exited:\n{}", dead.name, dead.log()));
            }
            if self.members.iter().all(EtcdMember::is_healthy) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let logs: Vec<String> = self
                    .members
                    .iter()
                    .map(|m| format!("--- {}:\n{}", m.name, m.log()))
                    .collect();
                return Err(format!(
                    "not healthy within {within:?}\n{}",
                    logs.join("\n")
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills every member and removes their data.
    fn kill_and_clean(&self) {
        for member in &self.members {
            member.kill();
        }
        let _ = fs::remove_dir_all(&self.root);
    }

    /// The members, in start order.
    pub fn members(&self) -> &[EtcdMember] {
        &self.members
    }

    /// Member `i`; panics when `i` is not below the cluster's size, like indexing.
    pub fn member(&self, i: usize) -> &EtcdMember {
        &self.members[i]
    }

    /// Every member's client endpoint (`http://127.0.0.1:PORT`).
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(EtcdMember::endpoint).collect()
    }

    /// Every member's `127.0.0.1:PORT`, comma-separated: the host list of an `etcd://` URL.
    pub fn host_list(&self) -> String {
        self.members
            .iter()
            .map(EtcdMember::host_port)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Waits until every member is healthy; after `within`, an error with the logs.
    pub fn wait_healthy(&self, within: Duration) -> Result<()> {
        self.wait_all_healthy(within)
            .map_err(|failure| ThrowawayError::failed("the etcd cluster is unhealthy", failure))
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.kill_and_clean();
    }
}

/// A throwaway single-member etcd server.
#[derive(Debug)]
pub struct EtcdServer {
    cluster: EtcdCluster,
}

impl EtcdServer {
    /// Starts one member of [`etcd_binary`] on free loopback ports with a fresh data
    /// directory and waits until it is healthy; the error carries the log.
    pub fn start() -> Result<EtcdServer> {
        Ok(EtcdServer {
            cluster: EtcdCluster::start(1)?,
        })
    }

    /// [`start`](EtcdServer::start) with the etcd binary `bin`.
    pub fn start_with(bin: &Path) -> Result<EtcdServer> {
        Ok(EtcdServer {
            cluster: EtcdCluster::start_with(1, bin)?,
        })
    }

    /// One server shared by every caller in this process (tests isolate themselves by
    /// key prefix), started on first use and killed at process exit; a failed start is
    /// remembered and returned to every caller. Callers that stop, kill or pause a server
    /// start their own instead.
    pub fn shared() -> std::result::Result<&'static EtcdServer, &'static ThrowawayError> {
        static SHARED: OnceLock<Result<EtcdServer>> = OnceLock::new();
        shared_server(&SHARED, EtcdServer::start, EtcdServer::kill_and_clean)
    }

    /// The client endpoint, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        self.member().endpoint()
    }

    /// The client endpoint without a scheme, `127.0.0.1:PORT`.
    pub fn host_port(&self) -> String {
        self.member().host_port()
    }

    /// The one member, for its process controls.
    pub fn member(&self) -> &EtcdMember {
        self.cluster.member(0)
    }

    /// Stops the server gracefully; data is kept.
    pub fn stop(&self) {
        self.member().stop();
    }

    /// Kills the server (SIGKILL); data is kept.
    pub fn kill(&self) {
        self.member().kill();
    }

    /// Restarts the server on the same port and data and waits until it is healthy.
    pub fn restart(&self) -> Result<()> {
        self.member().restart()?;
        self.member().wait_healthy(START_TIMEOUT)
    }

    /// Freezes the server (SIGSTOP).
    pub fn pause(&self) {
        self.member().pause();
    }

    /// Thaws the server (SIGCONT).
    pub fn resume(&self) {
        self.member().resume();
    }

    /// Whether the server can stall its disk ([`EtcdMember::can_stall_wal`]).
    pub fn can_stall_wal(&self) -> bool {
        self.member().can_stall_wal()
    }

    /// Stalls the server's disk for `stall` ([`EtcdMember::stall_wal_for`]).
    pub fn stall_wal_for(&self, stall: Duration) -> Result<()> {
        self.member().stall_wal_for(stall)
    }

    /// Kills the server and removes its data: for an owner that never drops it (a
    /// process-wide server, at exit).
    pub(crate) fn kill_and_clean(&self) {
        self.cluster.kill_and_clean();
    }
}

/// One plain HTTP/1.0 `GET /health`; true when the body says `"health":"true"`.
fn health_probe(addr: SocketAddr) -> io::Result<bool> {
    let (_, body) = http(addr, "GET", "/health", "", HTTP_WAIT)?;
    Ok(body.contains("\"health\":\"true\""))
}

/// How long a plain HTTP request to a member may wait for its answer.
const HTTP_WAIT: Duration = Duration::from_secs(2);

/// One plain HTTP/1.0 request with `body`: the answer's status and body (a server on
/// loopback answering within `wait`).
fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    wait: Duration,
) -> io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(300))?;
    stream.set_read_timeout(Some(wait))?;
    stream.set_write_timeout(Some(HTTP_WAIT))?;
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes())?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let malformed = || io::Error::new(io::ErrorKind::InvalidData, "not an HTTP answer");
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(malformed)?;
    let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    Ok((status, body.to_owned()))
}
