//! The layers inside `pipeline/cli` and `pipeline/model`, kept by tests (as buck2 keeps its
//! dependency rules). Cargo enforces the crates' order (cli → model → engine, never back);
//! these tests keep what Cargo cannot: inside each crate, a module names only the `crate::`
//! modules its row lists, the model's files form no circle, and the model reads no
//! environment. A new edge is a decision to make here, in review, not an accident.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `pipeline/cli`: module → the modules it may use. The model is below all of them.
const CLI: &[(&str, &[&str])] = &[
    ("cli", &[]),
    ("progress", &[]),
    ("env", &[]),
    ("eta", &[]),
    ("slurm", &["env", "eta"]),
    ("remote", &["env"]),
    ("trust", &["env", "slurm"]),
    (
        "commands",
        &["cli", "env", "eta", "progress", "remote", "slurm", "trust"],
    ),
];

/// `pipeline/model`: module → the modules it may use, bottom to top. `specs` looks up the
/// method and target registries while validating and they read its schema, resolver and
/// problem list: both ways between modules, never between files (the next test).
const MODEL: &[(&str, &[&str])] = &[
    ("error", &[]),
    ("code", &[]),
    ("device", &["error"]),
    ("specs", &["error", "method", "targets"]),
    ("wiring", &["code", "error", "device", "specs"]),
    ("stage", &["error", "device", "specs", "wiring"]),
    ("method", &["error", "device", "specs", "stage", "wiring"]),
    ("targets", &["error", "method", "specs", "stage", "wiring"]),
    (
        "graph",
        &[
            "error", "device", "specs", "stage", "method", "targets", "wiring",
        ],
    ),
    ("selectors", &["error", "graph", "specs"]),
];

/// Every `crate::NAME` a file names (in `use` lines and paths alike).
fn crate_refs(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("crate::") {
        // Not `upcc_crate::` or similar: a path that starts here.
        if i > 0 {
            let c = text.as_bytes()[i - 1];
            if c.is_ascii_alphanumeric() || c == b'_' {
                continue;
            }
        }
        let rest = &text[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a, b::{c, d}}`: the first name of each top-level item.
            let (mut depth, mut start) = (0usize, true);
            let mut name = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        if !name.is_empty() {
                            out.insert(std::mem::take(&mut name));
                        }
                        start = true;
                    }
                    c if start && (c.is_ascii_alphanumeric() || c == '_') => name.push(c),
                    _ if start && !name.is_empty() => {
                        out.insert(std::mem::take(&mut name));
                        start = false;
                    }
                    _ => {}
                }
            }
            if !name.is_empty() {
                out.insert(name);
            }
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            out.insert(name);
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn check_layers(crate_dir: &str, table: &[(&str, &[&str])]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(crate_dir);
    let allowed: BTreeMap<&str, &[&str]> = table.iter().copied().collect();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut seen_modules = BTreeSet::new();
    let mut problems = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&root).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        if ["lib", "main", "build"].contains(&module.as_str()) {
            continue; // the entry points see everything; the build script is no module
        }
        let Some(ok) = allowed.get(module.as_str()) else {
            problems.push(format!(
                "{crate_dir}/{}: module `{module}` has no row in tests/it/layers.rs: say what it may use",
                rel.display()
            ));
            continue;
        };
        seen_modules.insert(module.clone());
        let text = std::fs::read_to_string(f).unwrap();
        for r in crate_refs(&text) {
            if r == module || r == "on_device" || ok.contains(&r.as_str()) {
                continue;
            }
            problems.push(format!(
                "{crate_dir}/{}: `{module}` uses `crate::{r}`, which its layer does not allow",
                rel.display()
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // Every row names a module that exists (a stale row would allow too much).
    for (m, _) in table {
        assert!(
            seen_modules.contains(*m),
            "{crate_dir}: the layers list `{m}`, which has no file"
        );
    }
}

#[test]
fn each_module_of_the_cli_uses_only_the_layers_below_it() {
    check_layers("pipeline/cli", CLI);
}

#[test]
fn each_module_of_the_model_uses_only_the_layers_below_it() {
    check_layers("pipeline/model/src", MODEL);
}

/// The module path of a file under `src/` (`specs/schema.rs` → `specs::schema`; `mod.rs` and
/// `lib.rs` name their folder).
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// The files a file names: each `crate::a::b::…` and `super::…` path, resolved to the file of
/// its longest module prefix (a name re-exported by `specs/mod.rs` counts as `specs/mod.rs`).
fn file_edges(root: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .map(|f| (module_of(f.strip_prefix(root).unwrap()), f.clone()))
        .collect();
    let resolve = |path: &[String]| -> Option<PathBuf> {
        (1..=path.len())
            .rev()
            .find_map(|n| modules.get(&path[..n]).cloned())
    };
    let mut edges = BTreeMap::new();
    for f in &files {
        let me = module_of(f.strip_prefix(root).unwrap());
        let text = std::fs::read_to_string(f).unwrap();
        // Unit tests may reach anywhere.
        let text = text.split("#[cfg(test)]").next().unwrap_or("");
        let mut out = BTreeSet::new();
        for (i, _) in text
            .match_indices("crate::")
            .chain(text.match_indices("super::"))
        {
            if i > 0 {
                let c = text.as_bytes()[i - 1];
                if c.is_ascii_alphanumeric() || c == b'_' || c == b':' {
                    continue;
                }
            }
            let is_super = text[i..].starts_with("super::");
            // `crate::` and `super::` are both 7 bytes.
            let rest = &text[i + 7..];
            let mut names: Vec<Vec<String>> = Vec::new();
            if let Some(group) = rest.strip_prefix('{') {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                for item in group.split(',') {
                    let segs: Vec<String> = item
                        .trim()
                        .split("::")
                        .map(|s| s.trim().to_string())
                        .filter(|s| !s.is_empty())
                        .collect();
                    if !segs.is_empty() {
                        names.push(segs);
                    }
                }
            } else {
                let path: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                    .collect();
                names.push(
                    path.split("::")
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect(),
                );
            }
            let base: Vec<String> = if is_super {
                let is_mod = f.file_name().is_some_and(|n| n == "mod.rs");
                let mut b = me.clone();
                // `super` of `a/b.rs` is `a`; of `a/b/mod.rs` (module a::b) is `a` too.
                if !is_mod || !b.is_empty() {
                    b.pop();
                }
                b
            } else {
                vec![]
            };
            for n in names {
                let full: Vec<String> = base.iter().cloned().chain(n).collect();
                if let Some(t) = resolve(&full) {
                    if &t != f {
                        out.insert(t);
                    }
                }
            }
        }
        edges.insert(f.clone(), out);
    }
    edges
}

/// The circles of a graph (strongly connected components of more than one file).
fn circles(edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    // Kosaraju: order by finish time, then components on the reversed graph.
    let nodes: Vec<&PathBuf> = edges.keys().collect();
    let mut seen = BTreeSet::new();
    let mut order = Vec::new();
    for &n in &nodes {
        if seen.contains(n) {
            continue;
        }
        let mut stack = vec![(n, false)];
        while let Some((v, done)) = stack.pop() {
            if done {
                order.push(v);
                continue;
            }
            if !seen.insert(v) {
                continue;
            }
            stack.push((v, true));
            for w in &edges[v] {
                if !seen.contains(w) {
                    stack.push((w, false));
                }
            }
        }
    }
    let mut reversed: BTreeMap<&PathBuf, Vec<&PathBuf>> = BTreeMap::new();
    for (a, bs) in edges {
        for b in bs {
            reversed.entry(b).or_default().push(a);
        }
    }
    let mut assigned = BTreeSet::new();
    let mut out = Vec::new();
    for &v in order.iter().rev() {
        if assigned.contains(v) {
            continue;
        }
        let mut comp = Vec::new();
        let mut stack = vec![v];
        while let Some(x) = stack.pop() {
            if !assigned.insert(x) {
                continue;
            }
            comp.push(x.clone());
            for &y in reversed.get(x).map(|v| v.as_slice()).unwrap_or(&[]) {
                if !assigned.contains(y) {
                    stack.push(y);
                }
            }
        }
        if comp.len() > 1 {
            comp.sort();
            out.push(comp);
        }
    }
    out
}

#[test]
fn the_models_files_form_no_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("pipeline/model/src");
    let edges = file_edges(&root);
    assert!(edges.len() > 30, "{} files", edges.len());
    // The scanner sees the model's uses: graph.rs names the loaded spec and the kinds.
    let total: usize = edges.values().map(|e| e.len()).sum();
    assert!(total > 80, "{total} edges");
    let graph = &edges[&root.join("graph.rs")];
    assert!(graph.contains(&root.join("specs/mod.rs")), "{graph:?}");
    assert!(graph.contains(&root.join("targets/mod.rs")), "{graph:?}");
    let found = circles(&edges);
    assert!(
        found.is_empty(),
        "files of the model that name each other in a circle: {found:?}"
    );
    // The check has teeth: a circle planted in a copy of the graph is found.
    let mut planted = edges.clone();
    let schema = root.join("specs/schema.rs");
    planted
        .get_mut(&schema)
        .unwrap()
        .insert(root.join("graph.rs"));
    assert!(!circles(&planted).is_empty());
}

#[test]
fn the_model_reads_no_environment() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("pipeline/model/src");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for needle in ["env::var", "var_os(", "std::env::vars"] {
            assert!(
                !text.contains(needle),
                "{} reads the environment (`{needle}`): the command line reads it (pipeline/cli/env.rs) and hands it in",
                f.display()
            );
        }
    }
}

#[test]
fn the_reference_scanner_sees_paths_groups_and_not_lookalikes() {
    let text = "use crate::specs::{A, B};\nuse crate::{graph::Built, wiring, stage::{x, y}};\nlet x = crate::targets::kinds();\nupcc_crate::no();\n";
    let refs: Vec<String> = crate_refs(text).into_iter().collect();
    assert_eq!(refs, ["graph", "specs", "stage", "targets", "wiring"]);
}
