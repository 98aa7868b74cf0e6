//! The job book: what an executor that hands nodes to a batch system (Slurm) remembers of the
//! jobs it submitted, one record per node recipe in the store's `jobs/`. Records are written
//! like every file of the store (temp file, fsync, rename, fsync of the folder) and only under
//! the book's lock (`jobs/submit.lock`, an `flock` taken as leases take theirs), which one
//! driver holds while it decides what to submit: a node queued or running is never submitted
//! twice. What a record says is the executor's business; the book stores its bytes.

use std::fs::File;
use std::path::PathBuf;

use crate::error::EngineError;
use crate::fsutil::atomic_write;
use crate::store::{Store, StoreError};

/// The job records of a store.
pub struct JobBook<'a> {
    store: &'a Store,
}

/// The book's lock, held while it lives: the proof [`JobBook::write`] and
/// [`JobBook::remove`] ask for.
pub struct JobsLock {
    _file: File,
}

impl Store {
    /// The records of the jobs submitted against this store.
    pub fn jobs(&self) -> JobBook<'_> {
        JobBook { store: self }
    }
}

impl JobBook<'_> {
    fn dir(&self) -> PathBuf {
        self.store.root().join("jobs")
    }

    /// Where jobs write their logs (created when the lock is first taken).
    pub fn log_dir(&self) -> PathBuf {
        self.dir().join("logs")
    }

    /// Whether jobs were ever submitted against this store.
    pub fn any(&self) -> bool {
        self.dir().is_dir()
    }

    /// The file of record `name` (a node recipe: letters, digits, `-` and `_` only).
    fn path(&self, name: &str) -> Result<PathBuf, EngineError> {
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(EngineError::Internal(format!(
                "job record name `{name}` is not a recipe"
            )));
        }
        Ok(self.dir().join(format!("{name}.json")))
    }

    /// Take the book's lock, waiting while another process holds it.
    pub fn lock(&self) -> Result<JobsLock, EngineError> {
        let logs = self.log_dir();
        self.store.ensure_dir(&logs)?;
        let file = crate::lease::lock_waiting(&self.dir().join("submit.lock"))?;
        Ok(JobsLock { _file: file })
    }

    /// Record `name`'s bytes, if there is such a record.
    pub fn read(&self, name: &str) -> Result<Option<Vec<u8>>, EngineError> {
        let path = self.path(name)?;
        match fs_err::read(&path) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(StoreError::Io { path, source }.into()),
        }
    }

    /// Write record `name` durably, replacing any before it.
    pub fn write(&self, _lock: &JobsLock, name: &str, bytes: &[u8]) -> Result<(), EngineError> {
        let path = self.path(name)?;
        atomic_write(
            &self.store.root().join("tmp"),
            &path,
            bytes,
            self.store.mode(),
        )
        .map_err(|source| StoreError::Io { path, source }.into())
    }

    /// Remove record `name` (absent is fine).
    pub fn remove(&self, _lock: &JobsLock, name: &str) -> Result<(), EngineError> {
        let path = self.path(name)?;
        match fs_err::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(StoreError::Io { path, source }.into()),
        }
    }

    /// Every record's bytes, by name (records that cannot be read are left out).
    pub fn list(&self) -> Vec<(String, Vec<u8>)> {
        let Ok(dir) = fs_err::read_dir(self.dir()) else {
            return vec![];
        };
        let mut out: Vec<(String, Vec<u8>)> = dir
            .flatten()
            .filter_map(|e| {
                let path = e.path();
                let name = path
                    .file_name()?
                    .to_str()?
                    .strip_suffix(".json")?
                    .to_string();
                Some((name, fs_err::read(&path).ok()?))
            })
            .collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::channel;
    use std::time::Duration;

    use super::*;

    #[test]
    fn records_are_written_read_listed_and_removed_under_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_or_create(dir.path(), false).unwrap();
        let book = store.jobs();
        assert!(!book.any());
        assert_eq!(book.read("ab12").unwrap(), None);
        let lock = book.lock().unwrap();
        assert!(book.any() && book.log_dir().is_dir());
        book.write(&lock, "ab12", b"first").unwrap();
        book.write(&lock, "ab12", b"second").unwrap();
        book.write(&lock, "cd34", b"other").unwrap();
        assert_eq!(book.read("ab12").unwrap().as_deref(), Some(&b"second"[..]));
        let names: Vec<String> = book.list().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["ab12", "cd34"]);
        book.remove(&lock, "ab12").unwrap();
        book.remove(&lock, "ab12").unwrap();
        assert_eq!(book.read("ab12").unwrap(), None);
        // No temp file is left beside the records.
        assert_eq!(book.list().len(), 1);
        for bad in ["", "../escape", "a/b", "x.json"] {
            assert!(book.write(&lock, bad, b"x").is_err(), "`{bad}`");
        }
    }

    #[test]
    fn a_second_taker_of_the_lock_waits_for_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_or_create(dir.path(), false).unwrap();
        let first = store.jobs().lock().unwrap();
        let (tx, rx) = channel();
        let other = store.clone();
        let waiter = std::thread::spawn(move || {
            let lock = other.jobs().lock().unwrap();
            tx.send(()).unwrap();
            drop(lock);
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "the lock was taken twice"
        );
        drop(first);
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the waiter takes the lock once it is free");
        waiter.join().unwrap();
    }
}
