//! Small filesystem helpers: atomic writes, directory fsync, timestamps.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// This host's name, for provenance and for naming temporary files.
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is a valid writable buffer of the given length.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        let s = String::from_utf8_lossy(&buf[..end]).to_string();
        if !s.is_empty() {
            return s;
        }
    }
    "unknown-host".to_string()
}

/// A fresh temporary path inside `tmp_dir`, named after host and pid so that `verify` can tell
/// leftovers of dead processes from files being written right now.
pub fn temp_path(tmp_dir: &Path) -> PathBuf {
    let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    tmp_dir.join(format!(
        "{}--{}--{}-{:08x}.tmp",
        sanitize(&host_name()),
        std::process::id(),
        n,
        nanos
    ))
}

/// Parses a temp file name back into (host, pid).
pub fn temp_owner(name: &str) -> Option<(String, u32)> {
    let mut parts = name.split("--");
    let host = parts.next()?.to_string();
    let pid = parts.next()?.parse().ok()?;
    Some((host, pid))
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Whether a process with this pid is alive on this host.
pub fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// fsync a directory so that a rename inside it is durable.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    let f = fs_err::File::open(dir)?;
    f.sync_all()
}

/// Write `bytes` to `dest` atomically: temp file in `tmp_dir` (same filesystem), fsync, set
/// `mode`, rename into place, fsync the directory. Readers see the old file or the whole new one.
pub fn atomic_write(tmp_dir: &Path, dest: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = temp_path(tmp_dir);
    let result = (|| {
        let mut f = fs_err::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs_err::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))?;
        if let Some(parent) = dest.parent() {
            fs_err::create_dir_all(parent)?;
        }
        fs_err::rename(&tmp, dest)?;
        if let Some(parent) = dest.parent() {
            sync_dir(parent)?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs_err::remove_file(&tmp);
    }
    result
}

/// Seconds since the epoch as an RFC 3339 UTC timestamp (second precision).
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Howard Hinnant's days → civil date algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Peak resident set size of this process so far, in bytes (Linux; `None` elsewhere).
pub fn peak_rss_bytes() -> Option<u64> {
    let status = fs_err::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Open `path` for reading only if it is a regular file: a symbolic link is not followed (a
/// link planted in a store or a `file://` remote could point anywhere: `/dev/zero`, a FIFO,
/// another user's files) and a FIFO, socket or device is refused without blocking on it.
/// The error is `InvalidData` naming what was found.
#[allow(clippy::disallowed_methods)] // the error is given the path below
pub fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("`{}` is a symbolic link, not a file", path.display()),
                )
            } else {
                std::io::Error::new(e.kind(), format!("`{}`: {e}", path.display()))
            }
        })?;
    let kind = f.metadata()?.file_type();
    if !kind.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "`{}` is {}, not a regular file",
                path.display(),
                kind_name(kind)
            ),
        ));
    }
    Ok(f)
}

/// What a file that is not a regular file is, in words.
pub fn kind_name(kind: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a named pipe (FIFO)"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_block_device() || kind.is_char_device() {
        "a device"
    } else if kind.is_file() {
        "a regular file"
    } else {
        "something other than a file"
    }
}

/// The bytes of regular file `path` ([`open_regular`]), at most `cap` of them: a file larger
/// than `cap` is `InvalidData`, read no further.
pub fn read_regular_capped(path: &Path, cap: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let f = open_regular(path)?;
    let mut out = Vec::new();
    f.take(cap.saturating_add(1)).read_to_end(&mut out)?;
    if out.len() as u64 > cap {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("`{}` is larger than {cap} bytes", path.display()),
        ));
    }
    Ok(out)
}

/// The name of user `uid` from `/etc/passwd`, else `uid N`.
fn user_name(uid: u32) -> String {
    fs_err::read_to_string("/etc/passwd")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.len() > 2 && f[2] == uid.to_string()).then(|| format!("user `{}`", f[0]))
            })
        })
        .unwrap_or_else(|| format!("uid {uid}"))
}

/// After "Permission denied" on `path` in a store: whose folder it is and how a store is
/// shared between users.
pub fn permission_note(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let mut at = Some(path);
    while let Some(p) = at {
        if let Ok(m) = fs_err::metadata(p) {
            if m.is_dir() {
                let owner = user_name(m.uid());
                return if m.mode() & 0o020 == 0 {
                    format!(
                        "`{}` belongs to {owner} and is not group-writable: the store is not shared. A store several users compute into is created group-shared (`UPCC_STORE_SHARED=1`, README: Sharing a store); otherwise use a store of your own (--store DIR)",
                        p.display()
                    )
                } else {
                    format!(
                        "`{}` belongs to {owner} and its group may write: check that you are a member of its group (`id`)",
                        p.display()
                    )
                };
            }
        }
        at = p.parent();
    }
    String::new()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
            "2023-11-14T22:13:20Z"
        );
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00Z"
        );
    }

    #[test]
    fn temp_names_carry_their_owner() {
        let p = temp_path(Path::new("/tmp"));
        let name = p.file_name().unwrap().to_str().unwrap();
        let (_, pid) = temp_owner(name).unwrap();
        assert_eq!(pid, std::process::id());
    }

    #[test]
    fn atomic_write_replaces_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("a/b.txt");
        atomic_write(dir.path(), &dest, b"one", 0o644).unwrap();
        atomic_write(dir.path(), &dest, b"two", 0o644).unwrap();
        assert_eq!(fs_err::read(&dest).unwrap(), b"two");
        let leftovers: Vec<_> = fs_err::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == "tmp"))
            .collect();
        assert!(leftovers.is_empty());
    }
}
