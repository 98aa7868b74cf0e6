//! The `fetch` stage against a real HTTP server on the loopback interface, started by the
//! test: download, digest check, resume after an interrupted transfer, a wrong digest, a 404,
//! and offline use from a mirror folder or a local copy.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use sha2::Digest as _;

use crate::util::*;

/// A small HTTP/1.1 server: `/blobs.csv` serves `body` (honouring `Range: bytes=N-`), the
/// first plain GET cut off halfway when `cut_first`; anything else is 404. It records each
/// request's path and Range header.
/// (path, Range header) of each request.
type Requests = Vec<(String, Option<String>)>;

struct Server {
    port: u16,
    requests: Arc<Mutex<Requests>>,
}

impl Server {
    fn start(body: Vec<u8>, cut_first: bool) -> Server {
        Self::serving(vec![("/blobs.csv".to_string(), body)], cut_first)
    }

    /// A server of several files, by path.
    fn serving(files: Vec<(String, Vec<u8>)>, cut_first: bool) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let log = requests.clone();
        std::thread::spawn(move || {
            let mut cut = cut_first;
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                serve(stream, &files, &mut cut, &log);
            }
        });
        Server { port, requests }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn requests(&self) -> Requests {
        self.requests.lock().unwrap().clone()
    }
}

fn serve(
    mut stream: TcpStream,
    files: &[(String, Vec<u8>)],
    cut: &mut bool,
    log: &Mutex<Requests>,
) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut first = String::new();
    if reader.read_line(&mut first).is_err() {
        return;
    }
    let path = first.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut range = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("range:") {
            range = Some(v.trim().to_string());
        }
    }
    log.lock().unwrap().push((path.clone(), range.clone()));
    let Some((_, body)) = files.iter().find(|(p, _)| *p == path) else {
        let _ = stream
            .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        return;
    };
    match range.and_then(|r| {
        r.strip_prefix("bytes=")?
            .strip_suffix('-')?
            .parse::<usize>()
            .ok()
    }) {
        Some(from) if from < body.len() => {
            let rest = &body[from..];
            let head = format!(
                "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {from}-{}/{}\r\nConnection: close\r\n\r\n",
                rest.len(),
                body.len() - 1,
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(rest);
        }
        _ => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            if *cut {
                // The connection drops halfway through.
                *cut = false;
                let _ = stream.write_all(&body[..body.len() / 2]);
            } else {
                let _ = stream.write_all(body);
            }
        }
    }
    let _ = stream.flush();
}

fn sha256(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// TINY_SPEC with blobs fetched from `url` (with `digest`), keeping `files` if given.
fn spec_fetching(url: &str, digest: &str, files: &str) -> String {
    TINY_SPEC.replacen(
        "    files: {data: blobs.csv}\n",
        &format!("{files}    fetch: {{data: {{url: \"{url}\", sha256: {digest}}}}}\n"),
        1,
    )
}

fn blobs(env: &Env) -> Vec<u8> {
    std::fs::read(env.path("blobs.csv")).unwrap()
}

#[test]
fn a_dataset_is_downloaded_resumed_verified_and_stored_once() {
    let env = Env::new();
    let body = blobs(&env);
    let server = Server::start(body.clone(), true);
    env.write(
        "spec.yaml",
        &spec_fetching(&server.url("/blobs.csv"), &sha256(&body), ""),
    );
    let r = env.run_ok(&["stage=features"]);
    assert_eq!(
        ids_with(&r, "executed"),
        ["features/blobs", "fetch/blobs/data"]
    );
    // The first transfer broke off halfway; the retry resumed from there.
    let reqs = server.requests();
    assert_eq!(reqs.len(), 2, "{reqs:?}");
    assert_eq!(reqs[0], ("/blobs.csv".to_string(), None));
    assert_eq!(reqs[1].1, Some(format!("bytes={}-", body.len() / 2)));
    // The stored bytes are the file's; the manifest records its SHA-256.
    let stored = std::fs::read(output_path(&env, "fetch/blobs/data", "data")).unwrap();
    assert_eq!(stored, body);
    let m = manifest(&env, &env.spec(), "fetch/blobs/data", &[]);
    assert_eq!(m["summary"]["sha256"], sha256(&body));
    // Everything else runs from the stored copy: no more requests.
    env.run_ok(&[]);
    assert_eq!(server.requests().len(), 2);
}

#[test]
fn a_wrong_digest_or_a_missing_file_publishes_nothing_and_says_why() {
    let env = Env::new();
    let body = blobs(&env);
    let server = Server::start(body.clone(), false);
    let wrong = "0".repeat(64);
    env.write(
        "spec.yaml",
        &spec_fetching(&server.url("/blobs.csv"), &wrong, ""),
    );
    let spec = env.spec();
    let r = env.upcc(&["run", &spec, "--progress", "none"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains(&format!(
            "has sha256 {}, but the spec expects {wrong}",
            sha256(&body)
        )),
        "{r:?}"
    );
    let s = env.upcc(&["status", &spec, "--json"]);
    let j: serde_json::Value = serde_json::from_str(&s.stdout).unwrap();
    let fetch = j["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == "fetch/blobs/data")
        .unwrap();
    assert_eq!(fetch["status"], "missing", "{j}");
    // A URL the server does not have.
    env.write(
        "spec.yaml",
        &spec_fetching(&server.url("/gone.csv"), &sha256(&body), ""),
    );
    let r = env.upcc(&["run", &spec, "--progress", "none"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("answered HTTP 404"), "{r:?}");
    // Bad digests and URLs are refused before anything runs.
    env.write(
        "spec.yaml",
        &spec_fetching("ftp://example.org/x", "abc", ""),
    );
    let r = env.upcc(&["status", &spec]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains("must be an http:// or https:// URL"),
        "{r:?}"
    );
    assert!(r.stderr.contains("must be 64 hex digits"), "{r:?}");
}

#[test]
fn offline_the_mirror_or_a_local_copy_with_the_right_digest_serves() {
    let env = Env::new();
    let body = blobs(&env);
    // A port nobody listens on: any download attempt would fail.
    let dead = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{dead}/blobs.csv");
    let mirror = env.path("mirror");
    std::fs::create_dir_all(&mirror).unwrap();
    std::fs::write(mirror.join("blobs.csv"), &body).unwrap();
    env.write("spec.yaml", &spec_fetching(&url, &sha256(&body), ""));
    let spec = env.spec();
    let out = env
        .command(
            &env.store(),
            &["run", &spec, "stage=features", "--progress", "none"],
        )
        .env("UPCC_DATA_MIRROR", &mirror)
        .output()
        .unwrap();
    let r = ran(out);
    assert_eq!(r.code, 0, "{r:?}");
    // A local copy named in `files` serves too (fresh store, no mirror).
    env.write(
        "spec.yaml",
        &spec_fetching(&url, &sha256(&body), "    files: {data: blobs.csv}\n"),
    );
    let r = env.upcc_store(
        &env.path("store2"),
        &["run", &spec, "stage=features", "--progress", "none"],
    );
    assert_eq!(r.code, 0, "{r:?}");
}

/// What `git hash-object` prints for `bytes`.
fn git_hash_object(dir: &std::path::Path, bytes: &[u8]) -> String {
    let f = dir.join("blob.bin");
    std::fs::write(&f, bytes).unwrap();
    let out = std::process::Command::new("git")
        .args(["hash-object"])
        .arg(&f)
        .output()
        .expect("git");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn a_file_published_in_parts_is_fetched_part_by_part_checked_by_git_blob_id_and_joined() {
    let env = Env::new();
    let body = blobs(&env);
    let (a, b) = body.split_at(body.len() / 3);
    let (ida, idb) = (
        git_hash_object(env.dir.path(), a),
        git_hash_object(env.dir.path(), b),
    );
    assert_eq!(
        ida,
        upcc_model::stage::fetch::git_blob_id(a),
        "git's own blob id"
    );
    let server = Server::serving(
        vec![
            ("/blobs.csv.part1".into(), a.to_vec()),
            ("/blobs.csv.part2".into(), b.to_vec()),
        ],
        true,
    );
    let parted = |second_id: &str| {
        TINY_SPEC.replacen(
            "    files: {data: blobs.csv}\n",
            &format!(
                "    fetch:\n      data:\n        parts:\n          - {{url: \"{}\", git_blob: {ida}}}\n          - {{url: \"{}\", git_blob: {second_id}}}\n",
                server.url("/blobs.csv.part1"),
                server.url("/blobs.csv.part2")
            ),
            1,
        )
    };
    // A wrong id for part 2: refused, naming the part and both ids; nothing is stored for it.
    let wrong = "0".repeat(40);
    env.write("spec.yaml", &parted(&wrong));
    let r = env.upcc(&["run", &env.spec(), "stage=features", "--progress", "none"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains("file `data` part 2")
            && r.stderr.contains(&idb)
            && r.stderr.contains(&wrong),
        "{r:?}"
    );
    // The right ids: the parts are downloaded (the first resumed after a broken transfer),
    // checked and joined into the same features as the whole file gives.
    env.write("spec.yaml", &parted(&idb));
    let j = env.run_ok(&["stage=features"]);
    let ids: Vec<&str> = j["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&"fetch/blobs/data.part1") && ids.contains(&"fetch/blobs/data.part2"),
        "{ids:?}"
    );
    let joined = std::fs::read(output_path(&env, "features/blobs", "features")).unwrap();
    let whole_env = Env::new();
    whole_env.run_ok(&["stage=features"]);
    let whole = std::fs::read(output_path(&whole_env, "features/blobs", "features")).unwrap();
    assert_eq!(joined, whole, "the joined parts read as the whole file");
    // A digest beside `parts`, or `url` with `parts`, is refused before anything runs.
    let both = parted(&idb).replace(
        "      data:\n        parts:",
        "      data:\n        url: \"http://x/y\"\n        parts:",
    );
    env.write("spec.yaml", &both);
    let r = env.upcc(&["status", &env.spec()]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("gives both `url` and `parts`"), "{r:?}");
}
