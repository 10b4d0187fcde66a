//! The WAL disk of a throwaway PostgreSQL server, which its owner can stall.
//!
//! Built as a shared library of its own by the crate's build script and preloaded
//! (`LD_PRELOAD`) into the server's processes by `PgServer`. It stands in for `pwrite`
//! and `pwritev`: while the file named by `TENURE_WAL_DISK` exists, a write to a file
//! under `pg_wal/` waits until the file is gone, as a write to a disk that stopped
//! answering does. A commit writes its WAL record while it holds the WAL's write lock,
//! so every commit of the server waits behind it, reads go on, and each waiting commit
//! lands when the disk answers again: after its caller may have given up on it. Other
//! writes, and every write while the file is absent, go straight to the C library.
//!
//! `no_std`: the server loads it into every process it forks, so it carries no runtime,
//! allocates nothing and calls only the C library.

#![no_std]

use core::ffi::{c_char, c_int, c_long, c_void};
use core::sync::atomic::{AtomicPtr, Ordering};

#[repr(C)]
struct Timespec {
    tv_sec: c_long,
    tv_nsec: c_long,
}

#[link(name = "c")]
extern "C" {
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn getenv(name: *const c_char) -> *const c_char;
    fn access(path: *const c_char, mode: c_int) -> c_int;
    fn readlink(path: *const c_char, buf: *mut c_char, size: usize) -> isize;
    fn nanosleep(request: *const Timespec, remaining: *mut Timespec) -> c_int;
    fn __errno_location() -> *mut c_int;
}

/// `dlsym`'s handle for "the next object after this one": the C library's function.
const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;
const F_OK: c_int = 0;
const ENOSYS: c_int = 38;

type Pwrite = unsafe extern "C" fn(c_int, *const c_void, usize, i64) -> isize;
type Pwritev = unsafe extern "C" fn(c_int, *const c_void, c_int, i64) -> isize;

static REAL_PWRITE: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static REAL_PWRITEV: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());

/// The C library's `name` (NUL-terminated), looked up once.
unsafe fn real(slot: &AtomicPtr<c_void>, name: &[u8]) -> *mut c_void {
    let mut function = slot.load(Ordering::Relaxed);
    if function.is_null() {
        function = dlsym(RTLD_NEXT, name.as_ptr().cast());
        slot.store(function, Ordering::Relaxed);
    }
    function
}

/// Whether the disk is stalled now: the control file exists.
unsafe fn stalled() -> bool {
    let control = getenv(c"TENURE_WAL_DISK".as_ptr());
    !control.is_null() && access(control, F_OK) == 0
}

/// Whether `fd` is a file under a `pg_wal/` directory.
unsafe fn is_wal(fd: c_int) -> bool {
    // "/proc/self/fd/" and up to ten digits.
    let mut link = *b"/proc/self/fd/\0\0\0\0\0\0\0\0\0\0\0";
    let mut at = 14;
    let mut digits = [0u8; 10];
    let mut n = fd.unsigned_abs();
    let mut count = 0;
    loop {
        digits[count] = b'0' + (n % 10) as u8;
        count += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    while count > 0 {
        count -= 1;
        link[at] = digits[count];
        at += 1;
    }
    let mut target = [0u8; 512];
    let len = readlink(
        link.as_ptr().cast(),
        target.as_mut_ptr().cast(),
        target.len(),
    );
    if len <= 0 {
        return false;
    }
    let path = &target[..len as usize];
    path.windows(8).any(|part| part == b"/pg_wal/")
}

/// The C library's `name` (`slot` keeps it), once the disk is not stalled or `fd` is
/// not on it; null, with `errno` ENOSYS, when the C library has no such function.
unsafe fn when_answered(fd: c_int, slot: &AtomicPtr<c_void>, name: &[u8]) -> *mut c_void {
    if stalled() && is_wal(fd) {
        let millisecond = Timespec {
            tv_sec: 0,
            tv_nsec: 1_000_000,
        };
        while stalled() {
            nanosleep(&millisecond, core::ptr::null_mut());
        }
    }
    let function = real(slot, name);
    if function.is_null() {
        *__errno_location() = ENOSYS;
    }
    function
}

/// `pwrite(2)`, held while the WAL disk is stalled.
///
/// # Safety
/// As `pwrite(2)`: `buf` holds `count` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn pwrite(fd: c_int, buf: *const c_void, count: usize, offset: i64) -> isize {
    match when_answered(fd, &REAL_PWRITE, b"pwrite\0") {
        function if function.is_null() => -1,
        function => core::mem::transmute::<*mut c_void, Pwrite>(function)(fd, buf, count, offset),
    }
}

/// `pwritev(2)`, held while the WAL disk is stalled.
///
/// # Safety
/// As `pwritev(2)`: `iov` points to `count` `struct iovec`s, each over readable bytes.
#[no_mangle]
pub unsafe extern "C" fn pwritev(
    fd: c_int,
    iov: *const c_void,
    count: c_int,
    offset: i64,
) -> isize {
    match when_answered(fd, &REAL_PWRITEV, b"pwritev\0") {
        function if function.is_null() => -1,
        function => core::mem::transmute::<*mut c_void, Pwritev>(function)(fd, iov, count, offset),
    }
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// The unwinder's hook, which the precompiled `core` names; never called: nothing here
/// unwinds (built with `panic=abort`).
#[no_mangle]
extern "C" fn rust_eh_personality() {}
