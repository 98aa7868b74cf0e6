//! The remote cache's bucket on the Arrow project's `object_store`: `s3://`, `gs://` and `az://`
//! URLs (`file://` folders use the engine's `DirBucket`, which never follows a link),
//! credentials and endpoints from each cloud's usual environment (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_…`).
//! Which remote a command uses: `--remote URL` (or `off`), else `$UPCC_REMOTE`, else the spec's
//! `remote:`, else the user config's `remote:`; none by default. The protocol (what is
//! verified, in which order things are written) is the engine's (`upcc_engine::remote`).

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use futures_util::TryStreamExt;
use object_store::path::Path as OsPath;
use object_store::{ObjectStore, ObjectStoreExt, PutOptions, PutPayload};
use upcc_engine::{
    Bucket, BucketError, DirBucket, Got, Listed, Listing, Put, PutMode, RemoteCache, Trust,
};

use upcc_model::error::{Error, Result};

/// Where a remote URL came from, for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteOrigin {
    Flag,
    Env,
    Spec,
    Config,
}

impl RemoteOrigin {
    fn name(self) -> &'static str {
        match self {
            RemoteOrigin::Flag => "--remote",
            RemoteOrigin::Env => "$UPCC_REMOTE",
            RemoteOrigin::Spec => "the spec's `remote:`",
            RemoteOrigin::Config => "the user config's `remote:`",
        }
    }
}

/// The remote a command uses, from the first of flag, environment, spec and user config that
/// names one (`off` in any of them: none).
pub fn choose(
    flag: Option<&str>,
    spec: Option<&str>,
    config: Option<&str>,
) -> Option<(String, RemoteOrigin)> {
    let env = crate::env::remote();
    let pick = [
        (flag.map(str::to_string), RemoteOrigin::Flag),
        (env, RemoteOrigin::Env),
        (spec.map(str::to_string), RemoteOrigin::Spec),
        (config.map(str::to_string), RemoteOrigin::Config),
    ]
    .into_iter()
    .find_map(|(u, o)| u.filter(|u| !u.trim().is_empty()).map(|u| (u, o)))?;
    (pick.0.trim() != "off").then(|| (pick.0.trim().to_string(), pick.1))
}

/// Open the remote at `url` (checked now: a URL upcc cannot use is an error naming where it
/// came from, exit 2, before anything runs). No request is made yet.
pub fn open(
    url: &str,
    origin: RemoteOrigin,
    warn_on_stderr: bool,
    trust: Arc<Trust>,
) -> Result<Arc<RemoteCache>> {
    let bad = |why: String| {
        Error::user(format!(
            "remote `{}` (from {}) cannot be used: {why}",
            redact(url),
            origin.name()
        ))
        .hint("a remote is s3://BUCKET[/PREFIX], gs://BUCKET[/PREFIX], az://CONTAINER[/PREFIX] or file:///ABSOLUTE/PATH; `--remote off` works without one")
    };
    let bucket: Box<dyn Bucket> = match url.split_once("://") {
        Some(("file", rest)) => {
            let path = std::path::Path::new(rest);
            if !path.is_absolute() {
                return Err(bad(
                    "a file:// remote needs an absolute path (file:///shared/upcc-cache)".into(),
                ));
            }
            Box::new(DirBucket::new(path).map_err(|e| bad(e.0))?)
        }
        _ => Box::new(ObjectStoreBucket::new(url).map_err(bad)?),
    };
    Ok(Arc::new(RemoteCache::new(bucket, warn_on_stderr, trust)))
}

/// `url` with any `user:password@` before the bucket replaced, for messages.
fn redact(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let authority = rest.split('/').next().unwrap_or(rest);
            match authority.rsplit_once('@') {
                Some((_, host)) => format!("{scheme}://…@{host}{}", &rest[authority.len()..]),
                None => url.to_string(),
            }
        }
        None => url.to_string(),
    }
}

/// A bucket name by S3's rules (3 to 63 lowercase letters, digits, `.` and `-`, starting and
/// ending with a letter or digit, no `..`, not an IP address); Google's add `_`; Azure
/// containers have no `.`.
fn check_bucket(scheme: &str, name: &str) -> std::result::Result<(), String> {
    let what = if scheme == "az" {
        "container"
    } else {
        "bucket"
    };
    let extra = match scheme {
        "gs" => "._-",
        "az" => "-",
        _ => ".-",
    };
    let ok_chars = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || extra.contains(c));
    let ends = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !(3..=63).contains(&name.len())
        || !ok_chars
        || !ends(name.chars().next())
        || !ends(name.chars().last())
        || name.contains("..")
        || name.parse::<std::net::Ipv4Addr>().is_ok()
    {
        return Err(format!(
            "`{}` is not a valid {what} name: 3 to 63 lowercase letters, digits{}, starting and ending with a letter or digit",
            if name.contains('@') { "…" } else { name },
            match scheme {
                "gs" => ", `.`, `_` and `-`",
                "az" => " and `-`",
                _ => ", `.` and `-`",
            }
        ));
    }
    Ok(())
}

/// The prefix inside the bucket: `/`-separated names, none empty, `.` or `..`.
fn check_prefix(prefix: &str) -> std::result::Result<(), String> {
    if prefix.is_empty() {
        return Ok(());
    }
    for seg in prefix.split('/') {
        if seg.is_empty() || seg == "." || seg == ".." || seg.chars().any(|c| c.is_control()) {
            return Err(format!(
                "the prefix `{prefix}` has an empty, `.` or `..` part or a control character"
            ));
        }
    }
    OsPath::parse(prefix)
        .map(|_| ())
        .map_err(|e| format!("the prefix `{prefix}` is not usable: {e}"))
}

/// An S3 endpoint from the environment: an http(s) URL with a host, nothing else.
fn check_endpoint(var: &str, value: &str) -> std::result::Result<(), String> {
    let u = url::Url::parse(value).map_err(|e| {
        format!("environment variable {var}=`{value}` is not a URL ({e}); it must be like http://127.0.0.1:9000 or https://s3.example.org")
    })?;
    if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none_or(str::is_empty) {
        return Err(format!(
            "environment variable {var}=`{value}` must be an http:// or https:// URL with a host"
        ));
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err(format!(
            "environment variable {var} must not carry credentials (use AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
        ));
    }
    Ok(())
}

/// A bucket (and a prefix in it) reached through `object_store`, driven by a small tokio
/// runtime of its own (the engine's worker threads call it concurrently).
pub struct ObjectStoreBucket {
    url: String,
    store: Arc<dyn ObjectStore>,
    prefix: String,
    rt: tokio::runtime::Runtime,
}

/// Retries and timeouts: a remote that refuses or drops connections costs seconds before the
/// run goes on locally (two retries within 20 s); one that accepts a request and never answers
/// costs one request timeout (120 s, room for a large object on a slow link).
fn client_options() -> (object_store::ClientOptions, object_store::RetryConfig) {
    let client = object_store::ClientOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(Duration::from_secs(120));
    let retry = object_store::RetryConfig {
        max_retries: 2,
        retry_timeout: Duration::from_secs(20),
        backoff: object_store::BackoffConfig::default(),
    };
    (client, retry)
}

impl ObjectStoreBucket {
    pub fn new(url: &str) -> std::result::Result<Self, String> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| "it is not a URL (no `scheme://`)".to_string())?;
        let (client, retry) = client_options();
        let (store, prefix): (Arc<dyn ObjectStore>, String) = match scheme {
            "s3" | "s3a" => {
                let (bucket, prefix) = split_bucket(rest)?;
                check_bucket("s3", &bucket)?;
                check_prefix(&prefix)?;
                for var in ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"] {
                    if let Ok(v) = std::env::var(var) {
                        check_endpoint(var, &v)?;
                    }
                }
                for var in ["AWS_REGION", "AWS_DEFAULT_REGION"] {
                    if let Ok(v) = std::env::var(var) {
                        if v.is_empty()
                            || !v
                                .chars()
                                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                        {
                            return Err(format!(
                                "environment variable {var}=`{v}` is not a region (like us-east-1)"
                            ));
                        }
                    }
                }
                let mut b = object_store::aws::AmazonS3Builder::from_env()
                    .with_bucket_name(bucket)
                    .with_client_options(client)
                    .with_retry(retry);
                // An S3-compatible server on plain HTTP (a local one, MinIO, moto).
                let endpoint = std::env::var("AWS_ENDPOINT_URL_S3")
                    .or_else(|_| std::env::var("AWS_ENDPOINT_URL"))
                    .or_else(|_| std::env::var("AWS_ENDPOINT"))
                    .unwrap_or_default();
                if endpoint.starts_with("http://") {
                    b = b.with_allow_http(true);
                }
                if std::env::var_os("AWS_REGION").is_none()
                    && std::env::var_os("AWS_DEFAULT_REGION").is_none()
                {
                    b = b.with_region("us-east-1");
                }
                (Arc::new(b.build().map_err(|e| e.to_string())?), prefix)
            }
            "gs" => {
                let (bucket, prefix) = split_bucket(rest)?;
                check_bucket("gs", &bucket)?;
                check_prefix(&prefix)?;
                let b = object_store::gcp::GoogleCloudStorageBuilder::from_env()
                    .with_bucket_name(bucket)
                    .with_client_options(client)
                    .with_retry(retry);
                (Arc::new(b.build().map_err(|e| e.to_string())?), prefix)
            }
            "az" | "azure" | "abfs" | "abfss" => {
                let (container, prefix) = split_bucket(rest)?;
                check_bucket("az", &container)?;
                check_prefix(&prefix)?;
                let b = object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_container_name(container)
                    .with_client_options(client)
                    .with_retry(retry);
                (Arc::new(b.build().map_err(|e| e.to_string())?), prefix)
            }
            other => {
                return Err(format!(
                    "scheme `{other}://` is not one upcc knows (s3, gs, az, file)"
                ))
            }
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("upcc-remote")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the I/O runtime: {e}"))?;
        Ok(ObjectStoreBucket {
            url: url.to_string(),
            store,
            prefix,
            rt,
        })
    }

    fn path(&self, rel: &str) -> OsPath {
        if self.prefix.is_empty() {
            OsPath::from(rel)
        } else {
            OsPath::from(format!("{}/{rel}", self.prefix))
        }
    }

    fn list_under(&self, rel: &str) -> std::result::Result<Vec<Listed>, object_store::Error> {
        let p = self.path(rel);
        let metas: Vec<object_store::ObjectMeta> = self
            .rt
            .block_on(async { self.store.list(Some(&p)).try_collect().await })?;
        Ok(metas
            .into_iter()
            .map(|m| Listed {
                path: self.relative(&m.location),
                bytes: m.size,
                modified: UNIX_EPOCH
                    + Duration::from_secs(u64::try_from(m.last_modified.timestamp()).unwrap_or(0)),
            })
            .collect())
    }

    fn relative(&self, full: &OsPath) -> String {
        let s = full.as_ref();
        if self.prefix.is_empty() {
            s.to_string()
        } else {
            s.strip_prefix(&self.prefix)
                .map(|r| r.trim_start_matches('/').to_string())
                .unwrap_or_else(|| s.to_string())
        }
    }
}

/// `bucket/some/prefix` → (`bucket`, `some/prefix`).
fn split_bucket(rest: &str) -> std::result::Result<(String, String), String> {
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err("the URL names no bucket".into());
    }
    Ok((bucket.to_string(), prefix.trim_matches('/').to_string()))
}

/// The client's error, with an S3-style XML error body condensed to its code and message.
fn err(e: object_store::Error) -> BucketError {
    BucketError(condense(&e.to_string()))
}

fn condense(text: &str) -> String {
    let tag = |name: &str| {
        let open = format!("<{name}>");
        let start = text.find(&open)? + open.len();
        let len = text[start..].find(&format!("</{name}>"))?;
        Some(text[start..start + len].to_string())
    };
    match (
        text.find("<?xml").or_else(|| text.find("<Error>")),
        tag("Code"),
    ) {
        (Some(at), Some(code)) => format!(
            "{}{code}: {}",
            &text[..at],
            tag("Message").unwrap_or_default()
        ),
        _ => text.to_string(),
    }
}

impl Bucket for ObjectStoreBucket {
    fn describe(&self) -> String {
        self.url.clone()
    }

    fn get(&self, path: &str, max_bytes: u64) -> std::result::Result<Got, BucketError> {
        let p = self.path(path);
        self.rt.block_on(async {
            let r = match self.store.get(&p).await {
                Ok(r) => r,
                Err(object_store::Error::NotFound { .. }) => return Ok(Got::Absent),
                Err(e) => return Err(err(e)),
            };
            // The size the server states (Content-Length), before any of the body is read.
            if r.meta.size > max_bytes {
                return Ok(Got::TooLarge(r.meta.size));
            }
            let mut out = Vec::with_capacity(usize::try_from(r.meta.size).unwrap_or(0));
            let mut body = r.into_stream();
            while let Some(chunk) = body.try_next().await.map_err(err)? {
                if (out.len() + chunk.len()) as u64 > max_bytes {
                    return Ok(Got::TooLarge((out.len() + chunk.len()) as u64));
                }
                out.extend_from_slice(&chunk);
            }
            Ok(Got::Bytes(out))
        })
    }

    fn head(&self, path: &str) -> std::result::Result<Option<u64>, BucketError> {
        let p = self.path(path);
        self.rt.block_on(async {
            match self.store.head(&p).await {
                Ok(m) => Ok(Some(m.size)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(err(e)),
            }
        })
    }

    fn put(
        &self,
        path: &str,
        bytes: &[u8],
        mode: PutMode,
    ) -> std::result::Result<Put, BucketError> {
        let p = self.path(path);
        let opts = PutOptions {
            mode: match mode {
                PutMode::Create => object_store::PutMode::Create,
                PutMode::Overwrite => object_store::PutMode::Overwrite,
            },
            ..Default::default()
        };
        let payload = PutPayload::from(bytes.to_vec());
        self.rt.block_on(async {
            match self.store.put_opts(&p, payload, opts).await {
                Ok(_) => Ok(Put::Written),
                Err(object_store::Error::AlreadyExists { .. }) => Ok(Put::AlreadyExists),
                Err(e) => Err(err(e)),
            }
        })
    }

    fn list(&self, prefix: &str) -> std::result::Result<Listing, BucketError> {
        let mut out = Listing::default();
        match self.list_under(prefix) {
            Ok(entries) => out.entries = entries,
            // A key the client cannot represent (an empty or `..` segment) fails the whole
            // listing: list the 256 fan-out folders one by one instead, and skip those that
            // fail that way (results under them are still fetched by key).
            Err(object_store::Error::InvalidPath { source }) => {
                for i in 0..=255u8 {
                    let sub = format!("{prefix}/{i:02x}");
                    match self.list_under(&sub) {
                        Ok(entries) => out.entries.extend(entries),
                        Err(object_store::Error::InvalidPath { source }) => {
                            out.skipped.push(format!("{sub}/… ({source})"))
                        }
                        Err(e) => return Err(err(e)),
                    }
                }
                out.skipped.push(format!(
                    "a key outside upcc's {prefix}/XX/ folders ({source})"
                ));
            }
            Err(e) => return Err(err(e)),
        }
        Ok(out)
    }

    fn delete(&self, path: &str) -> std::result::Result<(), BucketError> {
        let p = self.path(path);
        self.rt.block_on(async {
            match self.store.delete(&p).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(err(e)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_xml_error_body_is_condensed_to_its_code_and_message() {
        let raw = "Error performing GET http://h/b in 3ms - Server returned non-2xx status code: 404 Not Found: <?xml version=\"1.0\"?>\n<Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message><RequestId>x</RequestId></Error>";
        assert_eq!(
            super::condense(raw),
            "Error performing GET http://h/b in 3ms - Server returned non-2xx status code: 404 Not Found: NoSuchBucket: The specified bucket does not exist"
        );
        assert_eq!(super::condense("connection refused"), "connection refused");
    }
}
