//! Where a spec's text comes from (a file, or `smoke` embedded), and where its problems are:
//! each at the file and line that holds the value, or at the `--set` argument that gave it;
//! serde's messages rewritten in the user's terms.

use std::path::{Path, PathBuf};

use upcc_stages::check::Problem;

use super::embedded::SMOKE_YAML;
use crate::error::{nearest, Error, Place, Problem as SpecProblem, Result};

/// The largest spec file read (64 MiB; the paper's spec is 60 KiB).
pub(crate) const MAX_SPEC_BYTES: u64 = 64 << 20;

/// Where a file's text came from.
pub struct SpecSource {
    pub display: String,
    pub dir: PathBuf,
    pub text: String,
}

/// Read a spec file, or the embedded default for `smoke` when no such file exists.
pub fn read_source(arg: &str) -> Result<SpecSource> {
    let path = Path::new(arg);
    if path.exists() {
        // A spec is a small text file: not a device or pipe that never ends, nor a dump.
        let meta = fs_err::metadata(path)
            .map_err(|e| Error::user(format!("cannot read spec `{arg}`: {e}")))?;
        if !meta.is_file() {
            return Err(Error::user(format!(
                "spec `{arg}` is not a regular file ({})",
                if meta.is_dir() {
                    "a directory"
                } else {
                    "a device, pipe or socket"
                }
            ))
            .hint("give the path of a YAML file such as `experiments/smoke.yaml`"));
        }
        if meta.len() > MAX_SPEC_BYTES {
            return Err(Error::user(format!(
                "spec `{arg}` is {} bytes; a spec is at most {} MiB of YAML",
                meta.len(),
                MAX_SPEC_BYTES >> 20
            ))
            .hint("is this the right file? Data belongs in the files a dataset names"));
        }
        let text = fs_err::read_to_string(path)
            .map_err(|e| Error::user(format!("cannot read spec `{arg}`: {e}")))?;
        // A byte-order mark (Notepad writes one) is not part of the YAML.
        let text = match text.strip_prefix('\u{feff}') {
            Some(rest) => rest.to_string(),
            None => text,
        };
        let dir = path
            .parent()
            .map(|p| {
                if p.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    p
                }
            })
            .unwrap_or(Path::new("."))
            .to_path_buf();
        return Ok(SpecSource {
            display: arg.to_string(),
            dir,
            text,
        });
    }
    if arg == "smoke" {
        return Ok(SpecSource {
            display: "embedded:smoke.yaml".into(),
            dir: PathBuf::from("."),
            text: SMOKE_YAML.to_string(),
        });
    }
    Err(Error::user(format!("spec file `{arg}` not found"))
        .hint("give a path such as `experiments/smoke.yaml`, or `smoke` for the embedded default"))
}

/// Find the first line mentioning `token` (as a word).
pub(crate) fn locate(text: &str, token: &str) -> Option<usize> {
    if token.is_empty() {
        return None;
    }
    text.lines()
        .position(|l| {
            let code = l.split('#').next().unwrap_or("");
            has_word(code, token)
        })
        .map(|i| i + 1)
}

pub(crate) fn has_word(code: &str, token: &str) -> bool {
    code.match_indices(token).any(|(i, _)| {
        let before = code[..i].chars().last();
        let after = code[i + token.len()..].chars().next();
        let word = |c: Option<char>| {
            c.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '-' || c == '.')
        };
        !word(before) && !word(after)
    })
}

/// The 1-based line of the key at `path` (block mappings by indentation, and keys written in
/// a flow mapping `{a: 1, b: 2}` on their parent's line). The deepest part of the path found
/// wins, so a missing leaf still places the problem at its section.
pub fn locate_path(text: &str, path: &[&str]) -> Option<usize> {
    locate_depth(text, path).map(|(_, line)| line)
}

/// [`locate_path`] with how many keys of `path` the line found matches.
pub(crate) fn locate_depth(text: &str, path: &[&str]) -> Option<(usize, usize)> {
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut best: Option<(usize, usize)> = None; // (depth matched, line)
    for (i, raw) in text.lines().enumerate() {
        let code = raw.split(" #").next().unwrap_or(raw);
        if code.trim().is_empty() || code.trim_start().starts_with('#') {
            continue;
        }
        let indent = code.len() - code.trim_start().len();
        let body = code.trim_start().trim_start_matches("- ");
        let Some((key, rest)) = body.split_once(':') else {
            continue;
        };
        let key = key
            .trim()
            .trim_matches(|c| c == '"' || c == '\'')
            .to_string();
        if key.contains(' ') || key.contains('{') {
            continue;
        }
        while stack.last().is_some_and(|(ind, _)| *ind >= indent) {
            stack.pop();
        }
        stack.push((indent, key));
        let keys: Vec<&str> = stack.iter().map(|(_, k)| k.as_str()).collect();
        let depth = keys.len();
        if depth <= path.len() && keys == path[..depth] {
            if best.is_none_or(|(d, _)| depth > d) {
                best = Some((depth, i + 1));
            }
            // Deeper keys in a flow mapping on this line.
            let mut d = depth;
            let rest = rest.trim();
            while d < path.len() && rest.contains('{') && has_word(rest, path[d]) {
                d += 1;
            }
            if d > depth && best.is_none_or(|(bd, _)| d > bd) {
                best = Some((d, i + 1));
            }
        }
    }
    best
}

/// Places problems at a line of the spec, or at the `--set` argument that gave the value.
pub struct Locator<'a> {
    pub(crate) display: &'a str,
    pub(crate) text: &'a str,
    /// Paths set by `--set` (with `params.` made explicit) and the argument as given.
    pub(crate) overrides: Vec<(Vec<String>, String)>,
}

impl Locator<'_> {
    /// The `--set ARG` if the value at `path` came from one, else `file:line` (or `file`).
    pub fn place(&self, path: &[&str]) -> Place {
        for (p, arg) in self.overrides.iter().rev() {
            let n = p.len().min(path.len());
            if p[..n].iter().zip(&path[..n]).all(|(a, b)| a == b) {
                return Place::Set { arg: arg.clone() };
            }
        }
        // An entry the file does not have (a dataset only `--set` creates): the `--set` that
        // made it.
        if path.len() >= 2 && locate_depth(self.text, &path[..2]).is_none_or(|(d, _)| d < 2) {
            for (p, arg) in self.overrides.iter().rev() {
                if p.len() >= 2 && p[..2].iter().zip(&path[..2]).all(|(a, b)| a == b) {
                    return Place::Set { arg: arg.clone() };
                }
            }
        }
        let file = self.display.to_string();
        match locate_path(self.text, path)
            .or_else(|| path.last().and_then(|t| locate(self.text, t)))
        {
            Some(line) => Place::Line { file, line },
            None => Place::File { file },
        }
    }
}

/// The problems of a spec found so far, each placed at its line or `--set`.
pub struct Problems<'a> {
    pub(crate) at: Locator<'a>,
    pub(crate) list: Vec<SpecProblem>,
}

impl Problems<'_> {
    pub(crate) fn add(&mut self, path: &[&str], message: impl Into<String>, hint: Option<String>) {
        let entry = SpecProblem {
            place: self.at.place(path),
            field: path.join("."),
            message: message.into(),
            hint,
        };
        // Several methods reading one broken section find the same problem: report it once.
        if !self.list.contains(&entry) {
            self.list.push(entry);
        }
    }

    /// A serde error of the value at `path` (a section deserialised on its own).
    pub(crate) fn add_serde(&mut self, path: &[&str], e: &serde_yaml_ng::Error) {
        let text = e.to_string();
        let (m, h) = explain_serde(&text);
        let token = text.split('`').nth(1).unwrap_or("");
        let mut full: Vec<&str> = path.to_vec();
        if text.contains("unknown field") && !token.is_empty() {
            full.push(token);
        }
        let field = path.join(".");
        self.add(&full, format!("`{field}`: {m}"), h);
    }

    /// The problems a settings type's `check` found, under section path `path`.
    pub(crate) fn add_checks(&mut self, path: &[&str], problems: Vec<Problem>) {
        for p in problems {
            let field_path: Vec<String> = p
                .field
                .split('.')
                .map(|s| s.split('[').next().unwrap_or(s).to_string())
                .collect();
            let mut full: Vec<&str> = path.to_vec();
            full.extend(field_path.iter().map(|s| s.as_str()));
            let name = format!("{}.{}", path.join("."), p.field);
            self.add(&full, format!("`{name}` {}", p.message), None);
        }
    }

    pub(crate) fn unknown(&mut self, path: &[&str], what: &str, name: &str, valid: &[&str]) {
        let hint = match nearest(name, valid.iter().copied()) {
            Some(n) => format!(
                "did you mean `{n}`? (defined {what}s: {})",
                valid.join(", ")
            ),
            None => format!(
                "defined {what}s: {}",
                if valid.is_empty() {
                    "none".into()
                } else {
                    valid.join(", ")
                }
            ),
        };
        self.add(
            path,
            format!("unknown {what} `{name}` in `{}`", path.join(".")),
            Some(hint),
        );
    }

    pub(crate) fn into_result(self, display: &str) -> Result<()> {
        if self.list.is_empty() {
            return Ok(());
        }
        Err(Error::problems(display, self.list))
    }
}

/// Turn a serde message into what the user wrote wrong and what is valid, plus a hint.
pub(crate) fn explain_serde(msg: &str) -> (String, Option<String>) {
    let clean = msg.split(" at line ").next().unwrap_or(msg).to_string();
    // "unknown field `x`, expected one of `a`, `b`" / "unknown variant `x`, expected `a` or `b`"
    for kind in ["unknown field", "unknown variant"] {
        if let Some(pos) = msg.find(kind) {
            let rest = &msg[pos + kind.len()..];
            let rest = rest.split(" at line ").next().unwrap_or(rest);
            let bad = rest.split('`').nth(1).unwrap_or("");
            let expected: Vec<&str> = rest.split('`').skip(3).step_by(2).collect();
            let hint = nearest(bad, expected.iter().copied())
                .map(|n| format!("did you mean `{n}`?"))
                .or_else(|| {
                    (!expected.is_empty()).then(|| {
                        format!(
                            "valid: {}",
                            expected
                                .iter()
                                .map(|e| format!("`{e}`"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    })
                });
            return (clean, hint);
        }
    }
    // Integers too large for any field.
    if let Some(pos) = clean.find(" as u128") {
        let n = clean[..pos].rsplit('`').nth(1).unwrap_or("").to_string();
        let prefix = clean.split("invalid type").next().unwrap_or("");
        return (
            format!("{prefix}the number {n} is far too large for this field"),
            None,
        );
    }
    // YAML reads a number beyond f64's range (`1e400`) as a string.
    if let Some(pos) = clean.find("invalid type: string \"") {
        let rest = &clean[pos + "invalid type: string \"".len()..];
        if let Some((word, tail)) = rest.split_once('"') {
            let numeric = word
                .parse::<f64>()
                .is_ok_and(|v| !v.is_finite() && !word.to_ascii_lowercase().contains("inf"));
            if numeric && tail.contains("expected f64") {
                return (
                    format!(
                        "{}`{word}` is not a finite number (beyond ±1.8e308)",
                        &clean[..pos]
                    ),
                    Some("give a value in the field's range".into()),
                );
            }
        }
    }
    // Internal type names are not what the user wrote.
    let clean = clean
        .replace("expected usize", "expected a whole number ≥ 0")
        .replace("expected u64", "expected a whole number ≥ 0")
        .replace("expected u8", "expected a small whole number")
        .replace("expected f64", "expected a number")
        .replace("expected a sequence", "expected a list [..]");
    (clean, None)
}

pub(crate) fn serde_error(display: &str, text: &str, e: &serde_yaml_ng::Error) -> Error {
    let msg = e.to_string();
    let (clean, hint) = explain_serde(&msg);
    let mut line = e.location().map(|l| l.line()).or_else(|| {
        let bad = msg.split('`').nth(1).unwrap_or("");
        locate(text, bad)
    });
    let mut col = e.location().map(|l| l.column());
    let mut hint = hint;
    // serde_yaml reports duplicate keys at the document start: find the second occurrence.
    if let Some(key) = msg
        .strip_prefix("duplicate entry with key \"")
        .and_then(|r| r.split('"').next())
    {
        let hits: Vec<usize> = text
            .lines()
            .enumerate()
            .filter(|(_, l)| {
                let t = l.trim_start().trim_start_matches("- ");
                t.starts_with(&format!("{key}:")) || t.starts_with(&format!("\"{key}\":"))
            })
            .map(|(i, _)| i + 1)
            .collect();
        if hits.len() >= 2 {
            line = Some(hits[1]);
            col = None;
            hint = Some(format!(
                "`{key}` is also defined at line {}; keep one",
                hits[0]
            ));
        }
    }
    if msg.contains("repetition limit exceeded") {
        hint = Some("the file's aliases (`*name`) expand to too many values (a \"billion laughs\"); a spec needs a few aliases at most".into());
    }
    if msg.contains("cannot start any token") {
        if let Some(l) = line {
            if text
                .lines()
                .nth(l.saturating_sub(1))
                .is_some_and(|s| s.contains('\t'))
            {
                hint = Some("YAML does not allow tabs: indent with spaces".into());
            }
        }
    }
    let place = match (line, col) {
        (Some(l), Some(c)) => format!("{display}:{l}:{c}"),
        (Some(l), None) => format!("{display}:{l}"),
        _ => display.to_string(),
    };
    let mut err = Error::user(format!("{place}: {clean}"));
    if let Some(h) = hint {
        err = err.hint(h);
    }
    err
}
