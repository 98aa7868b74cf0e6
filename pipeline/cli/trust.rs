//! Whose results this user's commands serve, and the key that signs what they compute.
//!
//! - The signing key: `$UPCC_SIGNING_KEY` (a file), else `signing-key` beside the user config
//!   (`~/.config/upcc/signing-key`). `upcc key generate` makes one; a command that computes
//!   and finds none makes one there and says so once, so every result is signed.
//! - The trusted keys: the user config's `trust.keys` and `$UPCC_TRUSTED_KEYS` (keys separated
//!   by spaces, commas or newlines), plus always one's own.
//! - The policies: `trust.store` and `trust.remote`, each `signed` (the default: only results
//!   signed by a trusted key are served) or `any` (every writer is trusted, as before signing).

use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;
use upcc_engine::{Policy, PublicKey, SecretKey, Trust};
use upcc_model::error::{Error, Result};

/// The user config's `trust:` section.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustSection {
    /// Public keys (`NAME:BASE64`) whose results are served.
    #[serde(default)]
    pub keys: Vec<String>,
    /// The local store's policy.
    #[serde(default)]
    pub store: Policy,
    /// The remote cache's policy.
    #[serde(default)]
    pub remote: Policy,
}

/// Where the signing key lives: `$UPCC_SIGNING_KEY`, else `signing-key` in the user config's
/// folder.
pub fn signing_key_path() -> Option<PathBuf> {
    if let Some(p) = crate::env::signing_key() {
        return Some(p);
    }
    let config = crate::slurm::user_config_path()?;
    Some(config.with_file_name("signing-key"))
}

/// A default name for a new key: `user@host`.
pub fn default_key_name() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "upcc".into());
    let host = upcc_engine::fsutil::host_name();
    format!("{user}@{host}")
        .chars()
        .filter(|c| !c.is_whitespace() && *c != ':' && !c.is_control())
        .take(100)
        .collect()
}

/// Write a new secret key to `path` (0600; never over an existing file): the key. The file
/// appears whole or not at all (written aside, then linked in), so processes that make one at
/// once read the winner's.
pub fn write_new_key(path: &std::path::Path, name: &str) -> Result<SecretKey> {
    use fs_err::os::unix::fs::OpenOptionsExt;
    use std::io::Write;
    let key = SecretKey::generate(name)
        .map_err(|e| Error::user(format!("cannot make a key named `{name}`: {e}")))?;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    fs_err::create_dir_all(dir)
        .map_err(|e| Error::user(format!("cannot make the key's folder: {e}")))?;
    let staged = upcc_engine::fsutil::temp_path(dir);
    let written = (|| -> std::io::Result<()> {
        let mut f = fs_err::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&staged)?;
        f.write_all(format!("{}\n", key.to_text()).as_bytes())?;
        f.sync_all()?;
        fs_err::hard_link(&staged, path)
    })();
    let _ = fs_err::remove_file(&staged);
    written.map_err(|e| {
        let err = Error::user(format!("cannot write the key file `{}`: {e}", path.display()));
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            err.hint("a key is there already: `upcc key show` prints its public half; `--force` replaces it (results it signed stay trusted only where its public key is listed)")
        } else {
            err
        }
    })?;
    Ok(key)
}

/// The secret key at `path`, if there is one.
pub fn read_key(path: &std::path::Path) -> Result<Option<SecretKey>> {
    use std::os::unix::fs::PermissionsExt;
    let text = match fs_err::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::user(format!("cannot read the signing key: {e}"))),
    };
    let key: SecretKey = text.trim().parse().map_err(|e| {
        Error::user(format!(
            "the signing key `{}` is not a key: {e}",
            path.display()
        ))
        .hint("`upcc key generate --force` makes a new one there")
    })?;
    if fs_err::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o077 != 0) {
        eprintln!(
            "upcc: warning: the signing key `{}` can be read by others; `chmod 600 {}`",
            path.display(),
            path.display()
        );
    }
    Ok(Some(key))
}

/// The signing key of a command that computes: read, or made (and announced) where none is.
/// `None` only when there is nowhere to keep one (no `$HOME`, no `$UPCC_SIGNING_KEY`).
fn signing_key(create: bool) -> Result<Option<SecretKey>> {
    let Some(path) = signing_key_path() else {
        return Ok(None);
    };
    if let Some(k) = read_key(&path)? {
        return Ok(Some(k));
    }
    if !create {
        return Ok(None);
    }
    if crate::env::signing_key().is_some() {
        return Err(Error::user(format!(
            "$UPCC_SIGNING_KEY names `{}`, which does not exist",
            path.display()
        ))
        .hint("`upcc key generate --out PATH` makes a key there, or unset UPCC_SIGNING_KEY"));
    }
    match write_new_key(&path, &default_key_name()) {
        Ok(k) => {
            eprintln!(
                "upcc: made a key that signs the results you compute: `{}` (public: {}); `upcc key show` prints it for colleagues to trust",
                path.display(),
                k.public()
            );
            Ok(Some(k))
        }
        // Another process made it meanwhile.
        Err(_) if path.exists() => read_key(&path),
        Err(e) => Err(e),
    }
}

/// The user's trust settings: config file section and `$UPCC_TRUSTED_KEYS`.
fn settings() -> Result<(TrustSection, Vec<PublicKey>, String)> {
    let config = crate::slurm::user_config_path()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "the user config".into());
    let section: TrustSection = match crate::slurm::user_config_trust()? {
        None => TrustSection::default(),
        Some(v) => serde_yaml_ng::from_value(v).map_err(|e| {
            Error::user(format!("`{config}`: trust: {e}"))
                .hint("`trust:` holds `keys: [NAME:BASE64, …]`, `store: signed|any` and `remote: signed|any`")
        })?,
    };
    let mut keys = Vec::new();
    for (i, text) in section.keys.iter().enumerate() {
        keys.push(text.parse::<PublicKey>().map_err(|e| {
            Error::user(format!("`{config}`: trust.keys[{i}] `{text}`: {e}"))
                .hint("a public key is NAME:BASE64, as `upcc key show` prints it")
        })?);
    }
    if let Some(env) = crate::env::trusted_keys() {
        for text in env
            .split(|c: char| c.is_whitespace() || c == ',')
            .filter(|t| !t.is_empty())
        {
            keys.push(text.parse::<PublicKey>().map_err(|e| {
                Error::user(format!("$UPCC_TRUSTED_KEYS: `{text}`: {e}"))
                    .hint("keys are NAME:BASE64, as `upcc key show` prints them, separated by spaces or commas")
            })?);
        }
    }
    let where_ = format!("`{config}` or $UPCC_TRUSTED_KEYS");
    Ok((section, keys, where_))
}

/// The local store's trust, with the signing key (made if `compute` and none exists).
pub fn store_trust(compute: bool) -> Result<Arc<Trust>> {
    let (section, keys, where_) = settings()?;
    let signer = signing_key(compute)?;
    if compute && signer.is_none() && section.store == Policy::Signed {
        return Err(Error::user(
            "there is nowhere to keep the key that signs your results (no $HOME)".to_string(),
        )
        .hint("set UPCC_SIGNING_KEY=PATH to a key file (`upcc key generate --out PATH`), or `trust: {store: any}` in the user config"));
    }
    Ok(Arc::new(Trust::new(section.store, keys, signer, where_)))
}

/// The remote cache's trust (the signing key only to trust one's own uploads).
pub fn remote_trust() -> Result<Arc<Trust>> {
    let (section, keys, where_) = settings()?;
    let signer = signing_key(false)?;
    Ok(Arc::new(Trust::new(section.remote, keys, signer, where_)))
}
