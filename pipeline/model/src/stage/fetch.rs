//! `fetch`: a dataset file downloaded into the store and checked against its digest, so a
//! shared store downloads each file once for everybody. The bytes come from the first of: the
//! spec's local copy (`files.ROLE`) or `$UPCC_DATA_MIRROR/NAME` when its digest is right, else
//! the URL — with retries, resuming an interrupted transfer (HTTP Range) from a partial file
//! in the temp directory. A wrong digest publishes nothing and names both digests.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use sha2::Digest as _;
use upcc_engine::{Task, TaskContext, TaskError};

use crate::error::Result;
use crate::specs::axis::Axis;
use crate::specs::schema::FetchSpec;
use crate::wiring::{labels, NodeSpec, Numerics, Wiring};

pub const VERSION: u32 = 1;

/// Attempts per download before giving up.
const ATTEMPTS: u32 = 5;

/// The digest a file must have.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Expected {
    Sha256(String),
    Blake3(String),
    /// Git's blob id: SHA-1 of `blob <length>\0` and the bytes (`git hash-object`).
    #[serde(rename = "git_blob")]
    GitBlob(String),
}

impl Expected {
    /// The digest a spec gives (at most one, validated), lower-cased.
    pub fn from_spec(
        sha256: &Option<String>,
        blake3: &Option<String>,
        git_blob: &Option<String>,
    ) -> Option<Expected> {
        match (sha256, blake3, git_blob) {
            (Some(h), _, _) => Some(Expected::Sha256(h.to_ascii_lowercase())),
            (None, Some(h), _) => Some(Expected::Blake3(h.to_ascii_lowercase())),
            (None, None, Some(h)) => Some(Expected::GitBlob(h.to_ascii_lowercase())),
            (None, None, None) => None,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Expected::Sha256(_) => "sha256",
            Expected::Blake3(_) => "blake3",
            Expected::GitBlob(_) => "git blob id",
        }
    }

    fn hex(&self) -> &str {
        match self {
            Expected::Sha256(h) | Expected::Blake3(h) | Expected::GitBlob(h) => h,
        }
    }

    /// The same kind of digest of `bytes`.
    pub fn of(&self, bytes: &[u8]) -> String {
        match self {
            Expected::Sha256(_) => hex(&sha2::Sha256::digest(bytes)),
            Expected::Blake3(_) => {
                upcc_engine::Digest::<upcc_engine::Artifact>::of_bytes(bytes).to_hex()
            }
            Expected::GitBlob(_) => git_blob_id(bytes),
        }
    }

    fn matches(&self, bytes: &[u8]) -> bool {
        self.of(bytes).eq_ignore_ascii_case(self.hex())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What `git hash-object` prints for a file of these bytes.
pub fn git_blob_id(bytes: &[u8]) -> String {
    use sha1::Digest as _;
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {}\0", bytes.len()).as_bytes());
    h.update(bytes);
    hex(&h.finalize())
}

/// Parameters of a fetch node: the URL and the digest are the key (the local copy and the
/// mirror are only places to look).
#[derive(Serialize)]
pub struct FetchTask {
    pub url: String,
    /// Absent when the spec gives none: the URL alone then names the bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<Expected>,
    #[serde(skip)]
    pub local: Option<PathBuf>,
    /// The folder of dataset files put there by hand, for offline machines
    /// (`$UPCC_DATA_MIRROR`, which the command line reads): a file of the URL's name there is
    /// used when its digest matches.
    #[serde(skip)]
    pub mirror: Option<PathBuf>,
    #[serde(skip)]
    pub context: String,
}

/// The file name a URL ends in (what the mirror folder holds).
pub fn file_name(url: &str) -> &str {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    path.rsplit('/')
        .next()
        .filter(|n| !n.is_empty())
        .unwrap_or("download")
}

impl FetchTask {
    /// A local candidate's bytes when it has the right digest (or, without a digest, when it
    /// is the spec's own copy).
    fn local_copy(&self, path: &Path, explicit: bool, ctx: &mut TaskContext) -> Option<Vec<u8>> {
        let bytes = fs_err::read(path).ok()?;
        match &self.digest {
            Some(d) if d.matches(&bytes) => {
                ctx.log(format!(
                    "{}: using {} ({} digest matches)",
                    self.context,
                    path.display(),
                    d.name()
                ));
                Some(bytes)
            }
            Some(d) => {
                ctx.log(format!(
                    "{}: ignoring {}: its {} is {}, not {}",
                    self.context,
                    path.display(),
                    d.name(),
                    d.of(&bytes),
                    d.hex()
                ));
                None
            }
            None if explicit => Some(bytes),
            None => None,
        }
    }

    fn download(&self, ctx: &mut TaskContext) -> std::result::Result<Vec<u8>, TaskError> {
        let part = std::env::temp_dir().join(format!(
            "upcc-fetch-{}.part",
            upcc_engine::Digest::<upcc_engine::Artifact>::of_bytes(self.url.as_bytes()).short()
        ));
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_connect(Some(Duration::from_secs(30)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            // The whole body of one attempt (datasets run to hundreds of MB); a broken
            // transfer resumes on the next attempt.
            .timeout_recv_body(Some(Duration::from_secs(3600)))
            .http_status_as_error(false)
            .build()
            .into();
        let mut last_error = String::new();
        for attempt in 1..=ATTEMPTS {
            if attempt > 1 {
                std::thread::sleep(Duration::from_millis(200 * (1 << (attempt - 2).min(5))));
            }
            match self.try_download(&agent, &part, ctx) {
                Ok(Attempt::Done(bytes)) => {
                    let _ = fs_err::remove_file(&part);
                    return Ok(bytes);
                }
                Ok(Attempt::Retry(why)) => {
                    ctx.log(format!(
                        "{}: attempt {attempt} of {ATTEMPTS} failed: {why}",
                        self.context
                    ));
                    last_error = why;
                }
                Err(e) => {
                    let _ = fs_err::remove_file(&part);
                    return Err(e);
                }
            }
        }
        Err(TaskError::Failed(format!(
            "{}: could not download {} after {ATTEMPTS} attempts: {last_error} (the partial file {} is kept and resumed next time; offline, put the file into $UPCC_DATA_MIRROR)",
            self.context,
            self.url,
            part.display()
        )))
    }

    /// One attempt: the bytes when complete, `Retry` after a transient failure, an error for
    /// what retrying cannot fix.
    fn try_download(
        &self,
        agent: &ureq::Agent,
        part: &Path,
        ctx: &mut TaskContext,
    ) -> std::result::Result<Attempt, TaskError> {
        let have = fs_err::metadata(part).map(|m| m.len()).unwrap_or(0);
        let mut req = agent.get(&self.url);
        if have > 0 {
            req = req.header("Range", &format!("bytes={have}-"));
        }
        let mut resp = match req.call() {
            Ok(r) => r,
            Err(e) => return Ok(Attempt::Retry(format!("{e}"))),
        };
        let status = resp.status().as_u16();
        let append = match status {
            206 if have > 0 => true,
            200 => false,
            416 if have > 0 => {
                // The partial file is already whole (or longer than the file): start over.
                let _ = fs_err::remove_file(part);
                return Ok(Attempt::Retry(
                    "the server refused to resume; starting over".into(),
                ));
            }
            404 | 410 | 401 | 403 => {
                return Err(TaskError::Input(format!(
                    "{}: {} answered HTTP {status}: check the `url`",
                    self.context, self.url
                )))
            }
            s => return Ok(Attempt::Retry(format!("HTTP {s}"))),
        };
        let total = resp
            .headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .map(|n| if append { n + have } else { n });
        let mut file = match fs_err::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(part)
        {
            Ok(f) => f,
            Err(e) => {
                return Err(TaskError::Failed(format!(
                    "cannot write {}: {e}",
                    part.display()
                )))
            }
        };
        let mut done = if append { have } else { 0 };
        let mut reader = resp.body_mut().as_reader();
        let mut buf = vec![0u8; 1 << 16];
        let mut last_report = 0u64;
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => {
                    let _ = file.flush();
                    return Ok(Attempt::Retry(format!(
                        "the transfer broke off after {done} bytes: {e}"
                    )));
                }
            };
            if let Err(e) = file.write_all(&buf[..n]) {
                return Err(TaskError::Failed(format!(
                    "cannot write {}: {e}",
                    part.display()
                )));
            }
            done += n as u64;
            if done - last_report >= 1 << 20 {
                last_report = done;
                ctx.progress(done, total.unwrap_or(0), format!("{} MB", done >> 20));
            }
        }
        drop(file);
        if let Some(t) = total {
            if done < t {
                return Ok(Attempt::Retry(format!(
                    "the transfer broke off after {done} of {t} bytes"
                )));
            }
        }
        match fs_err::read(part) {
            Ok(b) => Ok(Attempt::Done(b)),
            Err(e) => Err(TaskError::Failed(format!(
                "cannot read {}: {e}",
                part.display()
            ))),
        }
    }
}

enum Attempt {
    Done(Vec<u8>),
    Retry(String),
}

impl Task for FetchTask {
    fn run(&self, ctx: &mut TaskContext) -> std::result::Result<(), TaskError> {
        let mirror = self.mirror.as_ref().map(|m| m.join(file_name(&self.url)));
        // A local copy is used only when its digest matched (or it is the spec's own copy
        // and there is no digest), so only a download still needs checking.
        let local = self
            .local
            .as_ref()
            .and_then(|p| self.local_copy(p, true, ctx))
            .or_else(|| mirror.as_ref().and_then(|m| self.local_copy(m, false, ctx)));
        let (bytes, checked) = match local {
            Some(b) => (b, true),
            None => {
                ctx.log(format!("{}: downloading {}", self.context, self.url));
                (self.download(ctx)?, false)
            }
        };
        // One hash of the bytes: the digest the spec names, SHA-256 for the manifest.
        let sha256 = match &self.digest {
            Some(Expected::Sha256(h)) if checked => h.clone(),
            _ => hex(&sha2::Sha256::digest(&bytes)),
        };
        match &self.digest {
            Some(d) if !checked => {
                let actual = match d {
                    Expected::Sha256(_) => sha256.clone(),
                    _ => d.of(&bytes),
                };
                if !actual.eq_ignore_ascii_case(d.hex()) {
                    return Err(TaskError::Input(format!(
                        "{}: {} has {} {actual}, but the spec expects {}; nothing was stored (a changed file upstream, or a wrong digest in the spec)",
                        self.context,
                        self.url,
                        d.name(),
                        d.hex()
                    )));
                }
                ctx.log(format!(
                    "{}: {} bytes, {} verified",
                    self.context,
                    bytes.len(),
                    d.name()
                ));
            }
            Some(_) => {}
            None => ctx.log(format!(
                "{}: {} bytes, no digest to check against; pin them with `sha256: {sha256}`",
                self.context,
                bytes.len()
            )),
        }
        ctx.summary("bytes", bytes.len() as u64);
        ctx.summary("sha256", sha256);
        let name = file_name(&self.url).to_string();
        ctx.put_output("data", bytes, "application/octet-stream", &name);
        Ok(())
    }
}

/// The fetch nodes of a dataset file (output `data` each): one, or one per part of a file
/// published in parts, in order. Returns (input name, node, what messages call it).
pub fn wire(w: &mut Wiring, dataset: &str, role: &str) -> Result<Vec<(String, usize, String)>> {
    let d = &w.spec.file.datasets[dataset];
    let f: &FetchSpec = &d.fetch[role];
    if f.parts.is_empty() {
        let url = f.url.clone().expect("validated: a url or parts");
        let local = d
            .files
            .get(role)
            .filter(|p| !p.starts_with("embedded:"))
            .map(|p| w.spec.resolve_path(p));
        let task = FetchTask {
            url: url.clone(),
            digest: Expected::from_spec(&f.sha256, &f.blake3, &f.git_blob),
            local,
            mirror: w.data_mirror.clone(),
            context: format!("dataset `{dataset}`, file `{role}`"),
        };
        let node = wire_one(w, dataset, format!("fetch/{dataset}/{role}"), task)?;
        return Ok(vec![(role.to_string(), node, url)]);
    }
    let parts: Vec<(String, Option<Expected>)> = f
        .parts
        .iter()
        .map(|p| {
            (
                p.url.clone(),
                Expected::from_spec(&p.sha256, &p.blake3, &p.git_blob),
            )
        })
        .collect();
    let mut out = Vec::new();
    for (k, (url, digest)) in parts.into_iter().enumerate() {
        let n = k + 1;
        let task = FetchTask {
            url: url.clone(),
            digest,
            local: None,
            mirror: w.data_mirror.clone(),
            context: format!("dataset `{dataset}`, file `{role}` part {n}"),
        };
        let node = wire_one(w, dataset, format!("fetch/{dataset}/{role}.part{n}"), task)?;
        out.push((format!("{role}.part{n}"), node, url));
    }
    Ok(out)
}

fn wire_one(w: &mut Wiring, dataset: &str, id: String, task: FetchTask) -> Result<usize> {
    w.add(NodeSpec {
        id,
        stage: "fetch",
        version: VERSION,
        numerics: Numerics::Exact,
        inputs: vec![],
        outputs: &["data"],
        labels: labels("fetch", [(Axis::Dataset, dataset.to_string())]),
        resources: Wiring::small(1024),
        task,
    })
}
