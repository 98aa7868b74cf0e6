//! Per-node leases: at most one process computes a node key at a time.
//!
//! A lease is an exclusive `flock(2)` on `locks/<key>.lock`. The kernel (or the NFS lock
//! manager) drops it when the holder exits or dies, so a dead holder's lease is taken over
//! without any timeout guesswork. The holder writes who it is into the file for `status`.
//! Lock files are never deleted while a store is in use: deleting a lock file that another
//! process has open would let two processes hold "the" lock on different inodes.

use std::fs::File;
use std::io::{Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Who holds a lease.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LeaseHolder {
    pub host: String,
    pub pid: u32,
    pub run_id: String,
    pub since: String,
}

/// A held lease; released on drop.
#[derive(Debug)]
pub struct Lease {
    file: File,
    path: PathBuf,
}

impl Lease {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Clear the holder record, then unlock (closing the file would unlock as well).
        let _ = self.file.set_len(0);
        // SAFETY: the fd is valid for the lifetime of `self.file`.
        unsafe {
            libc::flock(self.file.as_raw_fd(), libc::LOCK_UN);
        }
    }
}

/// Result of trying to take a lease.
#[derive(Debug)]
pub enum LeaseAttempt {
    Acquired(Lease),
    /// Another live process holds it (its record, if readable).
    Busy(Option<LeaseHolder>),
}

/// Errors of leasing.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("cannot open lock file `{path}`: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the store's filesystem does not support file locks on `{path}` ({source}); \
         mount it with lock support (NFS: lockd/NFSv4; Lustre: `-o flock`) or use a local store"
    )]
    Unsupported {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Try to take the lease at `path` without blocking.
pub fn try_acquire(path: &Path, holder: &LeaseHolder) -> Result<LeaseAttempt, LeaseError> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|source| LeaseError::Open {
            path: path.to_path_buf(),
            source,
        })?;
    // SAFETY: the fd is valid; flock has no memory-safety preconditions.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(code) if code == libc::EWOULDBLOCK || code == libc::EAGAIN => {
                Ok(LeaseAttempt::Busy(read_holder(path)))
            }
            _ => Err(LeaseError::Unsupported {
                path: path.to_path_buf(),
                source: err,
            }),
        };
    }
    let record = serde_json::to_vec(holder).expect("holder serialises");
    let _ = file.set_len(0);
    let _ = file.rewind();
    let _ = file.write_all(&record);
    let _ = file.flush();
    Ok(LeaseAttempt::Acquired(Lease {
        file,
        path: path.to_path_buf(),
    }))
}

/// Who holds the lease at `path` right now: `None` when nobody does (or the file does not
/// exist), `Some(record)` when a live process holds it (`Some(None)` if its record is
/// unreadable). A dead holder's lock is released by the kernel, so its stale record is never
/// reported.
pub fn holder_now(path: &Path) -> Option<Option<LeaseHolder>> {
    let file = std::fs::OpenOptions::new().read(true).open(path).ok()?;
    // A shared, non-blocking probe: it fails only while someone holds the exclusive lease.
    // SAFETY: the fd is valid; flock has no memory-safety preconditions.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    if rc == 0 {
        // SAFETY: as above.
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
        return None;
    }
    Some(read_holder(path))
}

/// The record written by the current holder, if any.
pub fn read_holder(path: &Path) -> Option<LeaseHolder> {
    let bytes = std::fs::read(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(run: &str) -> LeaseHolder {
        LeaseHolder {
            host: "h".into(),
            pid: std::process::id(),
            run_id: run.into(),
            since: "now".into(),
        }
    }

    #[test]
    fn second_taker_is_told_who_holds_it_and_gets_it_after_release() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.lock");
        let first = match try_acquire(&p, &holder("a")).unwrap() {
            LeaseAttempt::Acquired(l) => l,
            LeaseAttempt::Busy(_) => panic!("first attempt must succeed"),
        };
        match try_acquire(&p, &holder("b")).unwrap() {
            LeaseAttempt::Busy(Some(h)) => assert_eq!(h.run_id, "a"),
            other => panic!("expected busy, got {other:?}"),
        }
        assert_eq!(
            holder_now(&p).map(|h| h.map(|h| h.run_id)),
            Some(Some("a".into()))
        );
        drop(first);
        assert_eq!(holder_now(&p), None, "released: nobody holds it");
        assert!(matches!(
            try_acquire(&p, &holder("b")).unwrap(),
            LeaseAttempt::Acquired(_)
        ));
    }

    #[test]
    fn a_dead_holders_record_is_not_reported() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.lock");
        // A record left behind by a holder that died without clearing it (SIGKILL).
        std::fs::write(&p, serde_json::to_vec(&holder("dead")).unwrap()).unwrap();
        assert_eq!(holder_now(&p), None);
        assert_eq!(holder_now(&dir.path().join("absent.lock")), None);
    }
}
