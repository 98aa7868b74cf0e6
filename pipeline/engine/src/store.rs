//! The artifact store: immutable objects named by their blake3 digest, one manifest per node
//! key, refs from logical node ids to their latest key, per-node logs and lock files.
//!
//! Layout (version [`STORE_LAYOUT_VERSION`]):
//! ```text
//! STORE.json                 layout version, shared flag
//! objects/ab/cdef…           object bytes (read-only), name = blake3 of the bytes
//! nodes/ab/cdef….json        manifest of node key abcdef…
//! refs/<spec>/<hash>.json    last key computed for a logical node id (explains staleness)
//! logs/ab/cdef….log          log of the last execution of a node key
//! locks/ab/cdef….lock        flock(2) lease per node key
//! tmp/                       temp files (same filesystem, renamed into place)
//! quarantine/                corrupt objects and manifests moved aside by `verify`
//! ```
//! No embedded database: everything is a file written atomically, so the store can live on
//! a cluster filesystem shared by many processes and users.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::digest::{Artifact, Digest, NodeKeyTag};
use crate::fsutil::{
    atomic_write, host_name, open_regular, pid_alive, read_regular_capped, temp_owner,
};
use crate::key::KeyMaterial;
use crate::trust::{SignatureRecord, Trust};
use std::sync::Arc;

/// Version of the on-disk layout; a store with another version is refused, never rewritten.
pub const STORE_LAYOUT_VERSION: u32 = 1;
/// Version of the manifest format.
/// 2: manifests are signed (`signature`) and must carry a seal; 1: the seal was optional.
pub const MANIFEST_SCHEMA_VERSION: u32 = 2;

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("I/O error on `{path}`: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("`{0}` is not an upcc store (no STORE.json)")]
    NotAStore(PathBuf),
    #[error("store `{path}` has layout version {found}, this upcc reads version {expected}")]
    LayoutVersion {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    #[error("object {digest} is corrupt: its bytes hash to {actual}")]
    Corrupt {
        digest: Digest<Artifact>,
        actual: Digest<Artifact>,
    },
    #[error("object {0} is missing from the store")]
    MissingObject(Digest<Artifact>),
    #[error("malformed JSON in `{path}`: {source}")]
    BadJson {
        path: PathBuf,
        source: serde_json::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One output of a node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OutputRecord {
    pub digest: Digest<Artifact>,
    pub bytes: u64,
    pub media_type: String,
    /// Suggested file name when the object is exported (`embeddings.parquet`).
    pub file_name: String,
}

/// What happened around a computation; never part of the key.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    pub tool: String,
    pub tool_version: String,
    pub git_revision: Option<String>,
    pub host: String,
    pub user: Option<String>,
    pub pid: u32,
    pub run_id: String,
    pub started_at: String,
    pub finished_at: String,
    pub duration_s: f64,
    pub threads: usize,
    pub process_peak_rss_bytes: Option<u64>,
    pub cpu: String,
    pub os: String,
    #[serde(default)]
    pub libraries: BTreeMap<String, String>,
}

/// The record of one computed node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub manifest_schema: u32,
    pub key: Digest<NodeKeyTag>,
    pub node_id: String,
    pub material: KeyMaterial,
    pub outputs: BTreeMap<String, OutputRecord>,
    /// Small stage-reported facts (sizes, accuracies, epochs run).
    pub summary: Value,
    pub provenance: Provenance,
    /// blake3 of the key and the outputs (see [`Manifest::seal_of`]), written by
    /// [`Store::write_manifest`]: a manifest edited to list other objects (another cell's
    /// result) no longer matches it and is never served. An integrity check against edits and
    /// mix-ups, not a signature: anyone can recompute it. Required from schema 2 on; absent
    /// only in manifests of schema 1 written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seal: Option<String>,
    /// The signature of the seal by whoever computed the result (see [`crate::trust`]):
    /// what a reader that does not trust every writer checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<SignatureRecord>,
}

impl Manifest {
    /// The seal binding `outputs` to `key`: blake3 over a domain tag, the key and every
    /// output's name, digest and size (in name order), hex.
    pub fn seal_of(key: &Digest<NodeKeyTag>, outputs: &BTreeMap<String, OutputRecord>) -> String {
        let mut h = blake3::Hasher::new();
        h.update(b"upcc manifest seal v1\0");
        h.update(key.to_hex().as_bytes());
        for (name, o) in outputs {
            h.update(b"\0");
            h.update(name.as_bytes());
            h.update(b"\0");
            h.update(o.digest.to_hex().as_bytes());
            h.update(b"\0");
            h.update(o.bytes.to_string().as_bytes());
        }
        h.finalize().to_hex().to_string()
    }

    /// Whether the outputs are the ones this manifest was sealed with. A manifest of the
    /// current schema must carry a seal (one with its seal line deleted is refused); only
    /// schema-1 manifests, written before seals existed, may lack one.
    pub fn seal_holds(&self) -> bool {
        match &self.seal {
            Some(s) => *s == Self::seal_of(&self.key, &self.outputs),
            None => self.manifest_schema < 2,
        }
    }
}

/// The latest key computed for a logical node id within one spec.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RefRecord {
    pub node_id: String,
    pub key: Digest<NodeKeyTag>,
    pub material: KeyMaterial,
}

#[derive(Serialize, Deserialize)]
struct StoreInfo {
    layout: u32,
    #[serde(default)]
    shared: bool,
}

/// Findings of [`Store::verify`].
#[derive(Debug, Default, Serialize)]
pub struct VerifyReport {
    pub objects_checked: usize,
    pub manifests_checked: usize,
    pub refs_checked: usize,
    pub corrupt_objects: Vec<String>,
    pub manifests_quarantined: Vec<String>,
    /// Unreadable ref files moved to quarantine (their nodes just lose "why is it stale").
    pub refs_quarantined: Vec<String>,
    pub stale_temp_files_removed: usize,
    /// Files or folders of the wrong kind where the store keeps its own (a plain file for
    /// `locks/`, a directory for a ref), moved to quarantine.
    pub misplaced_moved: Vec<String>,
    /// Intact results this store's trust policy does not serve (unsigned, or signed by a key
    /// not trusted): kept, never served; `run` computes them again. Signer → count.
    pub untrusted: BTreeMap<String, usize>,
}

impl VerifyReport {
    pub fn is_clean(&self) -> bool {
        self.misplaced_moved.is_empty()
            && self.corrupt_objects.is_empty()
            && self.manifests_quarantined.is_empty()
            && self.refs_quarantined.is_empty()
    }
}

/// What reading a small JSON file of the store found.
enum JsonRead<T> {
    Missing,
    Ok(T),
    /// Unparsable (truncated, empty, garbage, a flipped bit): the reason.
    Corrupt(String),
}

/// One warning line on stderr: the store healed itself and says how.
fn warn(message: &str) {
    eprintln!("upcc: warning: {message}");
}

/// Findings of [`Store::gc`].
#[derive(Debug, Default, Serialize)]
pub struct GcReport {
    pub manifests_deleted: usize,
    pub objects_deleted: usize,
    pub bytes_freed: u64,
    pub manifests_kept: usize,
    pub objects_kept: usize,
    pub kept_because_recent: usize,
    /// Entries that are not the store's or the remote's own (names that parse as no digest or
    /// key, links): skipped, never deleted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    /// Results published on a remote while its gc was deleting objects that they list:
    /// their manifests were deleted too (recomputed when asked), none is left dangling.
    #[serde(skip_serializing_if = "is_zero")]
    pub raced_results_removed: usize,
    /// The results deleted (or, in a dry run, that would be): node id and key, and the
    /// results kept only because they are recent (deleted by a gc after the grace).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub results_deleted: Vec<GcResult>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub results_kept_recent: Vec<GcResult>,
}

/// A result a gc names: its node id (`?` when its manifest cannot be read), key, and when it
/// was written.
#[derive(Clone, Debug, Serialize)]
pub struct GcResult {
    pub node_id: String,
    pub key: Digest<NodeKeyTag>,
    pub written: Option<SystemTime>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// A handle on a store directory.
#[derive(Clone, Debug)]
pub struct Store {
    root: PathBuf,
    shared: bool,
    /// Whose results it serves, and the key this process signs its own with.
    trust: Arc<Trust>,
    /// Whether a result whose stage code changed since it was computed is still served (the
    /// user's explicit choice; by default such a result is recomputed).
    keep_code_changes: bool,
}

impl Store {
    /// Open the store at `root`, creating it if the directory is empty or absent.
    /// `shared` (only used on creation) makes every file group-writable for a team cache.
    pub fn open_or_create(root: &Path, shared: bool) -> Result<Self, StoreError> {
        let info_path = root.join("STORE.json");
        if fs_err::symlink_metadata(&info_path).is_err()
            && (!Self::has_store_folders(root) || Self::interrupted_creation(root))
        {
            fs_err::create_dir_all(root).map_err(|e| StoreError::Io {
                path: root.into(),
                source: e,
            })?;
            let info = StoreInfo {
                layout: STORE_LAYOUT_VERSION,
                shared,
            };
            let bytes = serde_json::to_vec_pretty(&info).expect("store info serialises");
            let store = Store {
                root: root.to_path_buf(),
                shared,
                trust: Arc::default(),
                keep_code_changes: false,
            };
            store.ensure_dirs()?;
            atomic_write(&root.join("tmp"), &info_path, &bytes, store.file_mode())
                .map_err(io_err(&info_path))?;
            return Ok(store);
        }
        let store = Self::open_existing(root)?;
        store.ensure_dirs()?;
        Ok(store)
    }

    /// A read-only view of a store that may not exist yet (planning before the first run):
    /// every lookup finds nothing, and nothing is created.
    pub fn view_nonexistent(root: &Path) -> Self {
        Store {
            root: root.to_path_buf(),
            shared: false,
            trust: Arc::default(),
            keep_code_changes: false,
        }
    }

    /// Open an existing store; an error if `root` is not one. A store whose creation was
    /// interrupted before `STORE.json` was published (only the store's own folders, no other
    /// files) is completed.
    pub fn open_existing(root: &Path) -> Result<Self, StoreError> {
        let info_path = root.join("STORE.json");
        if fs_err::symlink_metadata(&info_path).is_err() {
            if Self::has_store_folders(root) && !Self::interrupted_creation(root) {
                return Self::rewrite_info(root, "is missing");
            }
            if Self::interrupted_creation(root) {
                use std::os::unix::fs::PermissionsExt;
                let shared = fs_err::metadata(root.join("tmp"))
                    .map(|m| m.permissions().mode() & 0o2000 != 0)
                    .unwrap_or(false);
                warn(&format!(
                    "`{}` is a store whose creation was interrupted (no STORE.json); completing it",
                    root.display()
                ));
                return Self::open_or_create(root, shared);
            }
            return Err(StoreError::NotAStore(root.to_path_buf()));
        }
        let info: StoreInfo = match read_json::<StoreInfo>(&info_path)? {
            JsonRead::Ok(info) => info,
            // Truncated, empty or garbage: its two fields are known from the folders.
            JsonRead::Corrupt(why) if Self::has_store_folders(root) => {
                return Self::rewrite_info(root, &format!("was unreadable ({why})"));
            }
            JsonRead::Missing | JsonRead::Corrupt(_) => {
                let text = fs_err::read_to_string(&info_path).map_err(|e| StoreError::Io {
                    path: info_path.clone(),
                    source: e,
                })?;
                let source = serde_json::from_str::<StoreInfo>(&text)
                    .err()
                    .unwrap_or_else(|| serde::de::Error::custom("unreadable"));
                return Err(StoreError::BadJson {
                    path: info_path.clone(),
                    source,
                });
            }
        };
        if info.layout != STORE_LAYOUT_VERSION {
            return Err(StoreError::LayoutVersion {
                path: root.to_path_buf(),
                found: info.layout,
                expected: STORE_LAYOUT_VERSION,
            });
        }
        Ok(Store {
            root: root.to_path_buf(),
            shared: info.shared,
            trust: Arc::default(),
            keep_code_changes: false,
        })
    }

    /// Whether `root` has the folders of a layout-1 store (`objects`, `nodes`, `refs`): what
    /// `STORE.json` would describe, so a lost or damaged one can be written again.
    fn has_store_folders(root: &Path) -> bool {
        ["objects", "nodes", "refs"]
            .iter()
            .all(|d| fs_err::symlink_metadata(root.join(d)).is_ok_and(|m| m.is_dir()))
    }

    /// Write `STORE.json` again for a store whose folders are intact (layout 1; shared when
    /// its `tmp/` folder is group-setgid, as a shared store's are), moving a damaged one to
    /// quarantine, with a warning that says so.
    fn rewrite_info(root: &Path, what: &str) -> Result<Self, StoreError> {
        use std::os::unix::fs::PermissionsExt;
        let info_path = root.join("STORE.json");
        let shared = fs_err::metadata(root.join("tmp"))
            .map(|m| m.permissions().mode() & 0o2000 != 0)
            .unwrap_or(false);
        let store = Store {
            root: root.to_path_buf(),
            shared,
            trust: Arc::default(),
            keep_code_changes: false,
        };
        store.ensure_dirs()?;
        if fs_err::symlink_metadata(&info_path).is_ok() {
            store.quarantine_file(&info_path, "store-info")?;
        }
        let info = StoreInfo {
            layout: STORE_LAYOUT_VERSION,
            shared,
        };
        let bytes = serde_json::to_vec_pretty(&info).expect("store info serialises");
        atomic_write(&root.join("tmp"), &info_path, &bytes, store.file_mode())
            .map_err(io_err(&info_path))?;
        warn(&format!(
            "`{}` {what}; its folders are a layout-{STORE_LAYOUT_VERSION} store's, so it was written again ({})",
            info_path.display(),
            if shared { "shared" } else { "not shared" }
        ));
        Ok(store)
    }

    /// Whether `root` holds nothing but (some of) a store's own folders, with nothing in them
    /// except temp files: what a kill during creation leaves.
    fn interrupted_creation(root: &Path) -> bool {
        const DIRS: [&str; 7] = [
            "objects",
            "nodes",
            "refs",
            "logs",
            "locks",
            "tmp",
            "quarantine",
        ];
        let Ok(entries) = fs_err::read_dir(root) else {
            return false;
        };
        let mut any = false;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if !DIRS.contains(&name.as_str()) || !e.path().is_dir() {
                return false;
            }
            any = true;
            if name != "tmp"
                && fs_err::read_dir(e.path())
                    .map(|mut d| d.next().is_some())
                    .unwrap_or(true)
            {
                return false;
            }
        }
        any
    }

    fn ensure_dirs(&self) -> Result<(), StoreError> {
        self.repair_layout()?;
        Ok(())
    }

    /// Create the store's folders; a plain file (or link) where one belongs is moved into
    /// `quarantine/` with a warning (`quarantine` itself first). Returns what was moved.
    fn repair_layout(&self) -> Result<Vec<String>, StoreError> {
        let mut moved = Vec::new();
        let misplaced = |p: &Path| fs_err::symlink_metadata(p).is_ok_and(|m| !m.is_dir());
        let q = self.root.join("quarantine");
        let mut parked = None;
        if misplaced(&q) {
            let aside = self
                .root
                .join(format!("quarantine.misplaced-{}", unix_now()));
            fs_err::rename(&q, &aside).map_err(|e| StoreError::Io {
                path: q.clone(),
                source: e,
            })?;
            parked = Some(aside);
        }
        for sub in [
            "quarantine",
            "objects",
            "nodes",
            "refs",
            "logs",
            "locks",
            "tmp",
        ] {
            let p = self.root.join(sub);
            if sub != "quarantine" && misplaced(&p) {
                self.quarantine_file(&p, "misplaced")?;
                moved.push(sub.to_string());
            }
            fs_err::create_dir_all(&p).map_err(|e| StoreError::Io {
                path: p.clone(),
                source: e,
            })?;
            if self.shared {
                use std::os::unix::fs::PermissionsExt;
                let _ = fs_err::set_permissions(&p, std::fs::Permissions::from_mode(0o2775));
            }
            if let (Some(aside), "quarantine") = (&parked, sub) {
                self.quarantine_file(aside, "misplaced")?;
                moved.push("quarantine".to_string());
            }
        }
        for m in &moved {
            warn(&format!(
                "`{}` was not a folder; moved it into `{}` and made the folder",
                self.root.join(m).display(),
                q.display()
            ));
        }
        Ok(moved)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// This handle with a trust policy: which results it serves, which key signs what it
    /// computes. Without one a store trusts every writer and signs nothing (the engine's
    /// tests); the CLI always sets one.
    pub fn with_trust(mut self, trust: Arc<Trust>) -> Self {
        self.trust = trust;
        self
    }

    pub fn trust(&self) -> &Trust {
        &self.trust
    }

    /// Serve results whose stage code changed since they were computed (see
    /// [`Store::kept_despite_code`]).
    pub fn keeping_code_changes(mut self, keep: bool) -> Self {
        self.keep_code_changes = keep;
        self
    }

    /// Under [`Store::keeping_code_changes`]: the stored result of `prev` (the node's ref)
    /// when its material differs from `material` only in the stage's code
    /// ([`crate::key::code_changes`]), with the code files that changed.
    pub fn kept_despite_code(
        &self,
        prev: Option<&RefRecord>,
        material: &KeyMaterial,
    ) -> Result<Option<(Manifest, Vec<String>)>, StoreError> {
        let Some(prev) = prev.filter(|_| self.keep_code_changes) else {
            return Ok(None);
        };
        let Some(files) = crate::key::code_changes(&prev.material, material) else {
            return Ok(None);
        };
        Ok(self.fresh_manifest(&prev.key)?.map(|m| (m, files)))
    }

    /// Whether results whose stage code changed are served ([`Store::keeping_code_changes`]).
    pub fn keeps_code_changes(&self) -> bool {
        self.keep_code_changes
    }

    /// Whether the store is group-shared (files group-writable).
    pub fn is_shared(&self) -> bool {
        self.shared
    }

    fn file_mode(&self) -> u32 {
        if self.shared {
            0o664
        } else {
            0o644
        }
    }

    fn tmp_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }

    fn fanout(&self, sub: &str, hex: &str, ext: &str) -> PathBuf {
        self.root
            .join(sub)
            .join(&hex[..2])
            .join(format!("{}{ext}", &hex[2..]))
    }

    /// The mode of the files it writes (group-writable in a shared store).
    pub(crate) fn mode(&self) -> u32 {
        self.file_mode()
    }

    /// Create folder `dir` of the store and any missing folder above it (each group-writable
    /// and group-inheriting in a shared store).
    pub(crate) fn ensure_dir(&self, dir: &Path) -> Result<(), StoreError> {
        if dir.is_dir() {
            return Ok(());
        }
        if let Some(parent) = dir.parent().filter(|p| p.starts_with(&self.root)) {
            self.ensure_dir(parent)?;
        }
        // `ensure_parent` makes the parent of the path it is given: of a file in `dir`.
        self.ensure_parent(&dir.join("file"))
    }

    fn ensure_parent(&self, path: &Path) -> Result<(), StoreError> {
        if let Some(parent) = path.parent() {
            if !parent.exists() {
                fs_err::create_dir_all(parent).map_err(|e| StoreError::Io {
                    path: parent.into(),
                    source: e,
                })?;
                if self.shared {
                    use std::os::unix::fs::PermissionsExt;
                    let _ =
                        fs_err::set_permissions(parent, std::fs::Permissions::from_mode(0o2775));
                }
            }
        }
        Ok(())
    }

    pub fn object_path(&self, digest: &Digest<Artifact>) -> PathBuf {
        self.fanout("objects", &digest.to_hex(), "")
    }

    pub fn manifest_path(&self, key: &Digest<NodeKeyTag>) -> PathBuf {
        self.fanout("nodes", &key.to_hex(), ".json")
    }

    pub fn log_path(&self, key: &Digest<NodeKeyTag>) -> PathBuf {
        self.fanout("logs", &key.to_hex(), ".log")
    }

    pub fn lock_path(&self, key: &Digest<NodeKeyTag>) -> PathBuf {
        self.fanout("locks", &key.to_hex(), ".lock")
    }

    fn ref_path(&self, spec: &str, node_id: &str) -> PathBuf {
        let h = blake3::hash(node_id.as_bytes()).to_hex();
        self.root
            .join("refs")
            .join(sanitize_component(spec))
            .join(format!("{}.json", &h[..32]))
    }

    /// Store `bytes` as an object (atomically) and return its digest. Idempotent.
    pub fn put_object(&self, bytes: &[u8]) -> Result<Digest<Artifact>, StoreError> {
        let digest = Digest::of_bytes(bytes);
        let path = self.object_path(&digest);
        if let Ok(meta) = fs_err::metadata(&path) {
            if meta.len() == bytes.len() as u64 && self.hash_file(&path).ok() == Some(digest) {
                return Ok(digest);
            }
        }
        self.ensure_parent(&path)?;
        // Objects are immutable: read-only for everyone, whether or not the store is shared.
        atomic_write(&self.tmp_dir(), &path, bytes, 0o444).map_err(io_err(&path))?;
        Ok(digest)
    }

    fn hash_file(&self, path: &Path) -> std::io::Result<Digest<Artifact>> {
        let mut f = open_regular(path)?;
        let mut hasher = blake3::Hasher::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        Ok(Digest::from_bytes(*hasher.finalize().as_bytes()))
    }

    /// Whether an object is present with the expected size (cheap; no hashing).
    pub fn has_object(&self, digest: &Digest<Artifact>, bytes: u64) -> bool {
        fs_err::symlink_metadata(self.object_path(digest))
            .map(|m| m.is_file() && m.len() == bytes)
            .unwrap_or(false)
    }

    /// Read an object and check its hash: a corrupt object is never served.
    pub fn read_object(&self, digest: &Digest<Artifact>) -> Result<Vec<u8>, StoreError> {
        let path = self.object_path(digest);
        let read = open_regular(&path).and_then(|mut f| {
            let mut b = Vec::new();
            f.read_to_end(&mut b).map(|_| b)
        });
        let bytes = match read {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StoreError::MissingObject(*digest))
            }
            Err(e) => return Err(StoreError::Io { path, source: e }),
        };
        let actual = Digest::of_bytes(&bytes);
        if actual != *digest {
            return Err(StoreError::Corrupt {
                digest: *digest,
                actual,
            });
        }
        Ok(bytes)
    }

    /// The manifest of a node key, if one is stored and this store's trust policy serves it.
    /// An unreadable manifest, or one that belongs to another key or whose seal does not
    /// hold, is moved to quarantine with one warning line and reads as absent: its node will
    /// be recomputed. An intact one the policy does not trust (unsigned, or signed by a key
    /// not trusted) reads as absent too, with one warning per signer, and stays in place (a
    /// colleague's result in a shared store): computing the node replaces it.
    pub fn read_manifest(&self, key: &Digest<NodeKeyTag>) -> Result<Option<Manifest>, StoreError> {
        Ok(self.read_manifest_intact(key)?.filter(|m| self.trusts(m)))
    }

    /// [`Store::read_manifest`] without the trust policy: the manifest if it is intact (filed
    /// under its key, seal holding), whoever wrote it. For gc (a colleague's result keeps its
    /// objects) and `verify`; never for serving a result.
    pub fn read_manifest_intact(
        &self,
        key: &Digest<NodeKeyTag>,
    ) -> Result<Option<Manifest>, StoreError> {
        let path = self.manifest_path(key);
        let why = match read_json::<Manifest>(&path)? {
            JsonRead::Missing => return Ok(None),
            JsonRead::Ok(m) if m.key == *key && m.seal_holds() => return Ok(Some(m)),
            JsonRead::Ok(m) if m.key == *key && m.seal.is_none() => {
                "it has no seal, which every manifest of this schema carries (edited?)".to_string()
            }
            JsonRead::Ok(m) if m.key == *key => {
                "its outputs are not the ones it was sealed with (edited?)".to_string()
            }
            JsonRead::Ok(m) => format!("it records key {} instead", m.key.short()),
            JsonRead::Corrupt(why) => why,
        };
        self.quarantine_manifest(key)?;
        warn(&format!(
            "result {} was unreadable ({why}); moved to quarantine, it will be recomputed",
            key.short()
        ));
        Ok(None)
    }

    /// Whether this store's policy serves `m` (for a download: a result the store would refuse
    /// to serve is not fetched).
    pub fn trusts(&self, m: &Manifest) -> bool {
        self.trusts_from(m, "the store")
    }

    /// [`Store::trusts`] for a result found in `place` (a remote): the warning names it.
    pub fn trusts_from(&self, m: &Manifest, place: &str) -> bool {
        match self.trust.check(m) {
            Ok(()) => true,
            Err(why) => {
                if let Some(w) = self.trust.refusal_warning(place, &why) {
                    warn(&w);
                }
                false
            }
        }
    }

    /// A manifest whose outputs are all present (by size): the node is fresh.
    pub fn fresh_manifest(&self, key: &Digest<NodeKeyTag>) -> Result<Option<Manifest>, StoreError> {
        Ok(self.read_manifest(key)?.filter(|m| {
            m.outputs
                .values()
                .all(|o| self.has_object(&o.digest, o.bytes))
        }))
    }

    /// Publish the manifest of a result computed here, atomically. Objects must already be
    /// stored. It is sealed here (its `seal` set from its key and outputs) and signed with
    /// this process's key when it has one; the manifest as written is returned.
    pub fn write_manifest(&self, manifest: &Manifest) -> Result<Manifest, StoreError> {
        let mut sealed = manifest.clone();
        let seal = Manifest::seal_of(&manifest.key, &manifest.outputs);
        sealed.signature = self.trust.signer().map(|k| k.sign(&seal));
        sealed.seal = Some(seal);
        self.write_sealed(&sealed)?;
        Ok(sealed)
    }

    /// Publish a manifest computed elsewhere (downloaded from a remote) as it is: its seal
    /// must hold, and its signature stays its computer's.
    pub fn write_downloaded_manifest(&self, manifest: &Manifest) -> Result<(), StoreError> {
        debug_assert!(manifest.seal.is_some() && manifest.seal_holds());
        self.write_sealed(manifest)
    }

    fn write_sealed(&self, manifest: &Manifest) -> Result<(), StoreError> {
        let path = self.manifest_path(&manifest.key);
        self.ensure_parent(&path)?;
        self.clear_misplaced_dir(&path)?;
        let bytes = serde_json::to_vec_pretty(manifest).expect("manifest serialises");
        atomic_write(&self.tmp_dir(), &path, &bytes, self.file_mode()).map_err(io_err(&path))
    }

    /// Record that `node_id` (within `spec`) now has key `key`.
    pub fn write_ref(&self, spec: &str, record: &RefRecord) -> Result<(), StoreError> {
        let path = self.ref_path(spec, &record.node_id);
        self.ensure_parent(&path)?;
        self.clear_misplaced_dir(&path)?;
        let bytes = serde_json::to_vec_pretty(record).expect("ref serialises");
        atomic_write(&self.tmp_dir(), &path, &bytes, self.file_mode()).map_err(io_err(&path))
    }

    /// The last key computed for `node_id` within `spec`. An unreadable ref is moved to
    /// quarantine with one warning line and reads as absent (refs only explain staleness).
    pub fn read_ref(&self, spec: &str, node_id: &str) -> Result<Option<RefRecord>, StoreError> {
        let path = self.ref_path(spec, node_id);
        match read_json::<RefRecord>(&path)? {
            JsonRead::Missing => Ok(None),
            JsonRead::Ok(r) => Ok(Some(r)),
            JsonRead::Corrupt(why) => {
                self.quarantine_file(&path, "ref")?;
                warn(&format!(
                    "the ref of `{node_id}` was unreadable ({why}); moved to quarantine"
                ));
                Ok(None)
            }
        }
    }

    /// Move any file of the store into quarantine (`<kind>-<name>-<time>`).
    fn quarantine_file(&self, from: &Path, kind: &str) -> Result<(), StoreError> {
        let name = from
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        let to = self
            .root
            .join("quarantine")
            .join(format!("{kind}-{}-{name}", unique_suffix()));
        match fs_err::rename(from, &to) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StoreError::Io {
                path: from.to_path_buf(),
                source: e,
            }),
        }
    }

    /// Write a node's log (atomically, so a reader never sees half a log of a finished node).
    pub fn write_log(&self, key: &Digest<NodeKeyTag>, text: &str) -> Result<(), StoreError> {
        let path = self.log_path(key);
        self.ensure_parent(&path)?;
        atomic_write(&self.tmp_dir(), &path, text.as_bytes(), self.file_mode())
            .map_err(io_err(&path))
    }

    /// The live process computing `key` right now, if any (from its lease).
    pub fn running(&self, key: &Digest<NodeKeyTag>) -> Option<Option<crate::lease::LeaseHolder>> {
        crate::lease::holder_now(&self.lock_path(key))
    }

    pub fn ensure_lock_parent(&self, key: &Digest<NodeKeyTag>) -> Result<PathBuf, StoreError> {
        let path = self.lock_path(key);
        self.ensure_parent(&path)?;
        self.clear_misplaced_dir(&path)?;
        Ok(path)
    }

    /// A directory where the store keeps a file (a ref, manifest or lock): moved to
    /// quarantine with a warning, so the file can be written.
    fn clear_misplaced_dir(&self, path: &Path) -> Result<(), StoreError> {
        if fs_err::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
            self.quarantine_file(path, "misplaced-dir")?;
            warn(&format!(
                "`{}` was a directory where the store keeps a file; moved to quarantine",
                path.display()
            ));
        }
        Ok(())
    }

    /// Move an object aside so it is never served again.
    pub fn quarantine_object(&self, digest: &Digest<Artifact>) -> Result<(), StoreError> {
        let from = self.object_path(digest);
        let to = self.root.join("quarantine").join(format!(
            "object-{}-{}",
            digest.to_hex(),
            unique_suffix()
        ));
        match fs_err::rename(&from, &to) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StoreError::Io {
                path: from,
                source: e,
            }),
        }
    }

    /// Move a manifest aside (its node becomes missing and will be recomputed).
    pub fn quarantine_manifest(&self, key: &Digest<NodeKeyTag>) -> Result<(), StoreError> {
        let from = self.manifest_path(key);
        let to = self.root.join("quarantine").join(format!(
            "manifest-{}-{}.json",
            key.to_hex(),
            unique_suffix()
        ));
        match fs_err::rename(&from, &to) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StoreError::Io {
                path: from,
                source: e,
            }),
        }
    }

    /// Every object digest in the store.
    pub fn list_objects(&self) -> Result<Vec<Digest<Artifact>>, StoreError> {
        let mut out = Vec::new();
        for path in list_fanout(&self.root.join("objects"))? {
            let name = fanout_name(&path, "");
            if let Some(d) = name.and_then(|n| n.parse().ok()) {
                out.push(d);
            }
        }
        out.sort();
        Ok(out)
    }

    /// Every manifest key in the store.
    pub fn list_manifests(&self) -> Result<Vec<Digest<NodeKeyTag>>, StoreError> {
        let mut out = Vec::new();
        for path in list_fanout(&self.root.join("nodes"))? {
            if let Some(d) = fanout_name(&path, ".json").and_then(|n| n.parse().ok()) {
                out.push(d);
            }
        }
        out.sort();
        Ok(out)
    }

    /// Every ref file (`refs/<spec>/<hash>.json`).
    pub fn list_refs(&self) -> Result<Vec<PathBuf>, StoreError> {
        let mut out = list_fanout(&self.root.join("refs"))?;
        out.retain(|p| p.extension().is_some_and(|e| e == "json"));
        out.sort();
        Ok(out)
    }

    /// Re-hash every object; quarantine corrupt ones and the manifests that point at missing
    /// or corrupt objects; remove temp files left by dead processes on this host.
    pub fn verify(
        &self,
        mut on_progress: impl FnMut(usize, usize),
    ) -> Result<VerifyReport, StoreError> {
        let mut report = VerifyReport {
            misplaced_moved: self.repair_layout()?,
            ..VerifyReport::default()
        };
        for path in list_fanout(&self.root.join("locks"))? {
            if path.extension().is_some_and(|e| e == "lock")
                && fs_err::symlink_metadata(&path).is_ok_and(|m| m.is_dir())
            {
                self.quarantine_file(&path, "misplaced-dir")?;
                report.misplaced_moved.push(
                    path.strip_prefix(&self.root)
                        .unwrap_or(&path)
                        .display()
                        .to_string(),
                );
            }
        }
        let objects = self.list_objects()?;
        for (i, digest) in objects.iter().enumerate() {
            on_progress(i, objects.len());
            let path = self.object_path(digest);
            // A link, FIFO or device where an object belongs is as wrong as a flipped byte.
            let actual = match self.hash_file(&path) {
                Ok(d) => Some(d),
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => None,
                Err(e) if e.raw_os_error() == Some(libc::ELOOP) => None,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err(&path)(e)),
            };
            report.objects_checked += 1;
            if actual != Some(*digest) {
                self.quarantine_object(digest)?;
                report.corrupt_objects.push(digest.to_hex());
            }
        }
        for key in self.list_manifests()? {
            report.manifests_checked += 1;
            let manifest = match read_json::<Manifest>(&self.manifest_path(&key))? {
                JsonRead::Ok(m) => m,
                JsonRead::Missing => continue,
                JsonRead::Corrupt(_) => {
                    self.quarantine_manifest(&key)?;
                    report.manifests_quarantined.push(key.to_hex());
                    continue;
                }
            };
            // The key material must hash to the key the manifest is filed under.
            let intact = manifest.key == key
                && manifest.seal_holds()
                && manifest.material.digest().ok() == Some(key)
                && manifest
                    .outputs
                    .values()
                    .all(|o| self.has_object(&o.digest, o.bytes));
            if !intact {
                self.quarantine_manifest(&key)?;
                report.manifests_quarantined.push(key.to_hex());
            } else if let Err(why) = self.trust.check(&manifest) {
                *report.untrusted.entry(why.signer()).or_default() += 1;
            }
        }
        for path in self.list_refs()? {
            report.refs_checked += 1;
            if let JsonRead::Corrupt(_) = read_json::<RefRecord>(&path)? {
                self.quarantine_file(&path, "ref")?;
                report.refs_quarantined.push(
                    path.strip_prefix(&self.root)
                        .unwrap_or(&path)
                        .display()
                        .to_string(),
                );
            }
        }
        report.stale_temp_files_removed = self.clean_dead_temps()?;
        Ok(report)
    }

    /// Remove temp files whose writer is a dead process on this host (or older than a day).
    pub fn clean_dead_temps(&self) -> Result<usize, StoreError> {
        let tmp = self.tmp_dir();
        let me = host_name()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect::<String>();
        let mut removed = 0;
        let entries = match fs_err::read_dir(&tmp) {
            Ok(e) => e,
            Err(_) => return Ok(0),
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let old = entry
                .metadata()
                .and_then(|m| m.modified())
                .map(|t| {
                    SystemTime::now().duration_since(t).unwrap_or_default()
                        > Duration::from_secs(86_400)
                })
                .unwrap_or(false);
            let dead =
                matches!(temp_owner(&name), Some((host, pid)) if host == me && !pid_alive(pid));
            if (dead || old) && fs_err::remove_file(entry.path()).is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Temp files present right now (for tests and `verify` reports).
    pub fn temp_files(&self) -> Vec<PathBuf> {
        fs_err::read_dir(self.tmp_dir())
            .map(|it| it.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    }

    /// Delete manifests not in `keep` and objects no kept manifest references. Anything
    /// modified within `grace` is kept, so a process that is writing right now (object renamed
    /// in, manifest not yet) is never robbed.
    pub fn gc(
        &self,
        keep: &BTreeSet<Digest<NodeKeyTag>>,
        grace: Duration,
        dry_run: bool,
    ) -> Result<GcReport, StoreError> {
        let mut report = GcReport::default();
        let recent = |path: &Path| {
            fs_err::metadata(path)
                .and_then(|m| m.modified())
                .map(|t| SystemTime::now().duration_since(t).unwrap_or_default() < grace)
                .unwrap_or(true)
        };
        let mut live_objects: BTreeSet<Digest<Artifact>> = BTreeSet::new();
        for key in self.list_manifests()? {
            let path = self.manifest_path(&key);
            let reachable = keep.contains(&key);
            let is_recent = recent(&path);
            let named = |store: &Store| GcResult {
                node_id: store
                    .read_manifest_intact(&key)
                    .ok()
                    .flatten()
                    .map_or_else(|| "?".to_string(), |m| m.node_id),
                key,
                written: fs_err::metadata(&path).and_then(|m| m.modified()).ok(),
            };
            if reachable || is_recent {
                if !reachable {
                    report.kept_because_recent += 1;
                    report.results_kept_recent.push(named(self));
                }
                report.manifests_kept += 1;
                if let Ok(Some(m)) = self.read_manifest_intact(&key) {
                    live_objects.extend(m.outputs.values().map(|o| o.digest));
                }
                continue;
            }
            report.manifests_deleted += 1;
            report.results_deleted.push(named(self));
            if !dry_run {
                let _ = fs_err::remove_file(&path);
                let _ = fs_err::remove_file(self.log_path(&key));
            }
        }
        for digest in self.list_objects()? {
            let path = self.object_path(&digest);
            if live_objects.contains(&digest) || recent(&path) {
                report.objects_kept += 1;
                continue;
            }
            report.objects_deleted += 1;
            report.bytes_freed += fs_err::metadata(&path).map(|m| m.len()).unwrap_or(0);
            if !dry_run {
                let _ = fs_err::remove_file(&path);
            }
        }
        Ok(report)
    }
}

/// `<seconds>.<nanoseconds>-<pid>-<n>`: names that never collide, even for two files moved to
/// quarantine in one second by one or several processes.
fn unique_suffix() -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    format!(
        "{}.{:09}-{}-{}",
        t.as_secs(),
        t.subsec_nanos(),
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn sanitize_component(s: &str) -> String {
    let cleaned: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if cleaned.is_empty() {
        "_".into()
    } else {
        cleaned
    }
}

/// The largest manifest, ref or STORE.json read (the largest real manifest is a few KiB).
const JSON_CAP: u64 = 16 << 20;

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<JsonRead<T>, StoreError> {
    match fs_err::symlink_metadata(path) {
        Ok(m) if m.is_dir() => return Ok(JsonRead::Corrupt("a directory, not a file".into())),
        Ok(m) if !m.is_file() => {
            return Ok(JsonRead::Corrupt(format!(
                "{}, not a regular file",
                crate::fsutil::kind_name(m.file_type())
            )))
        }
        _ => {}
    }
    match read_regular_capped(path, JSON_CAP) {
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            Ok(JsonRead::Corrupt(e.to_string()))
        }
        Ok(bytes) => Ok(match serde_json::from_slice(&bytes) {
            Ok(v) => JsonRead::Ok(v),
            Err(e) if bytes.is_empty() => JsonRead::Corrupt(format!("empty file: {e}")),
            Err(e) => JsonRead::Corrupt(e.to_string()),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(JsonRead::Missing),
        Err(e) => Err(StoreError::Io {
            path: path.to_path_buf(),
            source: e,
        }),
    }
}

fn list_fanout(dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    let mut out = Vec::new();
    let top = match fs_err::read_dir(dir) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => {
            return Err(StoreError::Io {
                path: dir.into(),
                source: e,
            })
        }
    };
    for sub in top.flatten() {
        if !sub.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            continue;
        }
        if let Ok(files) = fs_err::read_dir(sub.path()) {
            out.extend(files.flatten().map(|f| f.path()));
        }
    }
    Ok(out)
}

fn fanout_name(path: &Path, ext: &str) -> Option<String> {
    let file = path.file_name()?.to_str()?;
    let dir = path.parent()?.file_name()?.to_str()?;
    let stem = file.strip_suffix(ext)?;
    if dir.len() != 2 || stem.len() != 62 {
        return None;
    }
    Some(format!("{dir}{stem}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open_or_create(&dir.path().join("store"), false).unwrap();
        (dir, s)
    }

    #[test]
    fn objects_round_trip_and_are_listed() {
        let (_d, s) = store();
        let d = s.put_object(b"abc").unwrap();
        assert_eq!(s.read_object(&d).unwrap(), b"abc");
        assert_eq!(s.list_objects().unwrap(), vec![d]);
        assert!(s.temp_files().is_empty());
    }

    #[test]
    fn flipped_byte_is_detected_and_never_served() {
        use std::os::unix::fs::PermissionsExt;
        let (_d, s) = store();
        let d = s.put_object(b"hello world").unwrap();
        let p = s.object_path(&d);
        fs_err::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut bytes = fs_err::read(&p).unwrap();
        bytes[3] ^= 0x01;
        fs_err::write(&p, &bytes).unwrap();
        assert!(matches!(s.read_object(&d), Err(StoreError::Corrupt { .. })));
        let report = s.verify(|_, _| {}).unwrap();
        assert_eq!(report.corrupt_objects, vec![d.to_hex()]);
        assert!(matches!(
            s.read_object(&d),
            Err(StoreError::MissingObject(_))
        ));
    }

    #[test]
    fn refuses_other_layout_versions() {
        let dir = tempfile::tempdir().unwrap();
        fs_err::write(dir.path().join("STORE.json"), r#"{"layout": 99}"#).unwrap();
        assert!(matches!(
            Store::open_existing(dir.path()),
            Err(StoreError::LayoutVersion { found: 99, .. })
        ));
    }
}
