//! The remote cache against a real S3-compatible server (moto's, from PyPI) started by each
//! test on the loopback interface: two stores sharing one bucket compute each node once, a
//! flipped byte in the bucket is refused, killed uploads and downloads leave nothing served,
//! a server stopped mid-run loses nothing, `push`/`pull`, `gc --remote`. Faults are made from
//! outside upcc: a byte-level TCP proxy between upcc and the server holds the request a test
//! names, and the test kills upcc (or the server) while it is held.
//!
//! The server needs Python with `moto[server]` ($UPCC_TEST_PYTHON, as `.ci/run` installs it);
//! without it these tests skip, unless UPCC_TEST_S3=1 (CI) makes that a failure. The `file://`
//! test needs nothing.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::aws::AmazonS3Builder;
use object_store::path::Path as OsPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::util::*;

const BUCKET: &str = "upcc-test";

/// A moto S3 server on a free loopback port, stopped on drop.
struct S3Server {
    child: Option<Child>,
    port: u16,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl S3Server {
    /// Start the server and create the bucket; `None` (the test skips) without moto.
    fn start() -> Option<S3Server> {
        let python = std::env::var("UPCC_TEST_PYTHON").ok();
        let has_moto = python.as_ref().is_some_and(|p| {
            Command::new(p)
                .args(["-c", "import moto.server, flask"])
                .status()
                .is_ok_and(|s| s.success())
        });
        if !has_moto {
            assert!(
                std::env::var_os("UPCC_TEST_S3").is_none(),
                "UPCC_TEST_S3 is set but $UPCC_TEST_PYTHON has no moto[server] (`pip install 'moto[server]'`)"
            );
            eprintln!("skipped: no Python with moto[server] in $UPCC_TEST_PYTHON");
            return None;
        }
        let port = free_port();
        let child = Command::new(python.unwrap())
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto");
        let server = S3Server {
            child: Some(child),
            port,
        };
        let t0 = Instant::now();
        loop {
            let created = ureq::put(&format!("http://127.0.0.1:{port}/{BUCKET}")).send_empty();
            if created.is_ok() {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "moto did not start: {created:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        Some(server)
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A client of the bucket for the test itself (credentials given, not from the environment).
    fn client(&self) -> Client {
        let store = AmazonS3Builder::new()
            .with_endpoint(self.endpoint())
            .with_bucket_name(BUCKET)
            .with_access_key_id("test")
            .with_secret_access_key("test")
            .with_region("us-east-1")
            .with_allow_http(true)
            .build()
            .unwrap();
        Client {
            store: Arc::new(store),
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Client {
    store: Arc<dyn ObjectStore>,
    rt: tokio::runtime::Runtime,
}

impl Client {
    fn list(&self, prefix: &str) -> Vec<(String, u64)> {
        use futures_util::TryStreamExt;
        let p = OsPath::from(prefix);
        let metas: Vec<object_store::ObjectMeta> = self
            .rt
            .block_on(async { self.store.list(Some(&p)).try_collect().await })
            .unwrap();
        let mut v: Vec<_> = metas
            .into_iter()
            .map(|m| (m.location.to_string(), m.size))
            .collect();
        v.sort();
        v
    }
    fn get(&self, path: &str) -> Vec<u8> {
        let p = OsPath::from(path);
        self.rt
            .block_on(async { self.store.get(&p).await.unwrap().bytes().await.unwrap() })
            .to_vec()
    }
    fn put(&self, path: &str, bytes: Vec<u8>) {
        let p = OsPath::from(path);
        self.rt
            .block_on(async { self.store.put(&p, PutPayload::from(bytes)).await })
            .unwrap();
    }

    /// Every manifest on the remote lists objects the remote holds whole (what "nothing
    /// half-uploaded is served" means), and every object hashes to its name.
    fn assert_consistent(&self, prefix: &str) {
        let objects: std::collections::BTreeMap<String, u64> = self
            .list(&format!("{prefix}/objects"))
            .into_iter()
            .collect();
        for (path, _) in self.list(&format!("{prefix}/nodes")) {
            let m: serde_json::Value = serde_json::from_slice(&self.get(&path)).unwrap();
            for (name, o) in m["outputs"].as_object().unwrap() {
                let d = o["digest"].as_str().unwrap();
                let op = format!("{prefix}/objects/{}/{}", &d[..2], &d[2..]);
                assert_eq!(
                    objects.get(&op).copied(),
                    o["bytes"].as_u64(),
                    "manifest {path} lists output `{name}` ({op}), which the remote does not hold whole"
                );
            }
        }
        for path in objects.keys() {
            let bytes = self.get(path);
            let name: String = path
                .rsplit('/')
                .take(2)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            assert_eq!(blake3::hash(&bytes).to_hex().to_string(), name, "{path}");
        }
    }
}

/// `upcc` with the server's endpoint and credentials in its environment.
fn upcc_s3(env: &Env, store: &str, endpoint: &str, args: &[&str]) -> Command {
    let mut c = env.command(&env.path(store), args);
    c.env("AWS_ENDPOINT_URL", endpoint)
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env_remove("UPCC_REMOTE")
        .env_remove("AWS_PROFILE");
    c
}

/// `upcc ARGS` against `store` with the server's environment, waited for.
fn s3(env: &Env, store: &str, endpoint: &str, args: &[&str]) -> Ran {
    ran(upcc_s3(env, store, endpoint, args).output().unwrap())
}

/// `upcc run` of the tiny spec started in the background through `endpoint`, output discarded.
fn spawn_run(env: &Env, store: &str, endpoint: &str) -> Child {
    let spec = env.spec();
    upcc_s3(
        env,
        store,
        endpoint,
        &["run", &spec, "--progress", "none", "--remote", REMOTE],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap()
}

fn run_json(env: &Env, store: &str, endpoint: &str, remote: &str) -> (serde_json::Value, Ran) {
    run_spec(env, store, endpoint, remote, &env.spec())
}

/// `run SPEC --json --remote REMOTE` against `store`; asserts success.
fn run_spec(
    env: &Env,
    store: &str,
    endpoint: &str,
    remote: &str,
    spec: &str,
) -> (serde_json::Value, Ran) {
    let args = [
        "run",
        spec,
        "--json",
        "--progress",
        "none",
        "--remote",
        remote,
    ];
    let r = s3(env, store, endpoint, &args);
    assert_eq!(r.code, 0, "{r:?}");
    (r.json(), r)
}

fn tables(report: &serde_json::Value) -> String {
    report["tables"].to_string()
}

fn verify_intact(env: &Env, store: &str) {
    let v = env.upcc_store(&env.path(store), &["verify"]);
    assert_eq!(v.code, 0, "{v:?}");
    assert!(v.stdout.contains("store is intact"), "{v:?}");
}

const REMOTE: &str = "s3://upcc-test/team";

#[test]
fn two_stores_sharing_a_bucket_compute_each_node_once() {
    let Some(server) = S3Server::start() else {
        return;
    };
    let env = Env::new();
    let ep = server.endpoint();
    let (a, _) = run_json(&env, "a", &ep, REMOTE);
    assert_eq!(a["executed"], TINY_NODES);
    assert_eq!(a["remote"]["stats"]["nodes_uploaded"], TINY_NODES);
    // A third store sees, before running anything, that the remote answers every node.
    let spec = env.spec();
    let s = s3(
        &env,
        "b",
        &ep,
        &["status", &spec, "--json", "--remote", REMOTE],
    );
    assert_eq!(s.code, 0, "{s:?}");
    assert_eq!(s.json()["remote"]["answers"], TINY_NODES, "{s:?}");
    let (b, _) = run_json(&env, "b", &ep, REMOTE);
    assert_eq!(b["executed"], 0, "{b}");
    assert_eq!(b["downloaded"], TINY_NODES, "{b}");
    assert_eq!(tables(&a), tables(&b));
    verify_intact(&env, "b");
    // The downloaded results are the computed ones, byte for byte.
    for (x, y) in keys(&a).iter().zip(keys(&b).iter()) {
        assert_eq!(x, y);
    }
    server.client().assert_consistent("team");
    // And once here, they are plain cached results.
    let (again, _) = run_json(&env, "b", &ep, REMOTE);
    assert_eq!(
        (again["cached"].as_u64(), again["downloaded"].as_u64()),
        (Some(TINY_NODES as u64), Some(0))
    );
}

#[test]
fn a_flipped_byte_in_the_bucket_is_refused_and_repaired() {
    let Some(server) = S3Server::start() else {
        return;
    };
    let env = Env::new();
    let ep = server.endpoint();
    let (a, _) = run_json(&env, "a", &ep, REMOTE);
    // Flip one byte of the table node's rendered output on the remote.
    let table_key = a["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == "table/main")
        .unwrap()["key"]
        .as_str()
        .unwrap()
        .to_string();
    let client = server.client();
    let m: serde_json::Value = serde_json::from_slice(&client.get(&format!(
        "team/nodes/{}/{}.json",
        &table_key[..2],
        &table_key[2..]
    )))
    .unwrap();
    let (_, out) = m["outputs"].as_object().unwrap().iter().next().unwrap();
    let d = out["digest"].as_str().unwrap();
    let path = format!("team/objects/{}/{}", &d[..2], &d[2..]);
    let mut bytes = client.get(&path);
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    client.put(&path, bytes);

    let (b, r) = run_json(&env, "b", &ep, REMOTE);
    assert!(
        r.stderr.contains(&format!("remote object {}", &d[..12]))
            && r.stderr.contains("is corrupt"),
        "the refusal is reported: {r:?}"
    );
    assert_eq!(
        b["executed"], 1,
        "only the node whose object was corrupt is computed: {b}"
    );
    assert_eq!(b["downloaded"], TINY_NODES - 1);
    assert_eq!(b["remote"]["stats"]["refused"], 1);
    assert_eq!(tables(&a), tables(&b));
    verify_intact(&env, "b");
    // The node computed here re-uploaded the object: the bucket is whole again.
    client.assert_consistent("team");
}

/// A byte-level proxy to `upstream` that forwards `skip` requests whose bytes contain
/// `pattern`, holds (stops forwarding) the next one, tells the test it did, and cuts that
/// connection when released.
struct Proxy {
    port: u16,
    held: Arc<AtomicBool>,
    released: Arc<AtomicBool>,
    requests: Arc<AtomicUsize>,
}

impl Proxy {
    fn start(upstream: u16, pattern: &'static str, skip: usize) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let held = Arc::new(AtomicBool::new(false));
        let released = Arc::new(AtomicBool::new(false));
        let armed = Arc::new(AtomicBool::new(true));
        let matches = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let (h, a, n, rel, m) = (
            held.clone(),
            armed,
            requests.clone(),
            released.clone(),
            matches,
        );
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let (h, a, n, rel, m) = (h.clone(), a.clone(), n.clone(), rel.clone(), m.clone());
                let (mut c_read, mut s_write) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (mut s_read, mut c_write) = (server, client);
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 1 << 16];
                    let mut tail: Vec<u8> = Vec::new();
                    loop {
                        let k = match c_read.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(k) => k,
                        };
                        tail.extend_from_slice(&buf[..k]);
                        let hit = tail.windows(pattern.len()).any(|w| w == pattern.as_bytes());
                        n.fetch_add(1, Ordering::SeqCst);
                        if hit
                            && m.fetch_add(1, Ordering::SeqCst) >= skip
                            && a.swap(false, Ordering::SeqCst)
                        {
                            h.store(true, Ordering::SeqCst);
                            // Held: never forwarded; cut when released.
                            while !rel.load(Ordering::SeqCst) {
                                std::thread::sleep(Duration::from_millis(20));
                            }
                            let _ = c_read.shutdown(std::net::Shutdown::Both);
                            let _ = s_write.shutdown(std::net::Shutdown::Both);
                            return;
                        }
                        let keep = tail.len().saturating_sub(pattern.len());
                        tail.drain(..keep);
                        if s_write.write_all(&buf[..k]).is_err() {
                            return;
                        }
                    }
                });
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut s_read, &mut c_write);
                    // The server closed (or died): the client sees it close, as it would
                    // without the proxy.
                    let _ = c_write.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        Proxy {
            port,
            held,
            released,
            requests,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn wait_held(&self, child: &mut Child) {
        let t0 = Instant::now();
        while !self.held.load(Ordering::SeqCst) {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "upcc ended ({status}) before the proxy held a request ({} chunks seen)",
                    self.requests.load(Ordering::SeqCst)
                );
            }
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "no request was held"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Cut the held connection.
    fn release(&self) {
        self.released.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.release();
    }
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_killed_upload_leaves_nothing_served() {
    let Some(server) = S3Server::start() else {
        return;
    };
    let env = Env::new();
    // Upcc is killed while an object upload is held, after some nodes were uploaded whole:
    // what is on the remote is consistent (a manifest written before its objects would show).
    let proxy = Proxy::start(server.port, "PUT /upcc-test/team/objects/", 6);
    let mut a = spawn_run(&env, "a", &proxy.endpoint());
    proxy.wait_held(&mut a);
    kill(&mut a);
    let client = server.client();
    assert!(
        client.list("team/objects").len() >= 6 && !client.list("team/nodes").is_empty(),
        "some nodes were uploaded before the held one"
    );
    client.assert_consistent("team");
    verify_intact(&env, "a");
    // Both stores finish from here and agree with an uninterrupted run.
    let ep = server.endpoint();
    let (a2, _) = run_json(&env, "a", &ep, REMOTE);
    let (b, _) = run_json(&env, "b", &ep, REMOTE);
    let (reference, _) = run_json(&env, "reference", &ep, "off");
    assert_eq!(tables(&a2), tables(&reference));
    assert_eq!(tables(&b), tables(&reference));
    verify_intact(&env, "a");
    verify_intact(&env, "b");
    client.assert_consistent("team");
}

#[test]
fn a_killed_download_leaves_the_store_consistent() {
    let Some(server) = S3Server::start() else {
        return;
    };
    let env = Env::new();
    let ep = server.endpoint();
    let (a, _) = run_json(&env, "a", &ep, REMOTE);
    // B is killed while one of its object downloads is held.
    let proxy = Proxy::start(server.port, "GET /upcc-test/team/objects/", 3);
    let mut b = spawn_run(&env, "b", &proxy.endpoint());
    proxy.wait_held(&mut b);
    kill(&mut b);
    verify_intact(&env, "b");
    let (b2, _) = run_json(&env, "b", &ep, REMOTE);
    assert_eq!(b2["executed"], 0, "{b2}");
    assert_eq!(tables(&a), tables(&b2));
    verify_intact(&env, "b");
}

#[test]
fn the_server_stopped_mid_run_loses_nothing() {
    let Some(mut server) = S3Server::start() else {
        return;
    };
    let env = Env::new();
    let spec = env.spec();
    let (reference, _) = run_json(&env, "reference", &server.endpoint(), "off");
    // Hold the third manifest upload, stop the server, let the run go on without it.
    let proxy = Proxy::start(server.port, "PUT /upcc-test/team/nodes/", 2);
    let mut a = upcc_s3(
        &env,
        "a",
        &proxy.endpoint(),
        &[
            "run",
            &spec,
            "--json",
            "--progress",
            "none",
            "--remote",
            REMOTE,
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    proxy.wait_held(&mut a);
    server.stop();
    // The held connection is cut as a stopped server's would be; new ones find no server.
    proxy.release();
    let r = ran(a.wait_with_output().unwrap());
    assert_eq!(r.code, 0, "the run goes on locally: {r:?}");
    let warnings = r.stderr.matches("cannot be used").count();
    assert_eq!(warnings, 1, "one warning about the remote: {r:?}");
    let j = r.json();
    assert_eq!(j["executed"], TINY_NODES, "{j}");
    assert_eq!(tables(&j), tables(&reference));
    verify_intact(&env, "a");
    // A remote that is not there at all (the stopped server's port): one warning,
    // everything computed locally, exit 0.
    let dead = server.endpoint();
    let (c, cr) = run_json(&env, "c", &dead, REMOTE);
    assert_eq!(c["executed"], TINY_NODES);
    assert_eq!(cr.stderr.matches("cannot be used").count(), 1, "{cr:?}");
}

#[test]
fn push_and_pull_move_results_explicitly() {
    let Some(server) = S3Server::start() else {
        return;
    };
    let env = Env::new();
    let ep = server.endpoint();
    let (a, _) = run_json(&env, "a", &ep, "off");
    let spec = env.spec();
    let push = s3(
        &env,
        "a",
        &ep,
        &["push", &spec, "--json", "--remote", REMOTE],
    );
    assert_eq!(push.code, 0, "{push:?}");
    assert_eq!(push.json()["uploaded"], TINY_NODES);
    let again = s3(
        &env,
        "a",
        &ep,
        &["push", &spec, "--json", "--remote", REMOTE],
    );
    assert_eq!(again.json()["already_there"], TINY_NODES, "{again:?}");
    // Pull one cell (and what it needs), then everything.
    let pull = s3(
        &env,
        "b",
        &ep,
        &[
            "pull",
            &spec,
            "method=probpair",
            "trial=1",
            "--json",
            "--remote",
            REMOTE,
        ],
    );
    assert_eq!(pull.code, 0, "{pull:?}");
    let pulled_cell = pull.json()["downloaded"].as_u64().unwrap();
    assert!(
        pulled_cell > 0 && pulled_cell < TINY_NODES as u64,
        "{pull:?}"
    );
    let pull = s3(
        &env,
        "b",
        &ep,
        &["pull", &spec, "--json", "--remote", REMOTE],
    );
    assert_eq!(
        pull.json()["downloaded"].as_u64().unwrap() + pulled_cell,
        TINY_NODES as u64,
        "{pull:?}"
    );
    let (b, _) = run_json(&env, "b", &ep, "off");
    assert_eq!(b["cached"], TINY_NODES);
    assert_eq!(tables(&a), tables(&b));
    // Without a remote, push says how to name one (exit 2).
    let none = s3(&env, "a", &ep, &["push", &spec]);
    assert_eq!(none.code, 2, "{none:?}");
    assert!(none.stderr.contains("--remote URL"), "{none:?}");
}

#[test]
fn gc_deletes_from_the_remote_only_when_asked() {
    let Some(server) = S3Server::start() else {
        return;
    };
    let env = Env::new();
    let ep = server.endpoint();
    run_json(&env, "a", &ep, REMOTE);
    let client = server.client();
    let before = client.list("team/nodes").len();
    assert_eq!(before, TINY_NODES);
    // A spec that reaches less: one method only.
    let small = TINY_SPEC.replace("  weighted-probpair: {}\n", "").replace(
        "method: [probpair, weighted-probpair]",
        "method: [probpair]",
    );
    let small_spec = env.write("small.yaml", &small);
    let small_spec = small_spec.display().to_string();
    // Its table (a node of its own) is computed and uploaded too.
    let (r, _) = run_spec(&env, "a", &ep, REMOTE, &small_spec);
    let small_nodes = r["total"].as_u64().unwrap() as usize;
    assert_eq!(r["executed"], 1, "only the table: {r}");
    let before = client.list("team/nodes").len();
    assert_eq!(before, TINY_NODES + 1);
    let gc = s3(&env, "a", &ep, &["gc", &small_spec, "--grace-minutes", "0"]);
    assert_eq!(gc.code, 0, "{gc:?}");
    assert_eq!(
        client.list("team/nodes").len(),
        before,
        "gc without --remote leaves the remote alone"
    );
    // The local gc deleted the other method's results; the remote still has them, and keeps
    // what the spec reaches through remote manifests too.
    let gc = s3(
        &env,
        "a",
        &ep,
        &[
            "gc",
            &small_spec,
            "--grace-minutes",
            "0",
            "--remote",
            REMOTE,
        ],
    );
    assert_eq!(gc.code, 0, "{gc:?}");
    let after = client.list("team/nodes").len();
    assert_eq!(
        after, small_nodes,
        "exactly what the small spec reaches is kept: {gc:?}"
    );
    assert!(
        gc.stdout
            .contains("remote `s3://upcc-test/team`: 13 results"),
        "{gc:?}"
    );
    client.assert_consistent("team");
    // The small spec is still answered whole by the remote.
    let (b, _) = run_spec(&env, "b", &ep, REMOTE, &small_spec);
    assert_eq!(b["executed"], 0, "{b}");
}

#[test]
fn a_folder_remote_shares_results_too() {
    let env = Env::new();
    let url = format!("file://{}", env.path("shared-remote").display());
    let (a, _) = run_json(&env, "a", "http://127.0.0.1:9", &url);
    assert_eq!(a["executed"], TINY_NODES);
    let (b, _) = run_json(&env, "b", "http://127.0.0.1:9", &url);
    assert_eq!(
        (b["executed"].as_u64(), b["downloaded"].as_u64()),
        (Some(0), Some(TINY_NODES as u64))
    );
    assert_eq!(tables(&a), tables(&b));
    // A remote upcc cannot use is refused before anything runs, naming where it came from.
    let spec = env.spec();
    let bad = env.upcc_store(
        &env.path("c"),
        &["run", &spec, "--remote", "ftp://example.org/x"],
    );
    assert_eq!(bad.code, 2, "{bad:?}");
    assert!(
        bad.stderr
            .contains("remote `ftp://example.org/x` (from --remote)"),
        "{bad:?}"
    );
    assert!(!env.path("c").exists(), "nothing written");
    let rel = env.upcc_store(
        &env.path("c"),
        &["run", &spec, "--remote", "file://relative/path"],
    );
    assert_eq!(rel.code, 2, "{rel:?}");
}

/// A PUT of `body` at the raw `key` (no client normalises it: `//` and `..` stay), unsigned,
/// as anyone with write access could.
fn raw_put(endpoint: &str, key: &str, body: &[u8]) {
    let hostport = endpoint.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(hostport).unwrap();
    write!(
        s,
        "PUT /{BUCKET}/{key} HTTP/1.1\r\nHost: {hostport}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    assert!(reply.starts_with("HTTP/1.1 200"), "{key}: {reply}");
}

/// R4: stray keys with an empty or `..` segment under the prefix no longer turn the cache off
/// (every result still downloads) or stop `gc --remote`. R3: an object far larger than its
/// manifest states is refused by its stated size, not read into memory.
#[test]
fn stray_keys_are_skipped_and_a_huge_object_is_refused_unread() {
    let Some(server) = S3Server::start() else {
        return;
    };
    let env = Env::new();
    let ep = server.endpoint();
    let (a, _) = run_json(&env, "a", &ep, REMOTE);
    assert_eq!(a["executed"], TINY_NODES);
    raw_put(&ep, "team/nodes//ab/x.json", b"{}");
    raw_put(&ep, "team/objects/../../evil", b"x");
    let (b, r) = run_json(&env, "b", &ep, REMOTE);
    assert_eq!(b["downloaded"], TINY_NODES, "{r:?}");
    assert!(!r.stderr.contains("cannot be used"), "{r:?}");
    let spec = env.spec();
    let g = s3(
        &env,
        "b",
        &ep,
        &["gc", &spec, "--remote", REMOTE, "--dry-run"],
    );
    assert_eq!(g.code, 0, "{g:?}");

    // The largest object of the run, replaced by 64 MiB: refused by its size.
    // (Found in store a: the bucket's own listing now fails on the stray keys, as a client
    // that lists naively does.)
    let mut largest = (String::new(), 0u64);
    for d in std::fs::read_dir(env.path("a/objects")).unwrap().flatten() {
        for f in std::fs::read_dir(d.path()).unwrap().flatten() {
            let n = f.metadata().unwrap().len();
            if n > largest.1 {
                let name = format!(
                    "team/objects/{}/{}",
                    d.file_name().to_string_lossy(),
                    f.file_name().to_string_lossy()
                );
                largest = (name, n);
            }
        }
    }
    let (path, bytes) = largest;
    server.client().put(&path, vec![0u8; 64 << 20]);
    let (c, r) = run_json(&env, "c", &ep, REMOTE);
    assert!(c["executed"].as_u64().unwrap() >= 1, "{r:?}");
    assert!(
        r.stderr
            .contains(&format!("{} bytes where {bytes} were expected", 64 << 20))
            && r.stderr.contains("without reading it"),
        "{r:?}"
    );
}
