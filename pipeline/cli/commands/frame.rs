//! A small typed table (columns of optional values) and its four renderings: an aligned
//! terminal table, CSV, JSON (one object per row) and Parquet. What `upcc results` prints and
//! what the report writes as its long per-trial table.

use std::io::Write;

use serde_json::{json, Map, Value};
use upcc_model::error::{Error, Result};

/// One column's values.
#[derive(Clone, Debug)]
pub enum Values {
    Str(Vec<Option<String>>),
    Bool(Vec<Option<bool>>),
    Int(Vec<Option<i64>>),
    Float(Vec<Option<f64>>),
}

impl Values {
    pub fn len(&self) -> usize {
        match self {
            Values::Str(v) => v.len(),
            Values::Bool(v) => v.len(),
            Values::Int(v) => v.len(),
            Values::Float(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How the terminal shows a column (the other formats write values as they are).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Show {
    Plain,
    /// A score in [0, 1], shown in percent with two decimals.
    Percent,
    /// A signed difference of scores, in percentage points.
    Delta,
    /// Seconds, one decimal.
    Seconds,
    /// A node key, its first 12 hex digits.
    Key,
}

#[derive(Clone, Debug)]
pub struct Column {
    pub name: String,
    pub show: Show,
    pub values: Values,
}

/// Columns of equal length.
#[derive(Clone, Debug, Default)]
pub struct Frame {
    pub columns: Vec<Column>,
}

impl Frame {
    pub fn push(&mut self, name: impl Into<String>, show: Show, values: Values) {
        self.columns.push(Column {
            name: name.into(),
            show,
            values,
        });
    }

    pub fn rows(&self) -> usize {
        self.columns.first().map_or(0, |c| c.values.len())
    }

    /// Cell `r` of column `c` as text (`—` for none).
    fn text(c: &Column, r: usize, terminal: bool) -> String {
        let none = if terminal { "—" } else { "" };
        match &c.values {
            Values::Str(v) => match (&v[r], c.show) {
                (Some(s), Show::Key) if terminal => s.chars().take(12).collect(),
                (Some(s), _) => s.clone(),
                (None, _) => none.into(),
            },
            Values::Bool(v) => v[r].map_or(none.into(), |b| b.to_string()),
            Values::Int(v) => v[r].map_or(none.into(), |i| i.to_string()),
            Values::Float(v) => match v[r] {
                None => none.into(),
                Some(x) if !terminal => x.to_string(),
                Some(x) => match c.show {
                    Show::Percent => format!("{:.2}", 100.0 * x),
                    Show::Delta => format!("{:+.2}", 100.0 * x),
                    Show::Seconds => format!("{x:.1}"),
                    _ => x.to_string(),
                },
            },
        }
    }

    /// An aligned table for the terminal (numbers right-aligned).
    pub fn to_terminal(&self) -> String {
        let widths: Vec<usize> = self
            .columns
            .iter()
            .map(|c| {
                (0..self.rows())
                    .map(|r| Self::text(c, r, true).chars().count())
                    .chain([c.name.chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let numeric = |c: &Column| matches!(c.values, Values::Int(_) | Values::Float(_));
        let line = |cells: Vec<String>| {
            let parts: Vec<String> = cells
                .iter()
                .zip(&self.columns)
                .zip(&widths)
                .map(|((s, c), &w)| {
                    let pad = w.saturating_sub(s.chars().count());
                    if numeric(c) {
                        format!("{}{s}", " ".repeat(pad))
                    } else {
                        format!("{s}{}", " ".repeat(pad))
                    }
                })
                .collect();
            parts.join("  ").trim_end().to_string()
        };
        let mut out = String::new();
        out.push_str(&line(self.columns.iter().map(|c| c.name.clone()).collect()));
        out.push('\n');
        for r in 0..self.rows() {
            out.push_str(&line(
                self.columns
                    .iter()
                    .map(|c| Self::text(c, r, true))
                    .collect(),
            ));
            out.push('\n');
        }
        out
    }

    /// CSV (RFC 4180 quoting; empty for none).
    pub fn to_csv(&self) -> String {
        let quote = |s: &str| {
            if s.contains([',', '"', '\n', '\r']) {
                format!("\"{}\"", s.replace('"', "\"\""))
            } else {
                s.to_string()
            }
        };
        let mut out = String::new();
        let head: Vec<String> = self.columns.iter().map(|c| quote(&c.name)).collect();
        out.push_str(&head.join(","));
        out.push('\n');
        for r in 0..self.rows() {
            let cells: Vec<String> = self
                .columns
                .iter()
                .map(|c| quote(&Self::text(c, r, false)))
                .collect();
            out.push_str(&cells.join(","));
            out.push('\n');
        }
        out
    }

    /// One JSON object per row (null for none).
    pub fn to_json_rows(&self) -> Vec<Map<String, Value>> {
        (0..self.rows())
            .map(|r| {
                self.columns
                    .iter()
                    .map(|c| {
                        let v = match &c.values {
                            Values::Str(v) => json!(v[r]),
                            Values::Bool(v) => json!(v[r]),
                            Values::Int(v) => json!(v[r]),
                            Values::Float(v) => match v[r] {
                                Some(x) if x.is_finite() => json!(x),
                                _ => Value::Null,
                            },
                        };
                        (c.name.clone(), v)
                    })
                    .collect()
            })
            .collect()
    }

    /// Parquet: strings, booleans, int64 and float64 columns, nullable, pinned writer.
    pub fn to_parquet(&self) -> Result<Vec<u8>> {
        let mut b = upcc_stages::table::TableBuilder::new();
        for c in &self.columns {
            b = match &c.values {
                Values::Str(v) => b.str_opt(&c.name, v.clone()),
                Values::Bool(v) => b.bool_opt(&c.name, v.clone()),
                Values::Int(v) => b.i64_opt(&c.name, v.clone()),
                Values::Float(v) => b.f64_opt(&c.name, v.clone()),
            };
        }
        b.to_parquet()
            .map_err(|e| Error::internal(format!("cannot write the table as Parquet: {e}")))
    }
}

pub use crate::cli::Format;

/// Write `frame` in `format` to `out` (a file, written whole and renamed into place) or stdout.
/// `preamble` lines go before a terminal table (on stdout) and are dropped by data formats.
pub fn emit(
    frame: &Frame,
    format: Format,
    out: Option<&std::path::Path>,
    preamble: &[String],
    extra_json: Map<String, Value>,
) -> Result<()> {
    let bytes = match format {
        Format::Table => {
            let mut s = String::new();
            for l in preamble {
                s.push_str(l);
                s.push('\n');
            }
            s.push_str(&frame.to_terminal());
            s.into_bytes()
        }
        Format::Csv => frame.to_csv().into_bytes(),
        Format::Json => {
            let mut o = extra_json;
            o.insert("rows".into(), json!(frame.to_json_rows()));
            let mut s = serde_json::to_string_pretty(&Value::Object(o))
                .map_err(|e| Error::internal(e.to_string()))?;
            s.push('\n');
            s.into_bytes()
        }
        Format::Parquet => {
            if out.is_none() && std::io::IsTerminal::is_terminal(&std::io::stdout()) {
                return Err(Error::user("Parquet is binary and stdout is a terminal")
                    .hint("add `--out results.parquet`, or redirect stdout to a file"));
            }
            frame.to_parquet()?
        }
    };
    match out {
        Some(path) => {
            let dir = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."));
            upcc_engine::fsutil::atomic_write(dir, path, &bytes, 0o644).map_err(|e| {
                Error::user(format!("cannot write `{}`: {e}", path.display()))
                    .hint("choose a writable path for --out")
            })
        }
        None => {
            let mut o = std::io::stdout().lock();
            // A closed pipe (`| head`) ends the output quietly.
            let _ = o.write_all(&bytes).and_then(|_| o.flush());
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Frame {
        let mut f = Frame::default();
        f.push(
            "method",
            Show::Plain,
            Values::Str(vec![Some("probpair".into()), Some("a,\"b\"".into())]),
        );
        f.push(
            "pretrain",
            Show::Plain,
            Values::Bool(vec![Some(true), None]),
        );
        f.push("trial", Show::Plain, Values::Int(vec![Some(1), Some(2)]));
        f.push(
            "test_nmi",
            Show::Percent,
            Values::Float(vec![Some(0.51234), None]),
        );
        f
    }

    #[test]
    fn renders_every_format_with_missing_values() {
        let f = sample();
        let t = f.to_terminal();
        assert!(t.starts_with("method"), "{t}");
        assert!(t.contains("51.23"), "{t}");
        assert!(t.lines().nth(2).unwrap().contains('—'), "{t}");
        let csv = f.to_csv();
        assert_eq!(
            csv,
            "method,pretrain,trial,test_nmi\nprobpair,true,1,0.51234\n\"a,\"\"b\"\"\",,2,\n"
        );
        let rows = f.to_json_rows();
        assert_eq!(rows[0]["test_nmi"], json!(0.51234));
        assert_eq!(rows[1]["test_nmi"], Value::Null);
        assert_eq!(rows[1]["pretrain"], Value::Null);
        let pq = f.to_parquet().unwrap();
        let t = upcc_stages::table::Table::from_parquet(&pq, "results").unwrap();
        assert_eq!(t.rows(), 2);
        assert_eq!(t.bool_opt("pretrain").unwrap(), vec![Some(true), None]);
    }
}
