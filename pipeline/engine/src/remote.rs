//! The remote cache: a second store in a bucket (S3, GCS, Azure, a folder) that runs on other
//! machines consult before computing a node and fill after computing one.
//!
//! Layout under the remote's prefix (the local store's, less what is local to a machine):
//! ```text
//! objects/ab/cdef…           object bytes, name = blake3 of the bytes
//! nodes/ab/cdef….json        sealed manifest of node key abcdef…
//! ```
//! Nothing from the remote is trusted: a manifest is used only when it is filed under the key
//! its key material hashes to and its seal holds, and every object is checked against the
//! digest and size the manifest gives before it enters the local store; a corrupt or missing
//! object is refused, reported once, and the node computed locally (its upload then replaces
//! what was corrupt). Uploads write the objects first and the manifest last, created only if
//! absent, so a reader never sees a manifest whose objects are missing, and two machines that
//! computed the same key never serve a mix. A remote that cannot be reached is reported once and
//! then left alone for the rest of the process: work goes on locally.
//!
//! The engine knows no cloud: a [`Bucket`] gives it blocking get/put/list/delete on paths,
//! and the CLI implements it on the Arrow project's `object_store`.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::digest::{Artifact, Digest, NodeKeyTag};
use crate::store::{GcReport, Manifest, Store, StoreError};

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
    /// The object's bytes, `None` if absent.
    fn get(&self, path: &str) -> Result<Option<Vec<u8>>, BucketError>;
    /// The object's size, `None` if absent.
    fn head(&self, path: &str) -> Result<Option<u64>, BucketError>;
    fn put(&self, path: &str, bytes: &[u8], mode: PutMode) -> Result<Put, BucketError>;
    /// Every object under `prefix` (`objects/`, `nodes/`).
    fn list(&self, prefix: &str) -> Result<Vec<Listed>, BucketError>;
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
    pub fn new(bucket: Box<dyn Bucket>, warn_on_stderr: bool) -> Self {
        RemoteCache {
            bucket,
            down: Mutex::new(None),
            corrupt: Mutex::new(BTreeSet::new()),
            stats: Mutex::new(RemoteStats::default()),
            index: Mutex::new(None),
            checked: Mutex::new(std::collections::HashMap::new()),
            warn_on_stderr,
            warnings: Mutex::new(Vec::new()),
        }
    }

    pub fn describe(&self) -> String {
        self.bucket.describe()
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

    fn refused(&self, path: String, message: String) {
        mutex(&self.corrupt).insert(path);
        mutex(&self.stats).refused += 1;
        self.warn(message);
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
        let bytes = match self.bucket.get(&path) {
            Ok(Some(b)) => b,
            Ok(None) => return None,
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
            Ok(m) => {
                mutex(&self.checked).insert(*key, m.clone());
                return Some(m);
            }
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
        let (mut objects, mut bytes_in) = (0usize, 0u64);
        for (name, o) in &m.outputs {
            if store.has_object(&o.digest, o.bytes) {
                continue;
            }
            let path = object_path(&o.digest);
            let bytes = match self.bucket.get(&path) {
                Ok(Some(b)) => b,
                Ok(None) => {
                    self.refused(
                        path,
                        format!(
                            "remote result {} lists object {} (output `{name}`), which the remote does not hold; the node is computed locally",
                            key.short(),
                            o.digest.short()
                        ),
                    );
                    return Ok(None);
                }
                Err(e) => {
                    self.lost(&e);
                    return Ok(None);
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
                return Ok(None);
            }
            store.put_object(&bytes)?;
            objects += 1;
            bytes_in += bytes.len() as u64;
        }
        store.write_manifest(&m)?;
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
        let mut s = mutex(&self.stats);
        s.nodes_downloaded += 1;
        s.objects_downloaded += objects;
        s.bytes_downloaded += bytes_in;
        Ok(Some(m))
    }

    /// Upload node `m.key` (published in `store`): every object the remote lacks (or holds corrupt), then
    /// the manifest, created only if the remote has none for the key.
    pub fn upload(&self, store: &Store, m: &Manifest) -> Result<Uploaded, StoreError> {
        if self.is_down() {
            return Ok(Uploaded::Unreachable);
        }
        let key = &m.key;
        let (mut objects, mut bytes_out) = (0usize, 0u64);
        for o in m.outputs.values() {
            let path = object_path(&o.digest);
            let known_bad = mutex(&self.corrupt).contains(&path);
            let mode = if known_bad {
                PutMode::Overwrite
            } else {
                match self.bucket.head(&path) {
                    Ok(Some(n)) if n == o.bytes => continue,
                    // Present with another size: truncated or wrong, replace it.
                    Ok(Some(_)) => PutMode::Overwrite,
                    Ok(None) => PutMode::Create,
                    Err(e) => {
                        self.lost(&e);
                        return Ok(Uploaded::Unreachable);
                    }
                }
            };
            let bytes = store.read_object(&o.digest)?;
            match self.bucket.put(&path, &bytes, mode) {
                Ok(Put::Written) => {
                    objects += 1;
                    bytes_out += bytes.len() as u64;
                    mutex(&self.corrupt).remove(&path);
                }
                // Another machine uploaded the same content-addressed object meanwhile.
                Ok(Put::AlreadyExists) => {}
                Err(e) => {
                    self.lost(&e);
                    return Ok(Uploaded::Unreachable);
                }
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
        let mut s = mutex(&self.stats);
        s.objects_uploaded += objects;
        s.bytes_uploaded += bytes_out;
        if done == Uploaded::Published {
            s.nodes_uploaded += 1;
        }
        Ok(done)
    }

    /// Delete from the remote the manifests not in `keep` and the objects no kept manifest
    /// lists; anything written within `grace` is kept (an upload in flight has written its
    /// objects before its manifest). Manifests go first, so no manifest ever lists a deleted
    /// object. `Err` when the remote cannot be listed or a deletion fails.
    pub fn gc(
        &self,
        keep: &BTreeSet<Digest<NodeKeyTag>>,
        grace: Duration,
        dry_run: bool,
    ) -> Result<GcReport, BucketError> {
        let mut report = GcReport::default();
        let now = SystemTime::now();
        let recent = |l: &Listed| now.duration_since(l.modified).unwrap_or_default() < grace;
        let mut live: BTreeSet<Digest<Artifact>> = BTreeSet::new();
        for l in self.bucket.list("nodes")? {
            let Some(key) = digest_of_path::<NodeKeyTag>(&l.path, "nodes", ".json") else {
                continue;
            };
            if keep.contains(&key) || recent(&l) {
                if !keep.contains(&key) {
                    report.kept_because_recent += 1;
                }
                report.manifests_kept += 1;
                // The objects of a kept manifest stay, readable or not (an unreadable one
                // keeps none; its node is recomputed and re-uploaded when asked).
                if let Some(bytes) = self.bucket.get(&l.path)? {
                    if let Ok(m) = serde_json::from_slice::<Manifest>(&bytes) {
                        live.extend(m.outputs.values().map(|o| o.digest));
                    }
                }
                continue;
            }
            report.manifests_deleted += 1;
            if !dry_run {
                self.bucket.delete(&l.path)?;
            }
        }
        for l in self.bucket.list("objects")? {
            let d = digest_of_path::<Artifact>(&l.path, "objects", "");
            if d.is_some_and(|d| live.contains(&d)) || recent(&l) {
                report.objects_kept += 1;
                continue;
            }
            report.objects_deleted += 1;
            report.bytes_freed += l.bytes;
            if !dry_run {
                self.bucket.delete(&l.path)?;
            }
        }
        Ok(report)
    }

    /// Every manifest key the remote lists.
    pub fn list_keys(&self) -> Result<Vec<Digest<NodeKeyTag>>, BucketError> {
        Ok(self
            .bucket
            .list("nodes")?
            .iter()
            .filter_map(|l| digest_of_path(&l.path, "nodes", ".json"))
            .collect())
    }
}

/// A [`Bucket`] in a local folder, for the engine's tests (the CLI's `file://` remotes go
/// through `object_store` like every other).
#[cfg(test)]
pub struct DirBucket {
    pub root: std::path::PathBuf,
}

#[cfg(test)]
impl Bucket for DirBucket {
    fn describe(&self) -> String {
        format!("dir://{}", self.root.display())
    }
    fn get(&self, path: &str) -> Result<Option<Vec<u8>>, BucketError> {
        match fs_err::read(self.root.join(path)) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(BucketError(e.to_string())),
        }
    }
    fn head(&self, path: &str) -> Result<Option<u64>, BucketError> {
        match fs_err::metadata(self.root.join(path)) {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(BucketError(e.to_string())),
        }
    }
    fn put(&self, path: &str, bytes: &[u8], mode: PutMode) -> Result<Put, BucketError> {
        let to = self.root.join(path);
        if mode == PutMode::Create && to.exists() {
            return Ok(Put::AlreadyExists);
        }
        let parent = to.parent().expect("a path in the bucket has a parent");
        fs_err::create_dir_all(parent).map_err(|e| BucketError(e.to_string()))?;
        crate::fsutil::atomic_write(parent, &to, bytes, 0o644)
            .map_err(|e| BucketError(e.to_string()))?;
        Ok(Put::Written)
    }
    fn list(&self, prefix: &str) -> Result<Vec<Listed>, BucketError> {
        let mut out = Vec::new();
        let mut stack = vec![self.root.join(prefix)];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = fs_err::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let p = e.path();
                let meta = e.metadata().map_err(|e| BucketError(e.to_string()))?;
                if meta.is_dir() {
                    stack.push(p);
                } else if let Ok(rel) = p.strip_prefix(&self.root) {
                    out.push(Listed {
                        path: rel.to_string_lossy().into_owned(),
                        bytes: meta.len(),
                        modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    });
                }
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }
    fn delete(&self, path: &str) -> Result<(), BucketError> {
        match fs_err::remove_file(self.root.join(path)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(BucketError(e.to_string())),
        }
    }
}
