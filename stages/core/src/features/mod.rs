//! `features`: read a dataset file, validate it, split it and scale it.
//!
//! Formats: CSV (optionally gzipped; a label column), IDX (MNIST/FMNIST, gzipped or not),
//! `.npy` (f32/f64/u8/int matrix plus an int label vector), Parquet (a label column plus
//! a list column or numeric columns) and Python pickles of numpy arrays as the paper's
//! feature datasets are published (`pickle`: a tuple `(X, y)`, or a dict `{'data', 'label'}`,
//! possibly inside an object `.npy`; see `pickle.rs`). Splits: official (separate train/test files) or a
//! seeded stratified split. Scaling per dataset as the paper's preprocessing: MNIST/FMNIST
//! ×0.02, standardisation fitted on train for feature datasets, or none.

use std::collections::BTreeMap;
use std::io::Read;

use serde::{Deserialize, Serialize};
use upcc_nn::Stream;

use crate::error::{DataPlace, Result, StageError};
use crate::table::{Table, TableBuilder};

pub(crate) mod csv_file;
mod idx;
mod npy;
mod parquet_file;
pub mod pickle;
mod pickled;

use csv_file::*;
use idx::*;
use npy::*;
use parquet_file::*;
use pickled::*;

/// Bumped by hand whenever the output of this stage changes meaning or bytes.
pub const VERSION: u32 = 1;

/// File format of a dataset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataFormat {
    Csv,
    Idx,
    Npy,
    Parquet,
    /// A pickle holding the features and the labels together (`data`, or `train` + `test`).
    Pickle,
}

impl DataFormat {
    /// Whether features and labels come in separate files (`x` + `y`, or `train_x` +
    /// `train_y` + `test_x` + `test_y`) rather than one file holding both (`data`, or `train`
    /// + `test`).
    pub fn separate_labels(self) -> bool {
        matches!(self, DataFormat::Idx | DataFormat::Npy)
    }

    /// The roles of a dataset given as one file, and as separate train and test files.
    pub fn roles(self) -> (&'static [&'static str], &'static [&'static str]) {
        if self.separate_labels() {
            (&["x", "y"], &["train_x", "train_y", "test_x", "test_y"])
        } else {
            (&["data"], &["train", "test"])
        }
    }
}

/// A mapping applied to the labels as read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LabelMap {
    /// CIFAR-100's 100 fine classes onto its 20 superclasses (the paper's CIFAR100-20, as CC
    /// and SpherePair map them). Labels already below 20 are taken as superclasses.
    Cifar100Coarse,
}

/// CIFAR-100's superclass of each fine class (the dataset's own `coarse_labels`).
pub const CIFAR100_COARSE: [u8; 100] = [
    4, 1, 14, 8, 0, 6, 7, 7, 18, 3, 3, 14, 9, 18, 7, 11, 3, 9, 7, 11, 6, 11, 5, 10, 7, 6, 13, 15,
    3, 15, 0, 11, 1, 10, 12, 14, 16, 9, 11, 5, 5, 19, 8, 8, 15, 13, 14, 17, 18, 10, 16, 4, 17, 4,
    2, 0, 17, 4, 18, 17, 10, 3, 2, 12, 12, 16, 12, 1, 9, 19, 2, 10, 0, 1, 16, 12, 9, 13, 15, 13,
    16, 19, 2, 4, 6, 19, 5, 5, 8, 19, 18, 1, 2, 15, 6, 0, 17, 8, 14, 13,
];

impl LabelMap {
    /// Map `labels` in place; `display` names the data in errors.
    fn apply(self, labels: &mut [i64], display: &str) -> Result<()> {
        match self {
            LabelMap::Cifar100Coarse => {
                let max = labels.iter().copied().max().unwrap_or(0);
                if max < 20 {
                    return Ok(());
                }
                for l in labels.iter_mut() {
                    *l = match usize::try_from(*l).ok().and_then(|i| CIFAR100_COARSE.get(i)) {
                        Some(&c) => c as i64,
                        None => {
                            return Err(StageError::input(format!(
                                "dataset {display}: label {l} is not a CIFAR-100 class (0..99), so `labels: cifar100-coarse` cannot map it"
                            )))
                        }
                    };
                }
                Ok(())
            }
        }
    }
}

/// Whether a CSV file starts with a header row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HeaderMode {
    /// A header if the first row has a non-numeric field.
    #[default]
    Auto,
    Yes,
    No,
}

/// Input scaling. In YAML: `none`, `standardize` or `{multiply: 0.02}`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", try_from = "ScalingRepr")]
pub enum Scaling {
    #[default]
    None,
    /// Multiply every value (MNIST/FMNIST: 0.02, as DEC/DCC/SpherePair).
    Multiply(f64),
    /// Zero mean, unit variance per feature, fitted on the training split (StandardScaler).
    Standardize,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ScalingRepr {
    Name(String),
    Multiply { multiply: f64 },
}

impl TryFrom<ScalingRepr> for Scaling {
    type Error = String;
    fn try_from(r: ScalingRepr) -> std::result::Result<Self, String> {
        match r {
            ScalingRepr::Multiply { multiply } if multiply.is_finite() => Ok(Scaling::Multiply(multiply)),
            ScalingRepr::Multiply { multiply } => Err(format!("scaling factor {multiply} is not finite")),
            ScalingRepr::Name(n) => match n.as_str() {
                "none" => Ok(Scaling::None),
                "standardize" => Ok(Scaling::Standardize),
                other => Err(format!("unknown variant `{other}`, expected `none`, `standardize` or `{{multiply: FACTOR}}`")),
            },
        }
    }
}

/// How train and test are separated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SplitKind {
    /// The dataset's own train/test files.
    Official,
    /// Seeded stratified split of one file.
    Stratified,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Split {
    pub kind: SplitKind,
    #[serde(default = "default_test_fraction")]
    pub test_fraction: f64,
    #[serde(default)]
    pub seed: u64,
}

fn default_test_fraction() -> f64 {
    0.2
}

/// Parameters of the `features` stage (all part of the node key).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureParams {
    pub format: DataFormat,
    /// CSV/Parquet: `last`, `first`, a 0-based column index, or a column name.
    pub label_column: String,
    pub header: HeaderMode,
    pub scaling: Scaling,
    pub split: Split,
    /// If set, labels must lie in 0..n_classes.
    pub n_classes: Option<usize>,
    /// Rows reserved for validation: the first this many rows of the training split (the
    /// reference code's `split_val`), in the order `validation_order` gives; they train
    /// nothing and are scored like test rows. Omitted from the key when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub validation: usize,
    /// The order of the training split the validation rows are the first of; `None` (only
    /// without a validation split) stays out of the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation_order: Option<ValidationOrder>,
    /// A mapping of the labels as read (CIFAR-100's superclasses); absent from the key when
    /// unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<LabelMap>,
}

/// Which training rows are "the first N of the training split".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValidationOrder {
    /// The split's own order, as scikit-learn's `train_test_split` returns it: shuffled (by
    /// the split seed) for a stratified split, file order for official train/test files.
    #[default]
    Split,
    /// Row order of the data file, whatever the split.
    Rows,
}

fn is_zero(v: &usize) -> bool {
    *v == 0
}

/// The sizes a dataset is expected to have (the paper's Appendix C.1): training rows
/// (including validation rows), test rows, features, classes. Unset fields are not checked.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expected {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dim: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classes: Option<usize>,
}

impl Expected {
    /// Every way `f` differs from what is expected (empty: it matches).
    pub fn differences(&self, f: &Features) -> Vec<String> {
        let train = f.rows() - f.test_indices().len();
        let got = [
            ("training rows", self.train, train),
            ("test rows", self.test, f.test_indices().len()),
            ("features", self.dim, f.dim),
            ("classes", self.classes, f.n_classes),
        ];
        got.iter()
            .filter_map(|(what, want, have)| match want {
                Some(w) if w != have => Some(format!("{have} {what}, the paper's dataset has {w}")),
                _ => None,
            })
            .collect()
    }
}

/// A dataset after this stage: every instance with its label and split.
#[derive(Clone, Debug, PartialEq)]
pub struct Features {
    pub ids: Vec<u32>,
    pub labels: Vec<u32>,
    pub is_test: Vec<bool>,
    /// Validation rows (never test rows); all false without a validation split.
    pub is_val: Vec<bool>,
    /// Row-major, rows × dim.
    pub x: Vec<f32>,
    pub dim: usize,
    pub n_classes: usize,
}

/// One input file of the stage: its role (`data`, `train`, `test_labels`, ...), the name
/// shown in messages, and its bytes.
pub struct SourceFile<'a> {
    pub display: String,
    pub bytes: &'a [u8],
}

struct Raw {
    x: Vec<f32>,
    rows: usize,
    dim: usize,
    labels: Vec<i64>,
}

impl Features {
    pub fn rows(&self) -> usize {
        self.labels.len()
    }

    pub fn row(&self, i: usize) -> &[f32] {
        &self.x[i * self.dim..(i + 1) * self.dim]
    }

    /// Training rows (validation rows excluded): what experts, constraints and reconstruction
    /// use.
    pub fn train_indices(&self) -> Vec<usize> {
        (0..self.rows())
            .filter(|&i| !self.is_test[i] && !self.is_val[i])
            .collect()
    }

    pub fn val_indices(&self) -> Vec<usize> {
        (0..self.rows()).filter(|&i| self.is_val[i]).collect()
    }

    pub fn test_indices(&self) -> Vec<usize> {
        (0..self.rows()).filter(|&i| self.is_test[i]).collect()
    }

    /// Rows `idx` as one row-major matrix.
    pub fn gather(&self, idx: &[usize]) -> Vec<f32> {
        let mut out = Vec::with_capacity(idx.len() * self.dim);
        for &i in idx {
            out.extend_from_slice(self.row(i));
        }
        out
    }

    pub fn to_parquet(&self) -> Result<Vec<u8>> {
        TableBuilder::new()
            .u32("id", self.ids.clone())
            .u32("label", self.labels.clone())
            .split3("split", &self.is_test, &self.is_val)
            .f32_rows("x", self.dim, self.x.clone())
            .meta("n_classes", self.n_classes)
            .meta("dim", self.dim)
            .to_parquet()
    }

    pub fn from_parquet(bytes: &[u8]) -> Result<Features> {
        let t = Table::from_parquet(bytes, "features table")?;
        let (x, dim) = t.f32_rows("x")?;
        let labels = t.u32("label")?;
        let n_classes = t
            .meta("n_classes")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| {
                labels
                    .iter()
                    .copied()
                    .max()
                    .map(|m| m as usize + 1)
                    .unwrap_or(0)
            });
        let is_test = t.is_test("split")?;
        let is_val = t.is_val("split")?;
        Ok(Features {
            ids: t.u32("id")?,
            labels,
            is_test,
            is_val,
            x,
            dim,
            n_classes,
        })
    }
}

/// What can be told of a dataset's shape without reading it whole: features per row and,
/// when a header says so, the training rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shape {
    pub dim: usize,
    pub rows: Option<usize>,
}

/// The first `n` bytes of a file, decompressed if it is gzipped (only as much as needed).
fn head(path: &std::path::Path, n: usize) -> Option<Vec<u8>> {
    let f = fs_err::File::open(path).ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut raw = Vec::new();
    f.take(2).read_to_end(&mut raw).ok()?;
    let f = fs_err::File::open(path).ok()?;
    let mut out = Vec::new();
    if raw == [0x1f, 0x8b] {
        flate2::read::MultiGzDecoder::new(f)
            .take(n as u64)
            .read_to_end(&mut out)
            .ok()?;
    } else {
        f.take(n as u64).read_to_end(&mut out).ok()?;
    }
    Some(out)
}

/// The shape of a dataset read from the head of its file (`x`/`train_x` for IDX and
/// `.npy`, `data`/`train` for CSV), for the memory check at load: `None` where it cannot be
/// told cheaply (Parquet, pickles, files not there yet). `bytes` serves an embedded file. A
/// CSV row is one label and `dim` features wherever its label column is, so the label
/// column's name does not enter.
pub fn peek_shape(
    format: DataFormat,
    path: Option<&std::path::Path>,
    bytes: Option<&[u8]>,
) -> Option<Shape> {
    let data = match (bytes, path) {
        (Some(b), _) => {
            let mut out = Vec::new();
            if b.starts_with(&[0x1f, 0x8b]) {
                flate2::read::MultiGzDecoder::new(b)
                    .take(1 << 20)
                    .read_to_end(&mut out)
                    .ok()?;
            } else {
                out = b[..b.len().min(1 << 20)].to_vec();
            }
            out
        }
        (None, Some(p)) => head(p, 1 << 20)?,
        (None, None) => return None,
    };
    match format {
        DataFormat::Csv => {
            let text = String::from_utf8_lossy(&data);
            let line = text.trim_start_matches('\u{feff}').lines().next()?;
            let fields = line.split(',').count();
            (fields >= 2).then_some(Shape {
                dim: fields - 1,
                rows: None,
            })
        }
        DataFormat::Idx => {
            if data.len() < 4 || data[0] != 0 || data[1] != 0 {
                return None;
            }
            let ndim = data[3] as usize;
            if ndim < 1 || data.len() < 4 + 4 * ndim {
                return None;
            }
            let dims: Vec<usize> = (0..ndim)
                .map(|i| {
                    u32::from_be_bytes(data[4 + 4 * i..8 + 4 * i].try_into().expect("4")) as usize
                })
                .collect();
            Some(Shape {
                dim: dims[1..].iter().product::<usize>().max(1),
                rows: Some(dims[0]),
            })
        }
        DataFormat::Npy => {
            let (npy, _) = npy_parts("", &data).ok()?;
            let rows = *npy.shape.first()?;
            Some(Shape {
                dim: npy.shape[1..].iter().product::<usize>().max(1),
                rows: Some(rows),
            })
        }
        DataFormat::Parquet | DataFormat::Pickle => None,
    }
}

/// Build the features from the source files (`data`, or `train`+`test` for CSV/Parquet;
/// `x`+`y`, or `train_x`+`train_y`+`test_x`+`test_y` for IDX/npy).
pub fn build(params: &FeatureParams, files: &BTreeMap<String, SourceFile<'_>>) -> Result<Features> {
    let Sources {
        mut x,
        labels,
        is_test,
        dim,
        names,
    } = read_sources(params, files)?;
    let rows = labels.len();
    if rows == 0 {
        return Err(StageError::input(format!("dataset {names} has no rows")));
    }
    let (labels, n_classes) = class_labels(params, labels, &names)?;
    let is_test = split_rows(params, &labels, n_classes, is_test, &names)?;
    scale(&mut x, dim, &is_test, params.scaling);
    let is_val = validation_rows(params, &labels, n_classes, &is_test, &names)?;
    Ok(Features {
        ids: (0..rows as u32).collect(),
        labels,
        is_test,
        is_val,
        x,
        dim,
        n_classes,
    })
}

/// The rows of every source file of a dataset, joined (train then test for official splits).
struct Sources {
    x: Vec<f32>,
    labels: Vec<i64>,
    /// Official splits: which rows came from the test file (empty for stratified splits).
    is_test: Vec<bool>,
    dim: usize,
    /// The files, as messages name them.
    names: String,
}

/// One file role of a dataset read by its format (IDX and npy: with its label file).
fn read_role(
    params: &FeatureParams,
    files: &BTreeMap<String, SourceFile<'_>>,
    role: &str,
) -> Result<Raw> {
    let f = files
        .get(role)
        .ok_or_else(|| StageError::failed(format!("internal: no source `{role}`")))?;
    match params.format {
        DataFormat::Csv => read_csv(&f.display, f.bytes, &params.label_column, params.header),
        DataFormat::Parquet => read_parquet(&f.display, f.bytes, &params.label_column),
        DataFormat::Pickle => read_pickle(&f.display, f.bytes),
        DataFormat::Idx | DataFormat::Npy => {
            let yrole = if role == "x" {
                "y".to_string()
            } else {
                role.replace("_x", "_y")
            };
            let fy = files
                .get(&yrole)
                .ok_or_else(|| StageError::failed(format!("internal: no source `{yrole}`")))?;
            let (x, rows, dim) = if params.format == DataFormat::Idx {
                read_idx_matrix(&f.display, f.bytes)?
            } else {
                read_npy_matrix(&f.display, f.bytes)?
            };
            let labels = if params.format == DataFormat::Idx {
                read_idx_labels(&fy.display, fy.bytes)?
            } else {
                read_npy_labels(&fy.display, fy.bytes)?
            };
            if labels.len() != rows {
                return Err(StageError::input(format!(
                    "`{}` has {rows} rows but `{}` has {} labels: the files must describe the same samples",
                    f.display,
                    fy.display,
                    labels.len()
                )));
            }
            Ok(Raw {
                x,
                rows,
                dim,
                labels,
            })
        }
    }
}

/// Read the files of a dataset as its split needs them.
fn read_sources(
    params: &FeatureParams,
    files: &BTreeMap<String, SourceFile<'_>>,
) -> Result<Sources> {
    let read = |role: &str| read_role(params, files, role);
    let (single, split) = params.format.roles();
    let (train_role, test_role, single_role) = (split[0], split[split.len() / 2], single[0]);
    Ok(match params.split.kind {
        SplitKind::Official => {
            if !files.contains_key(train_role) {
                return Err(StageError::input(
                    "`split: official` needs separate train and test files; give `train`/`test` files or use `split: {kind: stratified}`",
                ));
            }
            let tr = read(train_role)?;
            let te = read(test_role)?;
            if tr.dim != te.dim {
                return Err(StageError::input(format!(
                    "train file `{}` has {} features per row but test file `{}` has {}",
                    files[train_role].display, tr.dim, files[test_role].display, te.dim
                )));
            }
            let mut is_test = vec![false; tr.rows];
            is_test.extend(std::iter::repeat_n(true, te.rows));
            let mut x = tr.x;
            x.extend(te.x);
            let mut labels = tr.labels;
            labels.extend(te.labels);
            Sources {
                x,
                labels,
                is_test,
                dim: tr.dim,
                names: format!(
                    "`{}` and `{}`",
                    files[train_role].display, files[test_role].display
                ),
            }
        }
        SplitKind::Stratified => {
            let raw = read(single_role)?;
            Sources {
                x: raw.x,
                labels: raw.labels,
                is_test: vec![],
                dim: raw.dim,
                names: format!("`{}`", files[single_role].display),
            }
        }
    })
}

/// The labels as classes 0..C (mapped by `labels:` first), and C.
fn class_labels(
    params: &FeatureParams,
    mut labels: Vec<i64>,
    names: &str,
) -> Result<(Vec<u32>, usize)> {
    if let Some(map) = params.labels {
        map.apply(&mut labels, names)?;
    }
    // Labels: integers in 0..C.
    let min = *labels.iter().min().expect("non-empty");
    let max = *labels.iter().max().expect("non-empty");
    if min < 0 {
        return Err(StageError::input(format!(
            "dataset {names}: label {min} is negative; labels must be integers 0..C−1 (shift them so the smallest class is 0)"
        )));
    }
    let n_classes = match params.n_classes {
        Some(c) => {
            if max as usize >= c {
                let row = labels.iter().position(|&l| l == max).expect("max exists");
                return Err(StageError::input(format!(
                    "dataset {names}: label {max} (row {}) is outside 0..{} given by `n_classes: {c}`; fix the label or raise `n_classes`",
                    row + 1,
                    c
                )));
            }
            c
        }
        None => max as usize + 1,
    };
    if n_classes < 2 {
        return Err(StageError::input(format!(
            "dataset {names} has a single class: clustering needs at least 2"
        )));
    }
    Ok((labels.into_iter().map(|l| l as u32).collect(), n_classes))
}

/// Which rows are test rows (a stratified split draws them), checked: every class has
/// training rows and the test split is not empty.
fn split_rows(
    params: &FeatureParams,
    labels_u: &[u32],
    n_classes: usize,
    mut is_test: Vec<bool>,
    names: &str,
) -> Result<Vec<bool>> {
    if params.split.kind == SplitKind::Stratified {
        is_test = stratified_split(
            labels_u,
            n_classes,
            params.split.test_fraction,
            params.split.seed,
            names,
        )?;
    }
    let mut present = vec![false; n_classes];
    for (i, &l) in labels_u.iter().enumerate() {
        if !is_test[i] {
            present[l as usize] = true;
        }
    }
    if let Some(c) = present.iter().position(|p| !p) {
        return Err(StageError::input(format!(
            "dataset {names}: class {c} has no training samples; labels must be contiguous 0..C−1 with every class in the training split"
        )));
    }
    if !is_test.iter().any(|&t| t) {
        return Err(StageError::input(format!(
            "dataset {names}: the test split is empty; add test samples or raise `test_fraction`"
        )));
    }
    Ok(is_test)
}

/// The validation rows: the first `validation` training rows, after the split and scaling.
fn validation_rows(
    params: &FeatureParams,
    labels_u: &[u32],
    n_classes: usize,
    is_test: &[bool],
    names: &str,
) -> Result<Vec<bool>> {
    let rows = labels_u.len();
    let mut is_val = vec![false; rows];
    if params.validation > 0 {
        let mut train: Vec<usize> = (0..rows).filter(|&i| !is_test[i]).collect();
        let order = params.validation_order.unwrap_or_default();
        if order == ValidationOrder::Split && params.split.kind == SplitKind::Stratified {
            Stream::new(params.split.seed, &["features", "training-order"]).shuffle(&mut train);
        }
        if params.validation >= train.len() {
            return Err(StageError::input(format!(
                "dataset {names}: `validation: {}` reserves every one of the {} training rows; lower it",
                params.validation,
                train.len()
            )));
        }
        for &i in &train[..params.validation] {
            is_val[i] = true;
        }
        let mut present = vec![false; n_classes];
        for &i in &train[params.validation..] {
            present[labels_u[i] as usize] = true;
        }
        if let Some(c) = present.iter().position(|p| !p) {
            return Err(StageError::input(format!(
                "dataset {names}: with `validation: {}`, class {c} has no training samples left; lower it",
                params.validation
            )));
        }
    }
    Ok(is_val)
}

fn stratified_split(
    labels: &[u32],
    n_classes: usize,
    fraction: f64,
    seed: u64,
    names: &str,
) -> Result<Vec<bool>> {
    if !(fraction > 0.0 && fraction < 1.0) {
        return Err(StageError::input(format!(
            "`split.test_fraction` must be in (0, 1), got {fraction}"
        )));
    }
    let mut rng = Stream::new(seed, &["features", "stratified-split"]);
    let mut is_test = vec![false; labels.len()];
    for c in 0..n_classes {
        let mut idx: Vec<usize> = (0..labels.len())
            .filter(|&i| labels[i] as usize == c)
            .collect();
        rng.shuffle(&mut idx);
        let n = idx.len();
        let n_test = ((n as f64 * fraction).round() as usize).min(n.saturating_sub(1));
        for &i in &idx[..n_test] {
            is_test[i] = true;
        }
        if n == 0 {
            let max = labels.iter().copied().max().unwrap_or(0) as usize;
            if c > max {
                // Only a configured `n_classes` reaches past the largest label.
                return Err(StageError::input(format!(
                    "dataset {names}: `n_classes` is {n_classes} but its labels are 0..={max}; set `n_classes: {}` or leave it out",
                    max + 1
                )));
            }
            return Err(StageError::input(format!(
                "dataset {names}: class {c} has no samples; labels must be contiguous 0..C−1"
            )));
        }
    }
    Ok(is_test)
}

fn scale(x: &mut [f32], dim: usize, is_test: &[bool], scaling: Scaling) {
    match scaling {
        Scaling::None => {}
        Scaling::Multiply(f) => {
            let f = f as f32;
            x.iter_mut().for_each(|v| *v *= f);
        }
        Scaling::Standardize => {
            let mut mean = vec![0f64; dim];
            let mut n = 0usize;
            for (r, row) in x.chunks(dim).enumerate() {
                if !is_test[r] {
                    n += 1;
                    for (m, &v) in mean.iter_mut().zip(row) {
                        *m += v as f64;
                    }
                }
            }
            mean.iter_mut().for_each(|m| *m /= n as f64);
            let mut var = vec![0f64; dim];
            for (r, row) in x.chunks(dim).enumerate() {
                if !is_test[r] {
                    for ((s, &v), m) in var.iter_mut().zip(row).zip(&mean) {
                        *s += (v as f64 - m).powi(2);
                    }
                }
            }
            let std: Vec<f64> = var
                .iter()
                .map(|s| (s / n as f64).sqrt())
                .map(|s| if s == 0.0 { 1.0 } else { s })
                .collect();
            for row in x.chunks_mut(dim) {
                for ((v, m), s) in row.iter_mut().zip(&mean).zip(&std) {
                    *v = ((*v as f64 - m) / s) as f32;
                }
            }
        }
    }
}

fn to_int_labels(display: &str, v: Vec<f64>) -> Result<Vec<i64>> {
    v.into_iter()
        .enumerate()
        .map(|(i, l)| {
            if l.is_finite() && l.fract() == 0.0 {
                Ok(l as i64)
            } else {
                Err(StageError::data(
                    display,
                    DataPlace::Row(i + 1),
                    format!("label {l} is not an integer class index"),
                ))
            }
        })
        .collect()
}

fn check_finite(display: &str, x: &[f32], dim: usize) -> Result<()> {
    if let Some(p) = x.iter().position(|v| !v.is_finite()) {
        return Err(StageError::data(
            display,
            DataPlace::Row(p / dim.max(1) + 1),
            format!(
                "column {} is not finite ({}); remove or impute it",
                p % dim.max(1) + 1,
                x[p]
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
