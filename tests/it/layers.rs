//! The layers of `pipeline/cli`, kept by a test (as buck2 keeps its dependency rules): each
//! module may name only the `crate::` modules its row lists. A new edge is a decision to make
//! here, in review, not an accident.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module → the modules it may use. Bottom to top; `on_device` (a macro at the crate root)
/// is everyone's. `spec` reads the method and target registries and those read the spec's
/// schema: one layer, on purpose.
const ALLOWED: &[(&str, &[&str])] = &[
    ("error", &[]),
    ("cli", &[]),
    ("build", &[]),
    ("progress", &[]),
    ("env", &["error"]),
    ("device", &["error", "env"]),
    ("eta", &["error"]),
    ("slurm", &["error", "env"]),
    ("remote", &["error", "env"]),
    ("spec", &["error", "method", "target", "slurm"]),
    ("wiring", &["error", "device", "spec"]),
    ("stage", &["error", "device", "env", "spec", "wiring"]),
    ("method", &["error", "device", "spec", "stage", "wiring"]),
    ("target", &["error", "spec", "wiring"]),
    (
        "graph",
        &[
            "error", "device", "spec", "stage", "method", "target", "wiring",
        ],
    ),
    ("select", &["error", "graph"]),
    (
        "commands",
        &[
            "cli", "device", "env", "error", "eta", "graph", "progress", "remote", "select",
            "slurm", "spec", "stage", "method", "target", "wiring",
        ],
    ),
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

#[test]
fn each_module_of_the_cli_uses_only_the_layers_below_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("pipeline/cli");
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
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
        if module == "lib" || module == "main" {
            continue; // the entry points see everything
        }
        let Some(ok) = allowed.get(module.as_str()) else {
            problems.push(format!(
                "{}: module `{module}` has no row in ALLOWED (tests/it/layers.rs): say what it may use",
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
                "{}: `{module}` uses `crate::{r}`, which its layer does not allow",
                rel.display()
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // Every row names a module that exists (a stale row would allow too much).
    for (m, _) in ALLOWED {
        assert!(
            seen_modules.contains(*m),
            "ALLOWED lists `{m}`, which has no file"
        );
    }
}

#[test]
fn the_reference_scanner_sees_paths_groups_and_not_lookalikes() {
    let text = "use crate::spec::{A, B};\nuse crate::{graph::Built, wiring, stage::{x, y}};\nlet x = crate::target::kinds();\nupcc_crate::no();\n";
    let refs: Vec<String> = crate_refs(text).into_iter().collect();
    assert_eq!(refs, ["graph", "spec", "stage", "target", "wiring"]);
}
