//! The database file itself: where it may live, how many names it may have, and
//! whether the file a store opened is still the one at its path.
//!
//! SQLite's locks, its WAL index (the `-shm` file, shared memory) and the monotonic
//! clock the store keeps time on are all one kernel's. A file on a network or cluster
//! file system is reached by several kernels, which share none of them; a second name
//! for the file (a hard link) gets its own `-wal` and `-shm`, so SQLite sees two
//! databases; and a file deleted or replaced under a running store takes its tokens
//! with it. Each would let two holders lead at once, so each is refused.

use std::fs::{File, Metadata};
use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use tenure::{Error, Result};

use crate::BACKEND;

/// Where to elect across hosts instead, for messages.
const ACROSS_HOSTS: &str = "keep the file on a local disk of one host, or use PostgreSQL or \
                            etcd (--store postgres://... or etcd://...) to elect across hosts";

/// The network, cluster or shared-folder file system with `statfs` magic `f_type`,
/// by name, or `None` for any other (local) file system.
///
/// A file there can be opened from more than one kernel: each host would read its own
/// monotonic clock and boot id, its own locks and its own shared memory, so every
/// host's write would end the others' leases. FUSE is refused as a whole: `f_type`
/// cannot tell sshfs or GlusterFS from a local FUSE file system, and virtiofs (a VM's
/// shared folder) reports FUSE's magic too.
pub fn shared_file_system(f_type: u32) -> Option<&'static str> {
    // Values from <linux/magic.h> and the file systems' own headers.
    Some(match f_type {
        0x0000_6969 => "NFS",
        0x0000_517B => "SMB",
        0xFE53_4D42 => "SMB2",
        0xFF53_4D42 => "CIFS",
        0x6573_5546 => "FUSE (sshfs, virtiofs, GlusterFS, ...)",
        0x0102_1997 => "9P (a VM's or WSL's shared folder)",
        0x00C3_6400 => "Ceph",
        0x5346_414F | 0x6B41_4653 => "AFS",
        0x7375_7245 => "Coda",
        0x0BD0_0BD0 => "Lustre",
        0x4750_4653 => "GPFS",
        0x7461_636F => "OCFS2",
        0x0116_1970 => "GFS2",
        0x1983_0326 => "BeeGFS",
        0x2003_0528 => "OrangeFS",
        0x0000_564C => "NCP",
        0x786F_4256 => "vboxsf (a VirtualBox shared folder)",
        0xBACB_ACBC => "vmhgfs (a VMware shared folder)",
        _ => return None,
    })
}

/// Refuses `checked` (the database file or its directory) when it is on a file system
/// several kernels can reach.
pub(crate) fn refuse_shared_file_system(shown: &Path, checked: FsTarget<'_>) -> Result<()> {
    let Some(f_type) = f_type(checked).map_err(|e| {
        Error::store(
            BACKEND,
            format!("{}: cannot inspect its file system", shown.display()),
            e,
        )
    })?
    else {
        return Ok(());
    };
    match shared_file_system(f_type) {
        None => Ok(()),
        Some(name) => Err(Error::invalid(
            "path",
            format!(
                "{} is on {name}, a network or shared file system: hosts sharing it would \
                 each keep their own clock and locks and end each other's leases; {ACROSS_HOSTS}",
                shown.display()
            ),
        )),
    }
}

/// What [`refuse_shared_file_system`] asks `statfs` about.
pub(crate) enum FsTarget<'a> {
    /// A path (the directory, before the file exists).
    Path(&'a Path),
    /// An open file (which a single-file bind mount puts on another file system than
    /// its directory).
    File(&'a File),
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn f_type(target: FsTarget<'_>) -> nix::Result<Option<u32>> {
    let fs = match target {
        FsTarget::Path(path) => nix::sys::statfs::statfs(path)?,
        FsTarget::File(file) => nix::sys::statfs::fstatfs(file)?,
    };
    // Every magic is 32 bits; `f_type` is a signed word, negative for the high ones on
    // 32-bit targets, so only its low 32 bits are kept.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(Some(fs.filesystem_type().0 as u32))
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn f_type(_target: FsTarget<'_>) -> nix::Result<Option<u32>> {
    Ok(None)
}

/// Refuses a database file with more than one name, and a `-wal` or `-shm` beside it
/// with more than one: each name would get its own WAL and lock.
pub(crate) fn refuse_hard_links(path: &Path, file: &Metadata) -> Result<()> {
    if file.nlink() > 1 {
        return Err(Error::invalid("path", hard_linked(path, file.nlink())));
    }
    for suffix in ["-wal", "-shm"] {
        let mut sibling = path.as_os_str().to_owned();
        sibling.push(suffix);
        let sibling = PathBuf::from(sibling);
        match std::fs::metadata(&sibling) {
            Ok(meta) if meta.nlink() > 1 => {
                return Err(Error::invalid("path", hard_linked(&sibling, meta.nlink())))
            }
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => {
                return Err(Error::store(
                    BACKEND,
                    format!("{}: cannot inspect the file", sibling.display()),
                    e,
                ))
            }
        }
    }
    Ok(())
}

fn hard_linked(path: &Path, links: u64) -> String {
    format!(
        "{} has {links} names (hard links): SQLite would keep a WAL and a lock per name, \
         so each name would be a store of its own on one file; remove the other names \
         (find / -samefile {}) or use a file of its own",
        path.display(),
        path.display()
    )
}

/// Which file a store opened: its device, inode and birth time, to tell later whether
/// the path still names it.
///
/// No descriptor is kept for this: closing one drops every POSIX lock the process holds
/// on the file, SQLite's included, so a descriptor of our own could never be closed
/// safely while SQLite's connections live. The identity is enough: while the store's
/// connections hold the file open its inode cannot be freed, so a file at the path
/// with the same device and inode is the same file (the birth time, where the file
/// system records one, covers an inode reused once every connection closed).
#[derive(Debug)]
pub(crate) struct FileIdentity {
    path: PathBuf,
    dev: u64,
    ino: u64,
    born: Option<SystemTime>,
}

impl FileIdentity {
    pub(crate) fn new(path: PathBuf, opened: &Metadata) -> Self {
        FileIdentity {
            path,
            dev: opened.dev(),
            ino: opened.ino(),
            born: opened.created().ok(),
        }
    }

    /// The file's device and inode.
    pub(crate) fn dev_ino(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }

    /// Fails when the file was deleted, moved away, replaced or hard-linked since it
    /// was opened. One `stat`: it runs on every call.
    pub(crate) fn check(&self) -> Result<()> {
        let shown = self.path.display();
        let lost = |what: &str| {
            Error::store_msg(
                BACKEND,
                format!(
                    "{shown} was {what} while in use: this store's tokens are in the file \
                     it opened, so it stops rather than go on in a file no new process \
                     opens, or hand out tokens from 1 in a new one; put the file back, or \
                     restart every process using it (its tokens then start again at 1)"
                ),
            )
        };
        let now = match std::fs::metadata(&self.path) {
            Ok(now) => now,
            Err(e) if e.kind() == ErrorKind::NotFound => return Err(lost("deleted (or moved)")),
            Err(e) => {
                return Err(Error::store(
                    BACKEND,
                    format!("{shown}: cannot inspect the file"),
                    e,
                ))
            }
        };
        if (now.dev(), now.ino()) != (self.dev, self.ino)
            || (self.born.is_some() && now.created().ok() != self.born)
        {
            return Err(lost("replaced by another file"));
        }
        if now.nlink() > 1 {
            return Err(Error::store_msg(
                BACKEND,
                hard_linked(&self.path, now.nlink()),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_and_shared_file_systems_are_named() {
        for (magic, name) in [
            (0x6969, "NFS"),
            (0x517B, "SMB"),
            (0xFE53_4D42, "SMB2"),
            (0xFF53_4D42, "CIFS"),
            (0x6573_5546, "FUSE"),
            (0x0102_1997, "9P"),
            (0x00C3_6400, "Ceph"),
            (0x5346_414F, "AFS"),
            (0x6B41_4653, "AFS"),
            (0x0BD0_0BD0, "Lustre"),
            (0x4750_4653, "GPFS"),
        ] {
            let named = shared_file_system(magic);
            assert!(
                named.is_some_and(|n| n.starts_with(name)),
                "{magic:#x}: {named:?}"
            );
        }
    }

    #[test]
    fn local_file_systems_are_not() {
        // ext4, xfs, btrfs, tmpfs, overlayfs, zfs, f2fs, ramfs.
        for magic in [
            0xEF53,
            0x5846_5342,
            0x9123_683E,
            0x0102_1994,
            0x794C_7630,
            0x2FC1_2FC1,
            0xF2F5_2010,
            0x8584_58F6,
        ] {
            assert_eq!(shared_file_system(magic), None, "{magic:#x}");
        }
    }

    /// A signed 32-bit `f_type` (32-bit targets) keeps its low bits.
    #[test]
    fn high_magics_survive_a_signed_word() {
        let signed: i32 = 0xFF53_4D42_u32 as i32;
        #[allow(clippy::cast_sign_loss)]
        let magic = i64::from(signed) as u32;
        assert_eq!(shared_file_system(magic), Some("CIFS"));
    }
}
