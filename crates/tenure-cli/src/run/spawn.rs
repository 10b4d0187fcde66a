//! Starting the command already inside its cgroup, with `clone3(CLONE_INTO_CGROUP)`.
//!
//! A process that joins a cgroup by writing `cgroup.procs` between fork and exec is moved,
//! and a move takes the kernel's cgroup-wide thread-group lock for writing, which waits for
//! an RCU grace period: 5 to 20 ms on the hosts measured, most of what `tenure run -- true`
//! cost (BENCHMARKS.md). A process cloned into the cgroup is born there and never moves
//! (0.2 ms), and it is in the cgroup before it runs a single instruction, as with the
//! write. Where the kernel or a seccomp filter refuses `clone3` (kernels before 5.7,
//! container runtimes that answer ENOSYS), the caller falls back to the write.
//!
//! The child runs only async-signal-safe calls between the clone and `execvpe`: everything
//! it needs (program, arguments, environment) is built before the clone.

use std::ffi::{CString, OsStr, OsString};
use std::io::{self, ErrorKind};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use nix::sys::signal::{kill, SigHandler, Signal};
use nix::unistd::Pid;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::signals::TTY_STOPS;
use crate::cgroup::CommandCgroup;

/// The kernel's `struct clone_args` (the same on every architecture).
#[repr(C, align(8))]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// `CLONE_INTO_CGROUP` (Linux 5.7), which the libc crate declares on some targets only.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// How the command is started.
pub(crate) struct Launch<'a> {
    pub(crate) program: &'a OsStr,
    pub(crate) args: &'a [OsString],
    /// Variables set on top of tenure's own environment.
    pub(crate) env: Vec<(OsString, OsString)>,
    /// A session of its own (`setsid`) rather than a process group of its own.
    pub(crate) own_session: bool,
}

/// A command the kernel refused to clone into its cgroup: start it the other way.
pub(crate) struct Refused;

impl Launch<'_> {
    /// Starts the command inside the cgroup `cgroup` (an open directory), or says it was
    /// refused before anything ran.
    pub(crate) fn clone_into(&self, cgroup: BorrowedFd<'_>) -> Result<io::Result<Cloned>, Refused> {
        let prepared = match self.prepare() {
            Ok(prepared) => prepared,
            Err(error) => return Ok(Err(error)),
        };
        let (report_read, report_write) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
            Ok(pipe) => pipe,
            Err(error) => return Ok(Err(error.into())),
        };
        let mut pidfd: libc::c_int = -1;
        let mut args = CloneArgs {
            flags: libc::CLONE_PIDFD as u64 | CLONE_INTO_CGROUP,
            pidfd: &mut pidfd as *mut libc::c_int as u64,
            exit_signal: libc::SIGCHLD as u64,
            cgroup: cgroup.as_raw_fd() as u64,
            ..CloneArgs::default()
        };
        // SAFETY: like fork: the child gets a copy of this thread only and runs `exec_child`,
        // which makes async-signal-safe calls alone and never returns.
        let pid = unsafe {
            libc::syscall(
                libc::SYS_clone3,
                &mut args as *mut CloneArgs,
                std::mem::size_of::<CloneArgs>(),
            )
        };
        if pid == 0 {
            // SAFETY: in the child, straight after the clone.
            unsafe { exec_child(&prepared, self.own_session, report_write.as_raw_fd()) }
        }
        if pid < 0 {
            return Err(Refused);
        }
        drop(report_write);
        // SAFETY: the kernel wrote a new descriptor that nothing else owns.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
        let pid = Pid::from_raw(pid as i32);
        Ok(Cloned::started(pid, pidfd, report_read))
    }

    fn prepare(&self) -> io::Result<Prepared> {
        let cstring = |bytes: &[u8]| {
            CString::new(bytes).map_err(|_| {
                io::Error::new(
                    ErrorKind::InvalidInput,
                    "a NUL byte in the command or its environment",
                )
            })
        };
        let program = cstring(self.program.as_bytes())?;
        let mut argv = vec![program.clone()];
        for arg in self.args {
            argv.push(cstring(arg.as_bytes())?);
        }
        let mut envp = Vec::new();
        for (key, value) in std::env::vars_os() {
            if !self.env.iter().any(|(set, _)| *set == key) {
                envp.push(cstring(&[key.as_bytes(), b"=", value.as_bytes()].concat())?);
            }
        }
        for (key, value) in &self.env {
            envp.push(cstring(&[key.as_bytes(), b"=", value.as_bytes()].concat())?);
        }
        Ok(Prepared::new(program, argv, envp))
    }
}

/// The command's program, arguments and environment as `execvpe` takes them.
struct Prepared {
    program: CString,
    _strings: (Vec<CString>, Vec<CString>),
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
}

impl Prepared {
    fn new(program: CString, argv: Vec<CString>, envp: Vec<CString>) -> Prepared {
        let pointers = |strings: &[CString]| {
            let mut pointers: Vec<_> = strings.iter().map(|s| s.as_ptr()).collect();
            pointers.push(std::ptr::null());
            pointers
        };
        Prepared {
            program,
            argv: pointers(&argv),
            envp: pointers(&envp),
            _strings: (argv, envp),
        }
    }
}

/// The child's side: what std's `Command` and tenure's `pre_exec` did, then the command.
/// On failure the errno goes to `report` and the child exits 127.
///
/// # Safety
///
/// Only in the child of a clone, before anything else runs in it.
unsafe fn exec_child(prepared: &Prepared, own_session: bool, report: libc::c_int) -> ! {
    let fail = || -> ! {
        let errno = io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL);
        let bytes = errno.to_ne_bytes();
        libc::write(report, bytes.as_ptr().cast(), bytes.len());
        libc::_exit(127)
    };
    // Its own session, or its own process group, so forwarded signals reach everything
    // it starts, as a terminal's would.
    let grouped = if own_session {
        libc::setsid()
    } else {
        libc::setpgid(0, 0)
    };
    if grouped < 0 {
        fail();
    }
    // Ignored dispositions survive exec: the command gets the defaults of a shell job
    // (and SIGPIPE's, which Rust ignores in tenure), and no signal blocked.
    for stop in TTY_STOPS {
        libc::signal(stop as libc::c_int, libc::SIG_DFL);
    }
    libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    let mut none: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut none);
    libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    // If tenure dies (SIGKILL, OOM), the command must not outlive its lease.
    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) < 0 {
        fail();
    }
    libc::execvpe(
        prepared.program.as_ptr(),
        prepared.argv.as_ptr(),
        prepared.envp.as_ptr(),
    );
    fail()
}

/// A command started by [`Launch::clone_into`]: waited for through its pidfd. It is
/// SIGKILLed if dropped before it was reaped, as tokio's children are with `kill_on_drop`.
pub(crate) struct Cloned {
    pid: Pid,
    pidfd: AsyncFd<OwnedFd>,
    status: Option<ExitStatus>,
}

impl Cloned {
    /// The clone's outcome once the child has exec'd (or failed to, saying why on
    /// `report`).
    fn started(pid: Pid, pidfd: OwnedFd, report: OwnedFd) -> io::Result<Cloned> {
        let mut errno = [0u8; 4];
        let mut read = 0;
        // Closed by the exec (success) or after the errno was written (failure).
        while read < errno.len() {
            match nix::unistd::read(&report, &mut errno[read..]) {
                Ok(0) => break,
                Ok(n) => read += n,
                Err(nix::errno::Errno::EINTR) => {}
                Err(error) => return Err(error.into()),
            }
        }
        let reaped = |pidfd: &OwnedFd| {
            // The child exits at once after reporting: reap it, blocking that long.
            let _ = wait_pidfd(pidfd, 0);
        };
        if read == errno.len() {
            reaped(&pidfd);
            return Err(io::Error::from_raw_os_error(i32::from_ne_bytes(errno)));
        }
        if read != 0 {
            reaped(&pidfd);
            return Err(io::Error::other("a short report from the command's child"));
        }
        Ok(Cloned {
            pid,
            // SAFETY: an `OwnedFd` keeps its descriptor open, and the same, until dropped.
            pidfd: unsafe { AsyncFd::register_with_interest(pidfd, Interest::READABLE) }?,
            status: None,
        })
    }

    /// The command's process id.
    pub(crate) fn pid(&self) -> Pid {
        self.pid
    }

    /// Its status if it has exited (reaping it), without waiting.
    pub(crate) fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.status = wait_pidfd(self.pidfd.get_ref(), libc::WNOHANG)?;
        }
        Ok(self.status)
    }

    /// Waits until it exits, and reaps it.
    pub(crate) async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            // A pidfd is readable once its process has exited.
            self.pidfd.readable().await?.clear_ready();
        }
    }
}

impl Drop for Cloned {
    fn drop(&mut self) {
        if self.status.is_none() {
            // Reaped later by the orphan reaping, once it is no longer a running command.
            let _ = kill(self.pid, Signal::SIGKILL);
        }
    }
}

/// `waitid(P_PIDFD, pidfd, WEXITED | flags)`: the status of an exited child (reaped), or
/// `None` with `WNOHANG` while it runs.
fn wait_pidfd(pidfd: &OwnedFd, flags: libc::c_int) -> io::Result<Option<ExitStatus>> {
    loop {
        // SAFETY: `info` is written by the kernel; zeroed is a valid siginfo_t.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let id = pidfd.as_raw_fd() as libc::id_t;
        // SAFETY: a plain system call on a descriptor this owns.
        let result = unsafe { libc::waitid(libc::P_PIDFD, id, &mut info, libc::WEXITED | flags) };
        if result < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        // SAFETY: set by a successful waitid; a pid of 0 means no child has exited.
        let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
        if pid == 0 {
            return Ok(None);
        }
        // Back to the wait(2) encoding `ExitStatus` reads.
        let raw = match info.si_code {
            libc::CLD_EXITED => (status & 0xff) << 8,
            libc::CLD_DUMPED => status | 0x80,
            _ => status,
        };
        return Ok(Some(ExitStatus::from_raw(raw)));
    }
}

/// The command, however it was started.
pub(crate) enum Process {
    /// Started by tokio (where there is no cgroup, or `clone3` was refused).
    Tokio(tokio::process::Child),
    /// Cloned into its cgroup.
    Cloned(Cloned),
}

impl Process {
    /// Its process id, while it has not been reaped.
    pub(crate) fn id(&self) -> Option<u32> {
        match self {
            Process::Tokio(child) => child.id(),
            Process::Cloned(child) => Some(child.pid().as_raw() as u32),
        }
    }

    /// Its status if it has exited, without waiting.
    pub(crate) fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        match self {
            Process::Tokio(child) => child.try_wait(),
            Process::Cloned(child) => child.try_wait(),
        }
    }

    /// Waits until it exits.
    pub(crate) async fn wait(&mut self) -> io::Result<ExitStatus> {
        match self {
            Process::Tokio(child) => child.wait().await,
            Process::Cloned(child) => child.wait().await,
        }
    }
}

impl Launch<'_> {
    /// Starts the command: cloned into `cgroup` where there is one and the kernel allows,
    /// else forked, joining the cgroup (if any) by writing `procs` before it execs.
    pub(crate) fn start(
        &self,
        cgroup: Option<&CommandCgroup>,
        procs: Option<OwnedFd>,
    ) -> io::Result<Process> {
        if let Some(cgroup) = cgroup {
            if let Ok(cloned) = self.clone_into(cgroup.dir()) {
                return cloned.map(Process::Cloned);
            }
        }
        self.fork(procs).map(Process::Tokio)
    }

    /// Starts the command with tokio (fork and exec); `procs` is the `cgroup.procs` it
    /// joins between the two.
    fn fork(&self, procs: Option<OwnedFd>) -> io::Result<tokio::process::Child> {
        let mut command = tokio::process::Command::new(self.program);
        command
            .args(self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .kill_on_drop(true);
        if !self.own_session {
            // Its own process group, so forwarded signals reach everything it started
            // in it, as a terminal's would.
            command.process_group(0);
        }
        let join_fd = procs.as_ref().map(|procs| procs.as_raw_fd());
        let own_session = self.own_session;
        // SAFETY: write, prctl, setsid and sigaction are async-signal-safe; nothing else
        // runs between fork and exec.
        unsafe {
            command.pre_exec(move || {
                if let Some(procs) = join_fd {
                    // `0` moves the writer: this child, before it runs the command. Should
                    // the kernel refuse, the command runs outside it, stopped by signals
                    // as where there is no cgroup, rather than not at all.
                    let procs = BorrowedFd::borrow_raw(procs);
                    let _ = nix::unistd::write(procs, b"0");
                }
                if own_session {
                    // A new session (and process group) the command's processes share.
                    nix::unistd::setsid().map_err(io::Error::from)?;
                }
                // Ignored dispositions survive exec: without this the command could not
                // be stopped by its own background terminal I/O, as a shell job would be.
                for stop in TTY_STOPS {
                    nix::sys::signal::signal(stop, SigHandler::SigDfl).map_err(io::Error::from)?;
                }
                // If tenure dies (SIGKILL, OOM), the command must not outlive its lease.
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)
            });
        }
        let spawned = command.spawn();
        drop(procs);
        spawned
    }
}
