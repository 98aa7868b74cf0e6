//! Per-node leases: at most one process computes a node key at a time.
//!
//! A lease is an exclusive `flock(2)` on `locks/<key>.lock`. The kernel (or the NFS lock
//! manager) drops it when the holder exits or dies, so a dead holder's lease is normally taken
//! over without any timeout guesswork. The holder writes who it is into the file for `status`,
//! and refreshes a heartbeat there (every `UPCC_LEASE_HEARTBEAT_S`, default 30 s) from a
//! thread while it holds the lease.
//!
//! A lock can outlive its holder where the lock manager cannot tell it died (an NFSv3 client
//! that crashed and never came back keeps its locks). A lease whose lock is still held but
//! whose heartbeat is older than `UPCC_LEASE_EXPIRY_S` (default 600 s, twenty missed beats) is
//! taken over: under the store's `takeover.lock`, and only after checking again that the lock
//! is held and the heartbeat stale, its lock file is renamed aside (`….lock.stale-…`) and a new
//! one is locked in its place. A holder that was only stalled that long, not dead, finishes its
//! work unharmed: results are content-addressed and published atomically, so the worst case is
//! the node computed twice. Otherwise lock files are never deleted while a store is in use:
//! deleting one that another process has open would let two processes hold "the" lock on
//! different inodes.

use std::fs::File;
use std::io::{Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Who holds a lease.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LeaseHolder {
    pub host: String,
    pub pid: u32,
    pub run_id: String,
    pub since: String,
    /// Last heartbeat, seconds since the Unix epoch (absent in records of older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat: Option<u64>,
    /// The holder's heartbeat interval in seconds: a lease expires no sooner than three beats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_every_s: Option<f64>,
}

impl LeaseHolder {
    /// How long ago the holder last beat (`None`: no heartbeat recorded).
    pub fn heartbeat_age(&self) -> Option<Duration> {
        let hb = self.heartbeat?;
        Some(Duration::from_secs(unix_now().saturating_sub(hb)))
    }

    /// Whether the heartbeat is older than the expiry, and than three of the holder's beats
    /// (a holder without a heartbeat never expires).
    pub fn expired(&self, timing: &LeaseTiming) -> bool {
        let beats = Duration::from_secs_f64(3.0 * self.heartbeat_every_s.unwrap_or(0.0).max(0.0));
        self.heartbeat_age()
            .is_some_and(|a| a > timing.expiry.max(beats))
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// How often holders beat, and after how long without a beat a held lease is taken over.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LeaseTiming {
    pub heartbeat: Duration,
    pub expiry: Duration,
}

impl LeaseTiming {
    /// `UPCC_LEASE_HEARTBEAT_S` (default 30) and `UPCC_LEASE_EXPIRY_S` (default 600; a lease
    /// never expires before three of its holder's beats).
    pub fn from_env() -> LeaseTiming {
        let secs = |name: &str, default: f64| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|v| v.is_finite() && *v > 0.0)
                .unwrap_or(default)
        };
        let heartbeat = secs("UPCC_LEASE_HEARTBEAT_S", 30.0);
        let expiry = secs("UPCC_LEASE_EXPIRY_S", 600.0);
        LeaseTiming {
            heartbeat: Duration::from_secs_f64(heartbeat),
            expiry: Duration::from_secs_f64(expiry),
        }
    }
}

/// A held lease; released on drop.
#[derive(Debug)]
pub struct Lease {
    file: File,
    path: PathBuf,
    heartbeat: Option<(Sender<()>, JoinHandle<()>)>,
}

impl Lease {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Stop the heartbeat first, so that it cannot rewrite the record after it is cleared.
        if let Some((stop, thread)) = self.heartbeat.take() {
            drop(stop);
            let _ = thread.join();
        }
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
    #[error("cannot open lock file `{path}`: {source}{note}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
        /// After "Permission denied": whose store it is and how to share one.
        note: String,
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

/// Try to take the lease at `path` without blocking (timing from the environment).
pub fn try_acquire(path: &Path, holder: &LeaseHolder) -> Result<LeaseAttempt, LeaseError> {
    try_acquire_with(path, holder, LeaseTiming::from_env())
}

/// Try to take the lease at `path` without blocking; a held lease whose heartbeat expired is
/// taken over (module docs).
pub fn try_acquire_with(
    path: &Path,
    holder: &LeaseHolder,
    timing: LeaseTiming,
) -> Result<LeaseAttempt, LeaseError> {
    match lock_file(path, holder, timing)? {
        LeaseAttempt::Busy(Some(who)) if who.expired(&timing) => take_over(path, holder, timing),
        LeaseAttempt::Busy(None) if silent(path, &timing) => take_over(path, holder, timing),
        other => Ok(other),
    }
}

/// Whether a held lease whose record is unreadable (damaged, or cut short by a crash) has
/// been silent past the expiry: a beating holder rewrites the record, and so the file's
/// modification time, every beat, so a file untouched that long has no live beat behind it.
fn silent(path: &Path, timing: &LeaseTiming) -> bool {
    fs_err::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .is_some_and(|age| age > timing.expiry)
}

// std's File (its raw fd is flocked, its FileExt writes the record in place); the error is
// mapped to LeaseError::Open, which names the path.
#[allow(clippy::disallowed_methods)]
fn open_lock(path: &Path) -> Result<File, LeaseError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|source| LeaseError::Open {
            path: path.to_path_buf(),
            note: if source.kind() == std::io::ErrorKind::PermissionDenied {
                format!(" ({})", crate::fsutil::permission_note(path))
            } else {
                String::new()
            },
            source,
        })?;
    // In a group-shared store (folders 2775) every member must be able to take this lock
    // later: make it group-writable whatever the creator's umask (only its owner can).
    let shared_dir = path
        .parent()
        .and_then(|d| fs_err::metadata(d).ok())
        .is_some_and(|m| m.mode() & 0o2020 == 0o2020);
    if shared_dir {
        if let Ok(m) = file.metadata() {
            // SAFETY: geteuid has no preconditions and cannot fail.
            let me = unsafe { libc::geteuid() };
            if m.mode() & 0o060 != 0o060 && m.uid() == me {
                let _ = file.set_permissions(std::fs::Permissions::from_mode(0o664));
            }
        }
    }
    Ok(file)
}

/// `flock` the file at `path` (created if absent), waiting while another process holds it:
/// a lock held for a short section, not a lease (no holder record, no heartbeat). The lock
/// goes with the returned file.
pub(crate) fn lock_waiting(path: &Path) -> Result<File, LeaseError> {
    let file = open_lock(path)?;
    // SAFETY: the fd is valid; flock has no memory-safety preconditions.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(LeaseError::Unsupported {
            path: path.to_path_buf(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(file)
}

/// `flock` the file at `path` (created if absent) without blocking.
fn lock_file(
    path: &Path,
    holder: &LeaseHolder,
    timing: LeaseTiming,
) -> Result<LeaseAttempt, LeaseError> {
    let mut file = open_lock(path)?;
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
    let mut holder = holder.clone();
    holder.heartbeat = Some(unix_now());
    holder.heartbeat_every_s = Some(timing.heartbeat.as_secs_f64());
    let record = serde_json::to_vec(&holder).expect("holder serialises");
    let _ = file.set_len(0);
    let _ = file.rewind();
    let _ = file.write_all(&record);
    let _ = file.flush();
    let heartbeat = file.try_clone().ok().map(|beat_file| {
        let (stop, wait) = channel::<()>();
        let thread = std::thread::spawn(move || loop {
            match wait.recv_timeout(timing.heartbeat) {
                Err(RecvTimeoutError::Timeout) => {
                    holder.heartbeat = Some(unix_now());
                    let record = serde_json::to_vec(&holder).expect("holder serialises");
                    // Write over the old record, then cut it to length: a reader never sees
                    // an empty record.
                    let _ = beat_file.write_all_at(&record, 0);
                    let _ = beat_file.set_len(record.len() as u64);
                }
                _ => return,
            }
        });
        (stop, thread)
    });
    Ok(LeaseAttempt::Acquired(Lease {
        file,
        path: path.to_path_buf(),
        heartbeat,
    }))
}

/// Take over a lease whose lock is held but whose heartbeat expired: one process at a time
/// (the store's `takeover.lock`), after checking again, rename the lock file aside and lock a
/// new one in its place.
fn take_over(
    path: &Path,
    holder: &LeaseHolder,
    timing: LeaseTiming,
) -> Result<LeaseAttempt, LeaseError> {
    let guard_path = path
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join("takeover.lock");
    let guard = open_lock(&guard_path)?;
    // SAFETY: the fd is valid; flock has no memory-safety preconditions. Blocking: takeovers
    // are rare and short.
    if unsafe { libc::flock(guard.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(LeaseError::Unsupported {
            path: guard_path,
            source: std::io::Error::last_os_error(),
        });
    }
    // Again, under the guard: another process may have taken it over, or the holder beat.
    let who = match lock_file(path, holder, timing)? {
        LeaseAttempt::Busy(Some(who)) if who.expired(&timing) => Some(who),
        LeaseAttempt::Busy(None) if silent(path, &timing) => None,
        other => return Ok(other),
    };
    let aside = path.with_extension(format!("lock.stale-{}-{}", unix_now(), std::process::id()));
    if fs_err::rename(path, &aside).is_err() {
        return Ok(LeaseAttempt::Busy(who));
    }
    match &who {
        Some(who) => tracing::warn!(
            lock = %path.display(),
            "took over the lease of pid {} on {} (run {}): its lock is still held but it has not beaten for {} s",
            who.pid,
            who.host,
            who.run_id,
            who.heartbeat_age().map(|a| a.as_secs()).unwrap_or(0)
        ),
        None => tracing::warn!(
            lock = %path.display(),
            "took over a lease whose lock is still held but whose record is unreadable and untouched for over {} s",
            timing.expiry.as_secs()
        ),
    }
    let attempt = lock_file(path, holder, timing);
    drop(guard);
    attempt
}

/// Who holds the lease at `path` right now: `None` when nobody does (or the file does not
/// exist), `Some(record)` when a live process holds it (`Some(None)` if its record is
/// unreadable). A dead holder's lock is released by the kernel, so its stale record is never
/// reported.
// An absent or unreadable lock file means no holder: the error is not reported.
#[allow(clippy::disallowed_methods)]
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
    let bytes = fs_err::read(path).ok()?;
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
            heartbeat: None,
            heartbeat_every_s: None,
        }
    }

    fn timing(heartbeat_ms: u64, expiry_ms: u64) -> LeaseTiming {
        LeaseTiming {
            heartbeat: Duration::from_millis(heartbeat_ms),
            expiry: Duration::from_millis(expiry_ms),
        }
    }

    #[test]
    fn a_live_holder_beats_and_is_never_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.lock");
        let t = timing(100, 1500);
        let _first = match try_acquire_with(&p, &holder("a"), t).unwrap() {
            LeaseAttempt::Acquired(l) => l,
            LeaseAttempt::Busy(_) => panic!("first attempt must succeed"),
        };
        let beat0 = read_holder(&p).unwrap().heartbeat.unwrap();
        std::thread::sleep(Duration::from_millis(2600));
        let beat1 = read_holder(&p).unwrap().heartbeat.unwrap();
        assert!(beat1 > beat0, "the heartbeat advances: {beat0} → {beat1}");
        // Longer than the expiry since it was taken, but it kept beating: busy.
        match try_acquire_with(&p, &holder("b"), t).unwrap() {
            LeaseAttempt::Busy(Some(h)) => assert_eq!(h.run_id, "a"),
            other => panic!("expected busy, got {other:?}"),
        }
    }

    #[test]
    fn a_held_lock_without_heartbeats_is_taken_over_after_the_expiry() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.lock");
        // A holder whose heartbeat stopped (its thread gone, as on a crashed NFS client whose
        // lock the server still holds): its record's last beat is 100 s old.
        let stuck =
            match try_acquire_with(&p, &holder("dead"), timing(3_600_000, 3_600_000)).unwrap() {
                LeaseAttempt::Acquired(l) => l,
                LeaseAttempt::Busy(_) => panic!("first attempt must succeed"),
            };
        let mut rec = read_holder(&p).unwrap();
        rec.heartbeat = Some(unix_now() - 100);
        rec.heartbeat_every_s = Some(1.0);
        fs_err::write(&p, serde_json::to_vec(&rec).unwrap()).unwrap();
        // Within the expiry: busy. Past it: taken over, the old file set aside.
        assert!(matches!(
            try_acquire_with(&p, &holder("b"), timing(1000, 200_000)).unwrap(),
            LeaseAttempt::Busy(Some(_))
        ));
        let new = match try_acquire_with(&p, &holder("b"), timing(1000, 10_000)).unwrap() {
            LeaseAttempt::Acquired(l) => l,
            other => panic!("expected a takeover, got {other:?}"),
        };
        assert_eq!(read_holder(&p).unwrap().run_id, "b");
        let aside = fs_err::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains(".lock.stale-"))
            .count();
        assert_eq!(aside, 1);
        // A third process finds the new holder alive.
        assert!(matches!(
            try_acquire_with(&p, &holder("c"), timing(1000, 10_000)).unwrap(),
            LeaseAttempt::Busy(Some(h)) if h.run_id == "b"
        ));
        drop(new);
        drop(stuck);
    }

    #[test]
    fn a_held_lock_with_an_unreadable_record_expires_by_its_files_age() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.lock");
        // A holder (its own open file description, as another process's) whose record is
        // garbage and whose beats stopped.
        let stuck =
            match try_acquire_with(&p, &holder("dead"), timing(3_600_000, 3_600_000)).unwrap() {
                LeaseAttempt::Acquired(l) => l,
                LeaseAttempt::Busy(_) => panic!("first attempt must succeed"),
            };
        fs_err::write(&p, b"\x00garbage{").unwrap();
        assert_eq!(read_holder(&p), None);
        // Fresh garbage: busy, whatever the expiry says of records.
        assert!(matches!(
            try_acquire_with(&p, &holder("b"), timing(100, 1_000)).unwrap(),
            LeaseAttempt::Busy(None)
        ));
        // Untouched past the expiry: taken over.
        std::thread::sleep(Duration::from_millis(1_300));
        let new = match try_acquire_with(&p, &holder("b"), timing(100, 1_000)).unwrap() {
            LeaseAttempt::Acquired(l) => l,
            other => panic!("expected a takeover, got {other:?}"),
        };
        assert_eq!(read_holder(&p).unwrap().run_id, "b");
        drop(new);
        drop(stuck);
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
        fs_err::write(&p, serde_json::to_vec(&holder("dead")).unwrap()).unwrap();
        assert_eq!(holder_now(&p), None);
        assert_eq!(holder_now(&dir.path().join("absent.lock")), None);
    }
}
