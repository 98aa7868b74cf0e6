//! The remote cache: a second store in a bucket (S3, GCS, Azure, a folder) that runs on other
//! machines consult before computing a node and fill after computing one.
//!
//! Layout under the remote's prefix (the local store's, less what is local to a machine):
//! ```text
//! objects/ab/cdef…           object bytes, name = blake3 of the bytes
//! nodes/ab/cdef….json        sealed manifest of node key abcdef…
//! ```
//! Nothing from the remote is taken on its word: a manifest is used only when it is filed under
//! the key its key material hashes to, its seal holds, and its signature verifies under a key
//! the remote's trust policy names ([`crate::trust`]; or the policy trusts every writer, an
//! explicit choice); every object is checked against the digest and size the manifest gives,
//! and read no further than that size, before it enters the local store. A corrupt or missing
//! object is refused, reported once, and the node computed locally (its upload then replaces
//! what was corrupt). Keys under the prefix that are not upcc's are skipped and reported. Uploads write the objects first and the manifest last, created only if
//! absent, so a reader never sees a manifest whose objects are missing, and two machines that
//! computed the same key never serve a mix. A remote that cannot be reached is reported once and
//! then left alone for the rest of the process: work goes on locally.
//!
//! The engine knows no cloud: a [`Bucket`] gives it blocking get/put/list/delete on paths,
//! implemented here for folders ([`DirBucket`], which never follows a link) and by the CLI on
//! the Arrow project's `object_store` for S3, GCS and Azure.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use std::sync::Arc;

use crate::digest::{Artifact, Digest, NodeKeyTag};
use crate::store::{GcReport, Manifest, OutputRecord, Store, StoreError};
use crate::trust::Trust;

/// The largest manifest read from a remote (a real one is a few KiB).
const MANIFEST_CAP: u64 = 16 << 20;

/// A transport or server failure (not "not found"): the remote is treated as unreachable.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BucketError(pub String);

/// How a put treats an existing object at the path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutMode {
    /// Write only if nothing is there (a conditional create).
    Create,
    /// Replace whatever is there.
    Overwrite,
}

/// What a put did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Put {
    Written,
    /// [`PutMode::Create`] found something there; nothing was written.
    AlreadyExists,
}

/// What a get found.
#[derive(Debug, PartialEq, Eq)]
pub enum Got {
    Absent,
    Bytes(Vec<u8>),
    /// The object is larger than the caller allowed (its size, as far as known): nothing more
    /// than the cap was read.
    TooLarge(u64),
}

/// A listing: the objects, and the entries under the prefix that were skipped (keys the
/// client cannot represent, links, folders where objects belong), for a report.
#[derive(Clone, Debug, Default)]
pub struct Listing {
    pub entries: Vec<Listed>,
    pub skipped: Vec<String>,
}

/// One listed object.
#[derive(Clone, Debug)]
pub struct Listed {
    /// Path relative to the bucket's prefix (`objects/ab/cdef…`).
    pub path: String,
    pub bytes: u64,
    pub modified: SystemTime,
}

/// Blocking object-store operations on paths relative to the remote's prefix. Every write
/// is atomic (a reader sees the whole object or none).
pub trait Bucket: Send + Sync {
    /// The remote's URL, for messages.
    fn describe(&self) -> String;
    /// The object's bytes, reading at most `max_bytes` (a larger object is [`Got::TooLarge`],
    /// told by its stated size before its body where the protocol allows).
    fn get(&self, path: &str, max_bytes: u64) -> Result<Got, BucketError>;
    /// The object's size, `None` if absent.
    fn head(&self, path: &str) -> Result<Option<u64>, BucketError>;
    fn put(&self, path: &str, bytes: &[u8], mode: PutMode) -> Result<Put, BucketError>;
    /// Every object under `prefix` (`objects/`, `nodes/`). An entry the bucket cannot list
    /// as an object (a key with an empty or `..` segment, a link) is skipped and named in
    /// [`Listing::skipped`], never a reason to fail the listing.
    fn list(&self, prefix: &str) -> Result<Listing, BucketError>;
    /// Delete an object (absent is not an error).
    fn delete(&self, path: &str) -> Result<(), BucketError>;
}

/// What one process did with the remote.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RemoteStats {
    pub nodes_downloaded: usize,
    pub objects_downloaded: usize,
    pub bytes_downloaded: u64,
    pub nodes_uploaded: usize,
    pub objects_uploaded: usize,
    pub bytes_uploaded: u64,
    /// Manifests or objects found corrupt or incomplete on the remote and refused.
    pub refused: usize,
    /// Intact results not served because the remote's trust policy does not vouch for their
    /// signer (unsigned, signed by a key not trusted, or a signature that does not verify).
    pub untrusted: usize,
}

/// What uploading one node did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Uploaded {
    /// The manifest is now on the remote (written by this call).
    Published,
    /// The remote already held a valid manifest for the key (another machine's).
    AlreadyThere,
    /// Nothing uploaded: the remote is unreachable.
    Unreachable,
}

/// The remote cache of a process: a [`Bucket`] plus what this process learnt about it.
pub struct RemoteCache {
    bucket: Box<dyn Bucket>,
    /// Set once the remote failed: why. Nothing more is asked of it.
    down: Mutex<Option<String>>,
    /// Paths found corrupt or incomplete: replaced (not created) when uploaded.
    corrupt: Mutex<BTreeSet<String>>,
    stats: Mutex<RemoteStats>,
    /// The keys the remote listed, once [`RemoteCache::planning_manifest`] asked: planning a
    /// large spec costs one listing per 1,000 results instead of one request per node.
    index: Mutex<Option<BTreeSet<Digest<NodeKeyTag>>>>,
    /// Manifests already fetched and checked (a key's manifest never changes): the plan before
    /// a run and the download that follows read each once.
    checked: Mutex<std::collections::HashMap<Digest<NodeKeyTag>, Manifest>>,
    /// Print warnings on stderr (off for `--json` callers that report them otherwise).
    warn_on_stderr: bool,
    warnings: Mutex<Vec<String>>,
    /// Whose results the remote serves.
    trust: Arc<Trust>,
    /// Whether the skipped entries of a listing were reported (once per process).
    skipped_reported: Mutex<bool>,
    /// Keys whose remote result was not trusted (counted once each).
    untrusted: Mutex<BTreeSet<Digest<NodeKeyTag>>>,
    /// Objects being downloaded now (by a node's fetch or the prefetch): one download each;
    /// another asker waits for it.
    in_flight: Mutex<BTreeSet<Digest<Artifact>>>,
    landed: std::sync::Condvar,
    /// Objects the prefetch downloaded (counted for the node that uses them).
    prefetched: Mutex<BTreeSet<Digest<Artifact>>>,
}

/// How many downloads from a remote run at once (nodes, or the objects of a prefetch).
pub const DOWNLOADS_AT_ONCE: usize = 8;

/// Downloads started by [`RemoteCache::prefetch`]: [`Prefetch::finish`] stops what has not
/// started and waits for what has.
pub struct Prefetch {
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for Prefetch {
    /// Dropped unfinished (a run that ended in an error): nothing more starts.
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Prefetch {
    pub fn finish(mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for RemoteCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RemoteCache({})", self.bucket.describe())
    }
}

/// Path of an object on the remote.
pub fn object_path(digest: &Digest<Artifact>) -> String {
    let h = digest.to_hex();
    format!("objects/{}/{}", &h[..2], &h[2..])
}

/// Path of a manifest on the remote.
pub fn manifest_path(key: &Digest<NodeKeyTag>) -> String {
    let h = key.to_hex();
    format!("nodes/{}/{}.json", &h[..2], &h[2..])
}

/// The digest a remote path names (`objects/ab/cd…` or `nodes/ab/cd….json`).
fn digest_of_path<T>(path: &str, dir: &str, ext: &str) -> Option<Digest<T>> {
    let rest = path.strip_prefix(dir)?.strip_prefix('/')?;
    let (a, b) = rest.split_once('/')?;
    let b = b.strip_suffix(ext)?;
    format!("{a}{b}").parse().ok()
}

fn mutex<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RemoteCache {
    pub fn new(bucket: Box<dyn Bucket>, warn_on_stderr: bool, trust: Arc<Trust>) -> Self {
        RemoteCache {
            bucket,
            down: Mutex::new(None),
            corrupt: Mutex::new(BTreeSet::new()),
            stats: Mutex::new(RemoteStats::default()),
            index: Mutex::new(None),
            checked: Mutex::new(std::collections::HashMap::new()),
            warn_on_stderr,
            warnings: Mutex::new(Vec::new()),
            trust,
            skipped_reported: Mutex::new(false),
            untrusted: Mutex::new(BTreeSet::new()),
            in_flight: Mutex::new(BTreeSet::new()),
            landed: std::sync::Condvar::new(),
            prefetched: Mutex::new(BTreeSet::new()),
        }
    }

    /// A listing of `prefix`, its skipped entries reported once per process.
    fn list(&self, prefix: &str) -> Result<Vec<Listed>, BucketError> {
        let listing = self.bucket.list(prefix)?;
        self.report_skipped(&listing.skipped);
        Ok(listing.entries)
    }

    fn report_skipped(&self, skipped: &[String]) {
        if skipped.is_empty() || std::mem::replace(&mut *mutex(&self.skipped_reported), true) {
            return;
        }
        let shown: Vec<&str> = skipped.iter().take(3).map(String::as_str).collect();
        self.warn(format!(
            "remote `{}` holds {} entr{} that {} not upcc's ({}{}); skipped (never read, never deleted)",
            self.describe(),
            skipped.len(),
            if skipped.len() == 1 { "y" } else { "ies" },
            if skipped.len() == 1 { "is" } else { "are" },
            shown.join(", "),
            if skipped.len() > 3 { ", …" } else { "" }
        ));
    }

    pub fn describe(&self) -> String {
        self.bucket.describe()
    }

    /// Where a remote result refused by the local store's policy was found, for its warning
    /// (the same words as a refusal by the remote's own policy: the fix is the same).
    fn for_local_policy(&self) -> String {
        format!("remote `{}`", self.describe())
    }

    pub fn stats(&self) -> RemoteStats {
        mutex(&self.stats).clone()
    }

    /// The warnings given so far.
    pub fn warnings(&self) -> Vec<String> {
        mutex(&self.warnings).clone()
    }

    /// Why the remote is not used any more, once it failed.
    pub fn unreachable(&self) -> Option<String> {
        mutex(&self.down).clone()
    }

    fn warn(&self, message: String) {
        if self.warn_on_stderr {
            eprintln!("upcc: warning: {message}");
        }
        mutex(&self.warnings).push(message);
    }

    /// The remote failed: say so once, and ask nothing more of it.
    fn lost(&self, e: &BucketError) {
        let mut down = mutex(&self.down);
        if down.is_none() {
            *down = Some(e.0.clone());
            drop(down);
            self.warn(format!(
                "remote `{}` cannot be used ({}); computing locally and not uploading for the rest of this command (`upcc push` uploads later)",
                self.describe(),
                e.0
            ));
        }
    }

    fn is_down(&self) -> bool {
        mutex(&self.down).is_some()
    }

    /// A manifest or object found corrupt: replaced when this process uploads; reported once
    /// (a plan and the run after it both ask).
    fn refused(&self, path: String, message: String) {
        if mutex(&self.corrupt).insert(path) {
            mutex(&self.stats).refused += 1;
            self.warn(message);
        }
    }

    /// The remote's manifest of `key`, checked (filed under the key its material hashes to,
    /// seal intact), without its objects. `None` when absent, unusable or unreachable.
    pub fn manifest(&self, key: &Digest<NodeKeyTag>) -> Option<Manifest> {
        if self.is_down() {
            return None;
        }
        if let Some(m) = mutex(&self.checked).get(key) {
            return Some(m.clone());
        }
        let path = manifest_path(key);
        let bytes = match self.bucket.get(&path, MANIFEST_CAP) {
            Ok(Got::Bytes(b)) => b,
            Ok(Got::Absent) => return None,
            Ok(Got::TooLarge(n)) => {
                self.refused(
                    path,
                    format!(
                        "remote result {} refused (its manifest is {n} bytes, more than any manifest); it is computed locally and replaced on the remote",
                        key.short()
                    ),
                );
                return None;
            }
            Err(e) => {
                self.lost(&e);
                return None;
            }
        };
        let why = match serde_json::from_slice::<Manifest>(&bytes) {
            Err(e) => format!("unreadable: {e}"),
            Ok(m) if m.key != *key => format!("it records key {} instead", m.key.short()),
            Ok(m) if !m.seal_holds() || m.seal.is_none() => {
                "its outputs are not the ones it was sealed with".to_string()
            }
            Ok(m) if m.material.digest().ok() != Some(*key) => {
                "its key material does not hash to its key".to_string()
            }
            Ok(m) => match self.trust.check(&m) {
                Ok(()) => {
                    mutex(&self.checked).insert(*key, m.clone());
                    return Some(m);
                }
                Err(why) => {
                    let place = format!("remote `{}`", self.describe());
                    let warning = self.trust.refusal_warning(&place, &why);
                    // A forged or unsigned result is replaced by this machine's upload; one
                    // honestly signed by a key this reader does not know is left to those who
                    // trust it.
                    if why.is_forged() {
                        mutex(&self.corrupt).insert(path);
                    }
                    if mutex(&self.untrusted).insert(*key) {
                        mutex(&self.stats).untrusted += 1;
                    }
                    if let Some(w) = warning {
                        self.warn(w);
                    }
                    return None;
                }
            },
        };
        self.refused(
            path,
            format!(
                "remote result {} refused ({why}); it is computed locally and replaced on the remote",
                key.short()
            ),
        );
        None
    }

    /// [`RemoteCache::manifest`] for planning (`status`, `pull`, `gc`): the remote's keys are
    /// listed once per process and only listed keys are fetched. A result uploaded after the
    /// listing is not seen by this plan (a run still asks for each node before computing it).
    pub fn planning_manifest(&self, key: &Digest<NodeKeyTag>) -> Option<Manifest> {
        if self.is_down() {
            return None;
        }
        let mut index = mutex(&self.index);
        if index.is_none() {
            match self.list_keys() {
                Ok(keys) => *index = Some(keys.into_iter().collect()),
                Err(e) => {
                    drop(index);
                    self.lost(&e);
                    return None;
                }
            }
        }
        let listed = index.as_ref().is_some_and(|i| i.contains(key));
        drop(index);
        if listed {
            self.manifest(key)
        } else {
            None
        }
    }

    /// Download node `key` into `store` if the remote holds it whole and intact: its manifest,
    /// then each object the store lacks, checked against its digest and size, then the
    /// manifest published locally (last, as a computed node's is). `Ok(None)` when the remote
    /// cannot answer (absent, refused, unreachable); nothing half-downloaded is ever served.
    pub fn fetch(
        &self,
        store: &Store,
        key: &Digest<NodeKeyTag>,
    ) -> Result<Option<Manifest>, StoreError> {
        let Some(m) = self.manifest(key) else {
            return Ok(None);
        };
        // A result the local store would not serve is not worth downloading.
        if !store.trusts_from(&m, &self.for_local_policy()) {
            return Ok(None);
        }
        let (mut objects, mut bytes_in) = (0usize, 0u64);
        for (name, o) in &m.outputs {
            match self.object(store, key, name, o, false)? {
                Some(true) => {
                    objects += 1;
                    bytes_in += o.bytes;
                }
                Some(false) => {}
                None => return Ok(None),
            }
        }
        store.write_downloaded_manifest(&m)?;
        let p = &m.provenance;
        store.write_log(
            key,
            &format!(
                "downloaded from {} ({objects} objects, {bytes_in} bytes); computed by {} on {} (run {}, {:.1} s, finished {})\n",
                self.describe(),
                p.user.as_deref().unwrap_or("?"),
                p.host,
                p.run_id,
                p.duration_s,
                p.finished_at
            ),
        )?;
        mutex(&self.stats).nodes_downloaded += 1;
        Ok(Some(m))
    }

    /// Make output `name` (object `o`) of remote result `key` present in `store`: `Some(true)`
    /// when this process downloaded it (now or in its prefetch), `Some(false)` when the store
    /// held it, `None` when the remote cannot give it (refused and reported, or unreachable).
    /// One download per object at a time: a second asker waits for the first.
    fn object(
        &self,
        store: &Store,
        key: &Digest<NodeKeyTag>,
        name: &str,
        o: &OutputRecord,
        prefetch: bool,
    ) -> Result<Option<bool>, StoreError> {
        let mut flying = mutex(&self.in_flight);
        while flying.contains(&o.digest) {
            flying = self.landed.wait(flying).unwrap_or_else(|p| p.into_inner());
        }
        if store.has_object(&o.digest, o.bytes) {
            return Ok(Some(mutex(&self.prefetched).contains(&o.digest)));
        }
        if self.is_down() {
            return Ok(None);
        }
        flying.insert(o.digest);
        drop(flying);
        let got = self.download(store, key, name, o);
        if prefetch && matches!(got, Ok(true)) {
            mutex(&self.prefetched).insert(o.digest);
        }
        mutex(&self.in_flight).remove(&o.digest);
        self.landed.notify_all();
        let got = got?;
        if got {
            let mut s = mutex(&self.stats);
            s.objects_downloaded += 1;
            s.bytes_downloaded += o.bytes;
        }
        Ok(got.then_some(true))
    }

    /// Download object `o` into `store`, checked against its digest and size: whether it is
    /// there now (a refusal is reported).
    fn download(
        &self,
        store: &Store,
        key: &Digest<NodeKeyTag>,
        name: &str,
        o: &OutputRecord,
    ) -> Result<bool, StoreError> {
        let path = object_path(&o.digest);
        let bytes = match self.bucket.get(&path, o.bytes) {
            Ok(Got::Bytes(b)) => b,
            Ok(Got::TooLarge(n)) => {
                self.refused(
                    path,
                    format!(
                        "remote object {} (output `{name}` of {}) is {n} bytes where {} were expected; refused without reading it, the node is computed locally and the object replaced on the remote",
                        o.digest.short(),
                        key.short(),
                        o.bytes
                    ),
                );
                return Ok(false);
            }
            Ok(Got::Absent) => {
                self.refused(
                    path,
                    format!(
                        "remote result {} lists object {} (output `{name}`), which the remote does not hold; the node is computed locally",
                        key.short(),
                        o.digest.short()
                    ),
                );
                return Ok(false);
            }
            Err(e) => {
                self.lost(&e);
                return Ok(false);
            }
        };
        let actual = Digest::<Artifact>::of_bytes(&bytes);
        if actual != o.digest || bytes.len() as u64 != o.bytes {
            self.refused(
                path,
                format!(
                    "remote object {} (output `{name}` of {}) is corrupt: {} bytes hashing to {}, expected {} bytes hashing to {}; refused, the node is computed locally and the object replaced on the remote",
                    o.digest.short(),
                    key.short(),
                    bytes.len(),
                    actual.short(),
                    o.bytes,
                    o.digest.short()
                ),
            );
            return Ok(false);
        }
        store.put_object(&bytes)?;
        Ok(true)
    }

    /// Start downloading, in the background and `at_once` at a time, the objects of the
    /// remote results `keys` that `store` would serve and lacks: the objects of a chain of
    /// results come down together instead of one node after another. A node's own fetch
    /// then finds them here (or waits for the one in flight); a failure here only means the
    /// fetch tries (and reports) again.
    pub fn prefetch(
        self: &Arc<Self>,
        store: &Store,
        keys: &[Digest<NodeKeyTag>],
        at_once: usize,
    ) -> Prefetch {
        let mut seen = BTreeSet::new();
        let mut queue = std::collections::VecDeque::new();
        for key in keys {
            let Some(m) = self.manifest(key) else {
                continue;
            };
            if !store.trusts_from(&m, &self.for_local_policy()) {
                continue;
            }
            for (name, o) in &m.outputs {
                if seen.insert(o.digest) && !store.has_object(&o.digest, o.bytes) {
                    queue.push_back((*key, name.clone(), o.clone()));
                }
            }
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let queue = Arc::new(Mutex::new(queue));
        let threads = (0..at_once.min(mutex(&queue).len()))
            .filter_map(|t| {
                let (me, store, queue, stop) =
                    (self.clone(), store.clone(), queue.clone(), stop.clone());
                let span = tracing::Span::current();
                std::thread::Builder::new()
                    .name(format!("upcc-prefetch-{t}"))
                    .spawn(move || {
                        let _span = span.entered();
                        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                            let Some((key, name, o)) = mutex(&queue).pop_front() else {
                                return;
                            };
                            match me.object(&store, &key, &name, &o, true) {
                                Ok(_) => {}
                                Err(e) => {
                                    tracing::debug!("prefetch of {} failed: {e}", o.digest.short());
                                    return;
                                }
                            }
                        }
                    })
                    .ok()
            })
            .collect();
        Prefetch { stop, threads }
    }

    /// Upload node `m.key` (published in `store`): every object the remote lacks (or holds corrupt), then
    /// the manifest, created only if the remote has none for the key. An object the remote
    /// already held is checked again after the manifest is published: a `gc --remote` that
    /// deleted it meanwhile (it was old and no result it had listed used it) is undone by
    /// uploading it again.
    pub fn upload(&self, store: &Store, m: &Manifest) -> Result<Uploaded, StoreError> {
        if self.is_down() {
            return Ok(Uploaded::Unreachable);
        }
        let key = &m.key;
        // Objects and bytes this call wrote.
        let mut sent = (0usize, 0u64);
        let mut already_there = Vec::new();
        for o in m.outputs.values() {
            let path = object_path(&o.digest);
            let known_bad = mutex(&self.corrupt).contains(&path);
            let mode = if known_bad {
                PutMode::Overwrite
            } else {
                match self.bucket.head(&path) {
                    Ok(Some(n)) if n == o.bytes => {
                        already_there.push(o);
                        continue;
                    }
                    // Present with another size: truncated or wrong, replace it.
                    Ok(Some(_)) => PutMode::Overwrite,
                    Ok(None) => PutMode::Create,
                    Err(e) => {
                        self.lost(&e);
                        return Ok(Uploaded::Unreachable);
                    }
                }
            };
            if let Err(e) = self.put_object(store, &o.digest, mode, &mut sent) {
                return e.map_or(Ok(Uploaded::Unreachable), Err);
            }
        }
        let path = manifest_path(key);
        let mut sealed = m.clone();
        sealed.seal = Some(Manifest::seal_of(&m.key, &m.outputs));
        let json = serde_json::to_vec_pretty(&sealed).expect("manifest serialises");
        let mode = if mutex(&self.corrupt).contains(&path) {
            PutMode::Overwrite
        } else {
            PutMode::Create
        };
        let done = match self.bucket.put(&path, &json, mode) {
            Ok(Put::Written) => {
                mutex(&self.corrupt).remove(&path);
                Uploaded::Published
            }
            Ok(Put::AlreadyExists) => Uploaded::AlreadyThere,
            Err(e) => {
                self.lost(&e);
                return Ok(Uploaded::Unreachable);
            }
        };
        if done == Uploaded::Published {
            for o in already_there {
                match self.bucket.head(&object_path(&o.digest)) {
                    Ok(Some(n)) if n == o.bytes => {}
                    Ok(_) => {
                        if let Err(e) =
                            self.put_object(store, &o.digest, PutMode::Overwrite, &mut sent)
                        {
                            return e.map_or(Ok(Uploaded::Unreachable), Err);
                        }
                    }
                    Err(e) => {
                        self.lost(&e);
                        return Ok(Uploaded::Unreachable);
                    }
                }
            }
        }
        // The listing this process planned with holds the key now (a later plan sees it).
        if let Some(index) = mutex(&self.index).as_mut() {
            index.insert(*key);
        }
        let mut s = mutex(&self.stats);
        s.objects_uploaded += sent.0;
        s.bytes_uploaded += sent.1;
        if done == Uploaded::Published {
            s.nodes_uploaded += 1;
        }
        Ok(done)
    }

    /// Put one object of `store`, counting it in `sent` (objects, bytes) if written (not if
    /// another machine's copy was there). `Err(None)`: the remote failed (reported);
    /// `Err(Some(_))`: the local store failed.
    fn put_object(
        &self,
        store: &Store,
        digest: &Digest<Artifact>,
        mode: PutMode,
        sent: &mut (usize, u64),
    ) -> Result<(), Option<StoreError>> {
        let path = object_path(digest);
        let bytes = store.read_object(digest).map_err(Some)?;
        match self.bucket.put(&path, &bytes, mode) {
            Ok(Put::Written) => {
                mutex(&self.corrupt).remove(&path);
                sent.0 += 1;
                sent.1 += bytes.len() as u64;
                Ok(())
            }
            // Another machine uploaded the same content-addressed object meanwhile.
            Ok(Put::AlreadyExists) => Ok(()),
            Err(e) => {
                self.lost(&e);
                Err(None)
            }
        }
    }

    /// The objects listed by the intact manifests at `paths`.
    fn objects_of(&self, paths: &[&Listed]) -> Result<BTreeSet<Digest<Artifact>>, BucketError> {
        let mut live = BTreeSet::new();
        for l in paths {
            if let Got::Bytes(bytes) = self.bucket.get(&l.path, MANIFEST_CAP)? {
                if let Ok(m) = serde_json::from_slice::<Manifest>(&bytes) {
                    live.extend(m.outputs.values().map(|o| o.digest));
                }
            }
        }
        Ok(live)
    }

    /// Delete from the remote the manifests not in `keep` and the objects no kept manifest
    /// lists; anything written within `grace` is kept (an upload in flight has written its
    /// objects before its manifest). Only names that parse as upcc's (a digest, a key) are
    /// ever deleted; anything else under the prefix is skipped and reported. Manifests go
    /// first; before objects are deleted the manifests are listed again, so the objects of a
    /// result published meanwhile stay; after, once more, and a result published during the
    /// deletions that lists a deleted object loses its manifest too (its uploader puts the
    /// object back if it is still running; otherwise the node is recomputed when asked), so no
    /// manifest is left listing a missing object. `Err` when the remote cannot be listed or a
    /// deletion fails.
    pub fn gc(
        &self,
        keep: &BTreeSet<Digest<NodeKeyTag>>,
        grace: Duration,
        dry_run: bool,
    ) -> Result<GcReport, BucketError> {
        let mut report = GcReport::default();
        let now = SystemTime::now();
        let recent = |l: &Listed| now.duration_since(l.modified).unwrap_or_default() < grace;
        let listed = |prefix: &str, report: &mut GcReport| -> Result<Vec<Listed>, BucketError> {
            let listing = self.bucket.list(prefix)?;
            self.report_skipped(&listing.skipped);
            report.skipped.extend(listing.skipped);
            Ok(listing.entries)
        };
        let first = listed("nodes", &mut report)?;
        let mut kept_manifests: Vec<&Listed> = Vec::new();
        let mut seen: BTreeSet<String> = BTreeSet::new();
        for l in &first {
            let Some(key) = digest_of_path::<NodeKeyTag>(&l.path, "nodes", ".json") else {
                report.skipped.push(l.path.clone());
                continue;
            };
            seen.insert(l.path.clone());
            if keep.contains(&key) || recent(l) {
                if !keep.contains(&key) {
                    report.kept_because_recent += 1;
                }
                report.manifests_kept += 1;
                // The objects of a kept manifest stay, readable or not (an unreadable one
                // keeps none; its node is recomputed and re-uploaded when asked).
                kept_manifests.push(l);
                continue;
            }
            report.manifests_deleted += 1;
            if !dry_run {
                self.bucket.delete(&l.path)?;
            }
        }
        let mut live = self.objects_of(&kept_manifests)?;
        let objects = listed("objects", &mut report)?;
        if !dry_run {
            // Results published since the first listing keep their objects.
            let newer = self.list("nodes")?;
            let fresh: Vec<&Listed> = newer.iter().filter(|l| !seen.contains(&l.path)).collect();
            live.extend(self.objects_of(&fresh)?);
        }
        let mut deleted: BTreeSet<Digest<Artifact>> = BTreeSet::new();
        for l in &objects {
            let Some(d) = digest_of_path::<Artifact>(&l.path, "objects", "") else {
                report.skipped.push(l.path.clone());
                continue;
            };
            if live.contains(&d) || recent(l) {
                report.objects_kept += 1;
                continue;
            }
            report.objects_deleted += 1;
            report.bytes_freed += l.bytes;
            if !dry_run {
                self.bucket.delete(&l.path)?;
                deleted.insert(d);
            }
        }
        if !deleted.is_empty() {
            for l in self.list("nodes")? {
                if seen.contains(&l.path)
                    || digest_of_path::<NodeKeyTag>(&l.path, "nodes", ".json").is_none()
                {
                    continue;
                }
                let mut gone = false;
                for d in self.objects_of(&[&l])?.intersection(&deleted) {
                    // Its uploader may have put the object back already.
                    gone |= self.bucket.head(&object_path(d))?.is_none();
                }
                if gone {
                    self.bucket.delete(&l.path)?;
                    report.manifests_deleted += 1;
                    report.raced_results_removed += 1;
                }
            }
        }
        // A stray key can be reported by the listing and again by the name check.
        report.skipped.sort();
        report.skipped.dedup();
        Ok(report)
    }

    /// Every manifest key the remote lists.
    pub fn list_keys(&self) -> Result<Vec<Digest<NodeKeyTag>>, BucketError> {
        Ok(self
            .list("nodes")?
            .iter()
            .filter_map(|l| digest_of_path(&l.path, "nodes", ".json"))
            .collect())
    }
}

/// A [`Bucket`] in a local folder: `file://` remotes (a team folder on a cluster filesystem).
/// It never follows a link: a listing reports links, FIFOs and other non-regular entries as
/// skipped, reads open regular files only (`O_NOFOLLOW`), and a delete removes a regular file
/// or nothing. Writes are atomic (a temp file in `.upcc-tmp/` renamed, or linked for a
/// create-if-absent). In a folder that is group-writable, folders it makes are group-writable
/// and group-inheriting (2775) and files 0664, whatever the umask.
pub struct DirBucket {
    root: std::path::PathBuf,
    shared: bool,
}

impl DirBucket {
    /// The bucket at folder `root` (created if absent).
    pub fn new(root: &std::path::Path) -> Result<Self, BucketError> {
        use std::os::unix::fs::PermissionsExt;
        fs_err::create_dir_all(root).map_err(|e| BucketError(e.to_string()))?;
        let mode = fs_err::metadata(root)
            .map_err(|e| BucketError(e.to_string()))?
            .permissions()
            .mode();
        Ok(DirBucket {
            root: root.to_path_buf(),
            shared: mode & 0o020 != 0,
        })
    }

    /// `rel` under the root, refused unless every component is a plain name.
    fn at(&self, rel: &str) -> Result<std::path::PathBuf, BucketError> {
        let ok = !rel.is_empty()
            && rel
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\0'));
        if !ok {
            return Err(BucketError(format!(
                "`{rel}` is not a path inside the remote"
            )));
        }
        Ok(self.root.join(rel))
    }

    /// Make the folders down to `dir`, none of them through a link.
    fn make_dirs(&self, dir: &std::path::Path) -> Result<(), BucketError> {
        use std::os::unix::fs::PermissionsExt;
        let rel = dir.strip_prefix(&self.root).unwrap_or(dir);
        let mut at = self.root.clone();
        for c in rel.components() {
            at.push(c);
            match fs_err::symlink_metadata(&at) {
                Ok(m) if m.is_dir() => continue,
                Ok(_) => {
                    return Err(BucketError(format!(
                        "`{}` is not a folder (a link or a file where the remote keeps a folder)",
                        at.display()
                    )))
                }
                Err(_) => match fs_err::create_dir(&at) {
                    Ok(()) => {
                        if self.shared {
                            let _ = fs_err::set_permissions(
                                &at,
                                std::fs::Permissions::from_mode(0o2775),
                            );
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(BucketError(e.to_string())),
                },
            }
        }
        Ok(())
    }
}

impl Bucket for DirBucket {
    fn describe(&self) -> String {
        format!("file://{}", self.root.display())
    }
    fn get(&self, path: &str, max_bytes: u64) -> Result<Got, BucketError> {
        use std::io::Read;
        let p = self.at(path)?;
        let f = match crate::fsutil::open_regular(&p) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Got::Absent),
            // A link or a FIFO where an object belongs: as if absent (the node is computed).
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => return Ok(Got::Absent),
            Err(e) => return Err(BucketError(e.to_string())),
        };
        let size = f.metadata().map_err(|e| BucketError(e.to_string()))?.len();
        if size > max_bytes {
            return Ok(Got::TooLarge(size));
        }
        let mut out = Vec::new();
        f.take(max_bytes.saturating_add(1))
            .read_to_end(&mut out)
            .map_err(|e| BucketError(e.to_string()))?;
        if out.len() as u64 > max_bytes {
            return Ok(Got::TooLarge(out.len() as u64));
        }
        Ok(Got::Bytes(out))
    }
    fn head(&self, path: &str) -> Result<Option<u64>, BucketError> {
        match fs_err::symlink_metadata(self.at(path)?) {
            Ok(m) if m.is_file() => Ok(Some(m.len())),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(BucketError(e.to_string())),
        }
    }
    fn put(&self, path: &str, bytes: &[u8], mode: PutMode) -> Result<Put, BucketError> {
        let to = self.at(path)?;
        let parent = to.parent().expect("a path in the bucket has a parent");
        self.make_dirs(parent)?;
        let tmp = self.root.join(".upcc-tmp");
        self.make_dirs(&tmp)?;
        let file_mode = if self.shared { 0o664 } else { 0o644 };
        match mode {
            PutMode::Overwrite => crate::fsutil::atomic_write(&tmp, &to, bytes, file_mode)
                .map_err(|e| BucketError(e.to_string()))
                .map(|()| Put::Written),
            PutMode::Create => {
                // Written whole under a temp name, then linked in: exists or not, atomically.
                let staged = crate::fsutil::temp_path(&tmp);
                crate::fsutil::atomic_write(&tmp, &staged, bytes, file_mode)
                    .map_err(|e| BucketError(e.to_string()))?;
                let linked = fs_err::hard_link(&staged, &to);
                let _ = fs_err::remove_file(&staged);
                match linked {
                    Ok(()) => {
                        let _ = crate::fsutil::sync_dir(parent);
                        Ok(Put::Written)
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        Ok(Put::AlreadyExists)
                    }
                    Err(e) => Err(BucketError(e.to_string())),
                }
            }
        }
    }
    fn list(&self, prefix: &str) -> Result<Listing, BucketError> {
        let mut out = Listing::default();
        let top = self.at(prefix)?;
        match fs_err::symlink_metadata(&top) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                out.skipped.push(prefix.to_string());
                return Ok(out);
            }
            Err(_) => return Ok(out),
        }
        let mut stack = vec![top];
        while let Some(dir) = stack.pop() {
            let entries = match fs_err::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(BucketError(e.to_string())),
            };
            for e in entries.flatten() {
                let p = e.path();
                let rel = p
                    .strip_prefix(&self.root)
                    .map(|r| r.to_string_lossy().into_owned())
                    .unwrap_or_default();
                // The entry itself, never what a link points at.
                let Ok(meta) = fs_err::symlink_metadata(&p) else {
                    continue;
                };
                if meta.is_dir() {
                    stack.push(p);
                } else if meta.is_file() {
                    out.entries.push(Listed {
                        path: rel,
                        bytes: meta.len(),
                        modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    });
                } else {
                    out.skipped.push(rel);
                }
            }
        }
        out.entries.sort_by(|a, b| a.path.cmp(&b.path));
        out.skipped.sort();
        Ok(out)
    }
    fn delete(&self, path: &str) -> Result<(), BucketError> {
        let p = self.at(path)?;
        match fs_err::symlink_metadata(&p) {
            Ok(m) if m.is_file() => match fs_err::remove_file(&p) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(BucketError(e.to_string())),
            },
            // Not a regular file: never ours to delete.
            _ => Ok(()),
        }
    }
}
