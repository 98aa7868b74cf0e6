//! Validating a spec's datasets: their files and downloads, split and sizes.

use std::collections::BTreeSet;
use std::path::Path;

use upcc_stages::features::{Scaling, SplitKind};

use crate::specs::embedded::embedded;
use crate::specs::schema::{DatasetSpec, SpecFile};
use crate::specs::sections::{MAX_CLASSES, MAX_EMBEDDING_DIM};
use crate::specs::source::Problems;

/// Check every dataset (files relative to `dir`).
pub(super) fn check_datasets(file: &SpecFile, dir: &Path, p: &mut Problems<'_>) {
    for (name, d) in &file.datasets {
        check_fetch(name, d, p);
        let at = |field: &'static str| ["datasets", name.as_str(), field];
        let roles: BTreeSet<&str> = d
            .files
            .keys()
            .chain(d.fetch.keys())
            .map(|s| s.as_str())
            .collect();
        let (single, split) = d.format.roles();
        let ok =
            roles == single.iter().copied().collect() || roles == split.iter().copied().collect();
        if !ok {
            p.add(
                &at("files"),
                format!("dataset `{name}`: `files` has roles {:?}", roles),
                Some(format!(
                    "a {:?} dataset needs {} or {}",
                    d.format,
                    single.join(" + "),
                    split.join(" + ")
                )),
            );
        }
        for (role, path) in &d.files {
            if let Some(e) = path.strip_prefix("embedded:") {
                if embedded(e).is_none() {
                    p.add(
                        &["datasets", name, "files", role],
                        format!("dataset `{name}`: no embedded dataset `{e}`"),
                        Some("embedded datasets: mnist5k".into()),
                    );
                }
            } else if !dir.join(path).exists() && !d.fetch.contains_key(role) {
                p.add(
                    &["datasets", name, "files", role],
                    format!("dataset `{name}`: file `{path}` (role `{role}`) not found"),
                    Some(format!(
                        "paths are relative to the spec's folder `{}`",
                        dir.display()
                    )),
                );
            }
        }
        if let Some(s) = &d.split {
            if s.kind == SplitKind::Official && roles.contains(single[0]) {
                p.add(
                    &at("split"),
                    format!(
                        "dataset `{name}`: `split: official` needs separate train and test files"
                    ),
                    None,
                );
            }
            if s.kind == SplitKind::Stratified && !(s.test_fraction > 0.0 && s.test_fraction < 1.0)
            {
                p.add(
                    &["datasets", name, "split", "test_fraction"],
                    format!(
                        "dataset `{name}`: `split.test_fraction` must be in (0, 1), got {}",
                        s.test_fraction
                    ),
                    None,
                );
            }
        }
        if d.embedding_dim == 0 {
            p.add(
                &at("embedding_dim"),
                format!("dataset `{name}`: `embedding_dim` must be at least 1"),
                None,
            );
        }
        if d.embedding_dim > MAX_EMBEDDING_DIM {
            p.add(
                &at("embedding_dim"),
                format!(
                    "dataset `{name}`: `embedding_dim: {}` is not an embedding to cluster (at most {MAX_EMBEDDING_DIM}; the paper uses 10, and 20 for CIFAR100-20)",
                    d.embedding_dim
                ),
                None,
            );
        }
        if let Some(c) = d.n_classes.filter(|&c| c == 0 || c > MAX_CLASSES) {
            p.add(
                &at("n_classes"),
                format!(
                    "dataset `{name}`: `n_classes: {c}` must be 1 to {MAX_CLASSES} (the paper's datasets have 10 or 20)"
                ),
                Some("leave it out to take the classes from the labels".into()),
            );
        }
        if let Scaling::Multiply(f) = d.scaling {
            if !f.is_finite() {
                p.add(
                    &at("scaling"),
                    format!("dataset `{name}`: the scaling factor must be finite"),
                    None,
                );
            }
        }
    }
}

/// Check what dataset `name` downloads: a URL and one digest per file, or parts.
fn check_fetch(name: &str, d: &DatasetSpec, p: &mut Problems<'_>) {
    for (role, f) in &d.fetch {
        let at = |field: &'static str| ["datasets", name, "fetch", role.as_str(), field];
        let check_one = |p: &mut Problems,
                         place: &str,
                         url: &str,
                         digests: [(&'static str, &Option<String>); 3]| {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                p.add(&at("url"), format!("dataset `{name}`: `{place}.url` must be an http:// or https:// URL, got `{url}`"), None);
            }
            let given: Vec<&str> = digests
                .iter()
                .filter(|(_, v)| v.is_some())
                .map(|(f, _)| *f)
                .collect();
            if given.len() > 1 {
                p.add(
                    &at(given[1]),
                    format!(
                        "dataset `{name}`: `{place}` gives {} digests",
                        given.join(" and ")
                    ),
                    Some("give one digest per file".into()),
                );
            }
            for (field, v) in digests {
                if let Some(v) = v {
                    let len = if field == "git_blob" { 40 } else { 64 };
                    if v.len() != len || !v.chars().all(|c| c.is_ascii_hexdigit()) {
                        p.add(&at(field), format!("dataset `{name}`: `{place}.{field}` must be {len} hex digits, got `{v}`"), None);
                    }
                }
            }
        };
        let place = format!("fetch.{role}");
        match (&f.url, f.parts.is_empty()) {
            (Some(url), true) => check_one(
                p,
                &place,
                url,
                [("sha256", &f.sha256), ("blake3", &f.blake3), ("git_blob", &f.git_blob)],
            ),
            (None, false) => {
                if f.sha256.is_some() || f.blake3.is_some() || f.git_blob.is_some() {
                    p.add(&at("parts"), format!("dataset `{name}`: `{place}` gives a digest beside `parts`"), Some("each part carries its own digest".into()));
                }
                for (k, part) in f.parts.iter().enumerate() {
                    check_one(
                        p,
                        &format!("{place}.parts[{k}]"),
                        &part.url,
                        [("sha256", &part.sha256), ("blake3", &part.blake3), ("git_blob", &part.git_blob)],
                    );
                }
                if d.files.contains_key(role) {
                    p.add(&["datasets", name, "files", role], format!("dataset `{name}`: `files.{role}` names a local copy of a file fetched in parts"), Some("drop it; put the downloaded parts into $UPCC_DATA_MIRROR instead (found by their file names)".into()));
                }
            }
            (Some(_), false) => p.add(&at("parts"), format!("dataset `{name}`: `{place}` gives both `url` and `parts`"), Some("one file has a `url`; a file published in pieces has `parts`, each with its `url`".into())),
            (None, true) => p.add(&at("url"), format!("dataset `{name}`: `{place}` has no `url`"), Some("give `url` and a digest (`sha256`, `blake3` or `git_blob`), or `parts`".into())),
        }
    }
}
