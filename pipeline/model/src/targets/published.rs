//! A target's published values: its kind reads the file its `published:` section names (scores
//! or printed values, as [`Target::published`] says) and picks, for the cells it built, the
//! values the table node compares with.
//!
//! [`Target::published`]: super::Target::published

use std::collections::BTreeMap;
use std::path::Path;

use upcc_report::published::{
    PrintedCell, Published, PublishedScore, PublishedText, PublishedTexts, PublishedValue,
};
use upcc_report::Metric;

use super::{CellTrial, PublishedAs, TargetKind};
use crate::method::ResolvedMethod;
use crate::specs::axis::Axis;
use crate::specs::schema::{PublishedSpec, TargetSpec};
use crate::specs::source::Problems;

/// The axes a file's cells may be left unmatched on (`published.ignore`).
const IGNORABLE: [Axis; 3] = [Axis::Pretrain, Axis::Corruption, Axis::Budget];
/// The axes a `table,row,column,value` file's rows and columns can be.
const PRINTED_AXES: [Axis; 3] = [Axis::Dataset, Axis::Supervision, Axis::Method];

/// A table target's published values as read.
#[derive(Clone, Debug)]
pub struct PublishedTable {
    pub source: String,
    /// A clustering table's scores.
    pub rows: Vec<PublishedScore>,
    /// The values of a `table,row,column,value` file (experts, blind-spot, selection and
    /// runtime tables), as printed.
    pub printed: Vec<PrintedCell>,
    pub datasets: BTreeMap<String, String>,
    pub supervision: BTreeMap<String, String>,
    pub methods: BTreeMap<String, String>,
    pub ignore: Vec<Axis>,
    /// The grid axes the printed file's rows and columns are.
    pub row_axis: Axis,
    pub column_axis: Axis,
    pub device: Option<String>,
}

/// Read the published values of target `t` of kind `kind` (files relative to `dir`);
/// problems go to `p`.
pub fn read(
    t: &str,
    ps: &PublishedSpec,
    kind: TargetKind,
    dir: &Path,
    p: &mut Problems<'_>,
) -> Option<PublishedTable> {
    let at = |f: &'static str| ["targets", t, "published", f];
    let Some(published_as) = kind.published() else {
        let tables: Vec<&str> = super::REGISTRY
            .iter()
            .filter(|k| k.published().is_some())
            .map(|k| k.name())
            .collect();
        p.add(&at("file"), format!("target `{t}`: `published` values are compared with tables (kinds {}); this target is of kind `{}`", tables.join(", "), kind.name()), None);
        return None;
    };
    let mut ignore = Vec::new();
    for c in &ps.ignore {
        match Axis::parse(c).filter(|a| IGNORABLE.contains(a)) {
            Some(a) => ignore.push(a),
            None => p.add(&at("ignore"), format!("target `{t}`: `published.ignore` lists `{c}`; only `pretrain`, `corruption` and `budget` can be left unmatched"), None),
        }
    }
    let (row_default, col_default) = kind.published_axes();
    let mut axis = |field: &'static str, given: &Option<String>, default: Axis| match given {
        None => Some(default),
        Some(name) => {
            let a = Axis::parse(name).filter(|a| PRINTED_AXES.contains(a));
            if a.is_none() {
                p.add(&at(field), format!("target `{t}`: `published.{field}` is `{name}`; the file's rows and columns can be `dataset`, `supervision` or `method`"), None);
            }
            a
        }
    };
    let row_axis = axis("rows", &ps.rows, row_default);
    let column_axis = axis("columns", &ps.columns, col_default);
    let read = fs_err::read(dir.join(&ps.file))
        .map_err(|e| format!("cannot read `{}`: {e}", ps.file))
        .and_then(|bytes| {
            if published_as == PublishedAs::Scores {
                upcc_report::published::read_scores(&bytes, &ps.file, &ps.table)
                    .map(|r| (r, vec![]))
            } else {
                upcc_report::published::read_printed(&bytes, &ps.file, &ps.table)
                    .map(|c| (vec![], c))
            }
        })
        .and_then(|(rows, printed)| {
            // An experts table's values are accuracies: numbers.
            if published_as == PublishedAs::PrintedScores {
                if let Some(c) = printed
                    .iter()
                    .find(|c| c.text.parse::<f64>().map_or(true, |v| !v.is_finite()))
                {
                    return Err(format!(
                        "`{}`:{}: value `{}` is not a number",
                        ps.file, c.line, c.text
                    ));
                }
            }
            Ok((rows, printed))
        });
    let (rows, printed) = match read {
        Ok(read) => read,
        Err(e) => {
            p.add(
                &at("file"),
                format!("target `{t}`: {e}"),
                Some(format!(
                    "paths are relative to the spec's folder `{}`",
                    dir.display()
                )),
            );
            return None;
        }
    };
    Some(PublishedTable {
        source: ps
            .source
            .clone()
            .unwrap_or_else(|| format!("`{}`, table `{}`", ps.file, ps.table)),
        rows,
        printed,
        datasets: ps.datasets.clone(),
        supervision: ps.supervision.clone(),
        methods: ps.methods.clone(),
        ignore,
        row_axis: row_axis?,
        column_axis: column_axis?,
        device: ps.device.clone(),
    })
}

impl PublishedTable {
    /// The file's name for value `v` of axis `axis` (mapped by `datasets`, `supervision`,
    /// `methods`; unmapped values as they are).
    fn file_name<'a>(&'a self, axis: Axis, v: &'a str) -> &'a str {
        let map = match axis {
            Axis::Dataset => &self.datasets,
            Axis::Supervision => &self.supervision,
            Axis::Method => &self.methods,
            _ => return v,
        };
        map.get(v).map(|s| s.as_str()).unwrap_or(v)
    }

    /// The printed value of the cell at `coords` (a `table,row,column,value` file).
    pub fn printed_at(&self, coords: &BTreeMap<String, String>) -> Option<&str> {
        let at = |a: Axis| Some(self.file_name(a, coords.get(a.name())?));
        let (row, col) = (at(self.row_axis)?, at(self.column_axis)?);
        self.printed
            .iter()
            .find(|c| c.row == row && c.column == col)
            .map(|c| c.text.as_str())
    }

    /// The rows a cell matches: its dataset, supervision and method kind (mapped), and its
    /// pretraining, corruption and budget unless ignored.
    pub fn matching<'a>(
        &'a self,
        cell: &'a CellTrial,
        method_kind: &'a str,
    ) -> impl Iterator<Item = &'a PublishedScore> + 'a {
        let c = &cell.point;
        let ds = self.file_name(Axis::Dataset, &c.dataset);
        let sup = self.file_name(Axis::Supervision, &c.supervision);
        let ignored = |a: Axis| self.ignore.contains(&a);
        let (ip, ic, ib) = (
            ignored(Axis::Pretrain),
            ignored(Axis::Corruption),
            ignored(Axis::Budget),
        );
        self.rows.iter().filter(move |r| {
            r.dataset == ds
                && r.supervision == sup
                && r.method == method_kind
                && (ip || r.pretrain == c.pretrain)
                && (ic || (r.corruption - c.corruption).abs() < 1e-9)
                && (ib || r.budget == c.budget)
        })
    }
}

/// What a table node compares its cells with.
#[derive(Default)]
pub struct ForCells {
    /// Scores (clustering tables, the experts' accuracies).
    pub scores: Option<Published>,
    /// Printed values (blind-spot, selection and runtime tables).
    pub texts: Option<PublishedTexts>,
}

/// The published values of `cells` (on `axes`, the layout's) that target `target` of kind
/// `kind` compares with: scores of the first trial's cells, matched on their coordinates, or
/// the printed value of each cell.
pub fn for_cells(
    kind: TargetKind,
    table: Option<&PublishedTable>,
    target: &TargetSpec,
    methods: &BTreeMap<String, ResolvedMethod>,
    cells: &[CellTrial],
    axes: &[Axis],
) -> ForCells {
    let (Some(p), Some(published_as)) = (table, kind.published()) else {
        return ForCells::default();
    };
    let coord = |c: &CellTrial| -> Vec<String> {
        axes.iter()
            .map(|a| c.coords.get(a.name()).cloned().unwrap_or_default())
            .collect()
    };
    // Each cell's first trial, once.
    let mut firsts: Vec<&CellTrial> = Vec::new();
    for c in cells {
        if !firsts.iter().any(|f| f.coords == c.coords) {
            firsts.push(c);
        }
    }
    match published_as {
        PublishedAs::Scores => {
            let first_trial = cells.first().map(|c| c.trial);
            let values = cells
                .iter()
                .filter(|c| Some(c.trial) == first_trial)
                .flat_map(|c| {
                    let kind = methods[&c.point.method].method.kind();
                    p.matching(c, kind).map(move |r| (c, r))
                })
                .filter(|(_, r)| {
                    target.splits.contains(&r.split) && target.metrics.contains(&r.metric)
                })
                .map(|(c, r)| PublishedValue {
                    coord: coord(c),
                    split: r.split.clone(),
                    metric: r.metric,
                    value: r.value,
                })
                .collect();
            ForCells {
                scores: Some(Published {
                    source: p.source.clone(),
                    values,
                }),
                texts: None,
            }
        }
        PublishedAs::PrintedScores => ForCells {
            scores: Some(Published {
                source: p.source.clone(),
                // Validated: an experts table's printed values are numbers.
                values: firsts
                    .iter()
                    .filter_map(|c| {
                        let v = p.printed_at(&c.coords)?.parse().ok()?;
                        Some(PublishedValue {
                            coord: coord(c),
                            split: "test".into(),
                            metric: Metric::Acc,
                            value: v,
                        })
                    })
                    .collect(),
            }),
            texts: None,
        },
        PublishedAs::Printed(comparison) => ForCells {
            scores: None,
            texts: Some(PublishedTexts {
                source: p.source.clone(),
                comparison,
                values: firsts
                    .iter()
                    .filter_map(|c| {
                        Some(PublishedText {
                            coord: coord(c),
                            text: p.printed_at(&c.coords)?.to_string(),
                        })
                    })
                    .collect(),
                device: p.device.clone(),
            }),
        },
    }
}
