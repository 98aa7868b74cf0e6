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

pub mod pickle;

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
/// told cheaply (Parquet, pickles, files not there yet). `bytes` serves an embedded file.
pub fn peek_shape(
    format: DataFormat,
    path: Option<&std::path::Path>,
    bytes: Option<&[u8]>,
    label_column: &str,
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
            let _ = label_column;
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
    let read = |role: &str| -> Result<Raw> {
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
    };
    let (single, split) = params.format.roles();
    let (train_role, test_role, single_role) = (split[0], split[split.len() / 2], single[0]);
    let (mut x, mut labels, mut is_test, dim, names) = match params.split.kind {
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
            (
                x,
                labels,
                is_test,
                tr.dim,
                format!(
                    "`{}` and `{}`",
                    files[train_role].display, files[test_role].display
                ),
            )
        }
        SplitKind::Stratified => {
            let raw = read(single_role)?;
            (
                raw.x,
                raw.labels,
                vec![],
                raw.dim,
                format!("`{}`", files[single_role].display),
            )
        }
    };
    let rows = labels.len();
    if rows == 0 {
        return Err(StageError::input(format!("dataset {names} has no rows")));
    }
    if let Some(map) = params.labels {
        map.apply(&mut labels, &names)?;
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
    let labels_u: Vec<u32> = labels.drain(..).map(|l| l as u32).collect();
    if params.split.kind == SplitKind::Stratified {
        is_test = stratified_split(
            &labels_u,
            n_classes,
            params.split.test_fraction,
            params.split.seed,
            &names,
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
    scale(&mut x, dim, &is_test, params.scaling);
    // The validation rows: the first `validation` training rows, after the split and scaling.
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
    Ok(Features {
        ids: (0..rows as u32).collect(),
        labels: labels_u,
        is_test,
        is_val,
        x,
        dim,
        n_classes,
    })
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

/// Decompress if the bytes start with the gzip magic.
fn maybe_gunzip<'a>(display: &str, bytes: &'a [u8]) -> Result<std::borrow::Cow<'a, [u8]>> {
    if bytes.len() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(bytes)
            .read_to_end(&mut out)
            .map_err(|e| {
                StageError::data(
                    display,
                    DataPlace::File,
                    format!("looks gzipped but cannot be decompressed: {e}"),
                )
            })?;
        Ok(std::borrow::Cow::Owned(out))
    } else {
        Ok(std::borrow::Cow::Borrowed(bytes))
    }
}

fn read_csv(display: &str, bytes: &[u8], label_column: &str, header: HeaderMode) -> Result<Raw> {
    let data = maybe_gunzip(display, bytes)?;
    let text = std::str::from_utf8(&data).map_err(|e| {
        StageError::data(
            display,
            DataPlace::File,
            format!(
                "is not UTF-8 text (byte {}): is it really a CSV file?",
                e.valid_up_to()
            ),
        )
    })?;
    // Excel's "CSV UTF-8" starts with a byte-order mark.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let Some((first_no, first)) = lines.next() else {
        return Err(StageError::data(
            display,
            DataPlace::File,
            "is empty".to_string(),
        ));
    };
    let delim = if first.contains(',') {
        Some(',')
    } else if first.contains('\t') {
        Some('\t')
    } else if first.contains(';') {
        Some(';')
    } else {
        None
    };
    let split = |l: &'_ str| -> Vec<String> {
        match delim {
            Some(d) => l.split(d).map(|s| s.trim().to_string()).collect(),
            None => l.split_whitespace().map(|s| s.to_string()).collect(),
        }
    };
    let first_fields = split(first);
    let has_header = match header {
        HeaderMode::Yes => true,
        HeaderMode::No => false,
        HeaderMode::Auto => first_fields
            .iter()
            .any(|f| f.parse::<f64>().is_err() && !is_nonfinite_token(f)),
    };
    let ncols = first_fields.len();
    if ncols < 2 {
        return Err(StageError::data(
            display,
            DataPlace::Line(first_no + 1),
            format!("found {ncols} column; a dataset row needs features and a label"),
        ));
    }
    let label_idx = match label_column {
        "last" => ncols - 1,
        "first" => 0,
        other => match other.parse::<usize>() {
            Ok(i) if i < ncols => i,
            Ok(i) => {
                return Err(StageError::input(format!(
                "`label_column: {i}` is out of range: `{display}` has {ncols} columns (0-based)"
            )))
            }
            Err(_) => {
                if !has_header {
                    return Err(StageError::input(format!(
                        "`label_column: {other}` names a column, but `{display}` has no header row; use `last`, `first` or an index"
                    )));
                }
                first_fields
                    .iter()
                    .position(|f| f == other)
                    .ok_or_else(|| {
                        StageError::data(
                            display,
                            DataPlace::File,
                            format!(
                                "has no column `{other}` (header: {})",
                                first_fields.join(", ")
                            ),
                        )
                    })?
            }
        },
    };
    let dim = ncols - 1;
    let mut x = Vec::new();
    let mut labels = Vec::new();
    let mut process = |no: usize, l: &str| -> Result<()> {
        let fields = split(l);
        if fields.len() != ncols {
            return Err(StageError::data(
                display,
                DataPlace::Line(no + 1),
                format!(
                    "{} columns, expected {ncols} like the first row (ragged rows)",
                    fields.len()
                ),
            ));
        }
        for (j, f) in fields.iter().enumerate() {
            if j == label_idx {
                let v: f64 = f.parse().map_err(|_| {
                    StageError::data(
                        display,
                        DataPlace::Line(no + 1),
                        format!("label `{f}` is not a number"),
                    )
                })?;
                if !v.is_finite() || v.fract() != 0.0 {
                    return Err(StageError::data(
                        display,
                        DataPlace::Line(no + 1),
                        format!("label `{f}` is not an integer class index"),
                    ));
                }
                labels.push(v as i64);
            } else {
                let v: f32 = f.parse().map_err(|_| {
                    StageError::data(
                        display,
                        DataPlace::Cell {
                            line: no + 1,
                            column: j + 1,
                        },
                        format!("`{f}` is not a number"),
                    )
                })?;
                if !v.is_finite() {
                    return Err(StageError::data(
                        display,
                        DataPlace::Cell {
                            line: no + 1,
                            column: j + 1,
                        },
                        format!("value `{f}` is not finite (NaN or infinity); remove or impute it"),
                    ));
                }
                x.push(v);
            }
        }
        Ok(())
    };
    if !has_header {
        process(first_no, first)?;
    }
    for (no, l) in lines {
        process(no, l)?;
    }
    let rows = labels.len();
    Ok(Raw {
        x,
        rows,
        dim,
        labels,
    })
}

fn is_nonfinite_token(f: &str) -> bool {
    matches!(
        f.to_ascii_lowercase().as_str(),
        "nan" | "inf" | "-inf" | "+inf" | "infinity" | "-infinity"
    )
}

fn idx_payload(display: &str, bytes: &[u8]) -> Result<(u8, Vec<usize>, Vec<u8>)> {
    let data = maybe_gunzip(display, bytes)?.into_owned();
    if data.len() < 4 || data[0] != 0 || data[1] != 0 {
        return Err(StageError::data(
            display,
            DataPlace::File,
            "is not an IDX file (bad magic number)".to_string(),
        ));
    }
    let ty = data[2];
    let ndim = data[3] as usize;
    if data.len() < 4 + 4 * ndim {
        return Err(StageError::data(
            display,
            DataPlace::File,
            "IDX header is truncated".to_string(),
        ));
    }
    let dims: Vec<usize> = (0..ndim)
        .map(|i| {
            u32::from_be_bytes(data[4 + 4 * i..8 + 4 * i].try_into().expect("4 bytes")) as usize
        })
        .collect();
    let payload = data[4 + 4 * ndim..].to_vec();
    let width = match ty {
        0x08 | 0x09 => 1,
        0x0B => 2,
        0x0C | 0x0D => 4,
        0x0E => 8,
        other => {
            return Err(StageError::data(
                display,
                DataPlace::File,
                format!("unknown IDX element type 0x{other:02x}"),
            ))
        }
    };
    let count: usize = dims.iter().product();
    if payload.len() != count * width {
        return Err(StageError::data(
            display,
            DataPlace::File,
            format!(
                "IDX header says {dims:?} ({count} values) but the file holds {} bytes of data",
                payload.len()
            ),
        ));
    }
    Ok((ty, dims, payload))
}

fn idx_values(ty: u8, payload: &[u8]) -> Vec<f64> {
    match ty {
        0x08 => payload.iter().map(|&b| b as f64).collect(),
        0x09 => payload.iter().map(|&b| b as i8 as f64).collect(),
        0x0B => payload
            .chunks_exact(2)
            .map(|c| i16::from_be_bytes([c[0], c[1]]) as f64)
            .collect(),
        0x0C => payload
            .chunks_exact(4)
            .map(|c| i32::from_be_bytes(c.try_into().expect("4")) as f64)
            .collect(),
        0x0D => payload
            .chunks_exact(4)
            .map(|c| f32::from_be_bytes(c.try_into().expect("4")) as f64)
            .collect(),
        _ => payload
            .chunks_exact(8)
            .map(|c| f64::from_be_bytes(c.try_into().expect("8")))
            .collect(),
    }
}

fn read_idx_matrix(display: &str, bytes: &[u8]) -> Result<(Vec<f32>, usize, usize)> {
    let (ty, dims, payload) = idx_payload(display, bytes)?;
    if dims.len() < 2 {
        return Err(StageError::data(
            display,
            DataPlace::File,
            format!("expected an IDX image file (≥2 dimensions), found {dims:?}"),
        ));
    }
    let rows = dims[0];
    let dim = dims[1..].iter().product();
    let x: Vec<f32> = idx_values(ty, &payload)
        .into_iter()
        .map(|v| v as f32)
        .collect();
    check_finite(display, &x, dim)?;
    Ok((x, rows, dim))
}

fn read_idx_labels(display: &str, bytes: &[u8]) -> Result<Vec<i64>> {
    let (ty, dims, payload) = idx_payload(display, bytes)?;
    if dims.len() != 1 {
        return Err(StageError::data(
            display,
            DataPlace::File,
            format!("expected an IDX label file (1 dimension), found {dims:?}"),
        ));
    }
    to_int_labels(display, idx_values(ty, &payload))
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

struct Npy {
    descr: String,
    fortran: bool,
    shape: Vec<usize>,
    data: Vec<u8>,
}

/// The `descr` of an `.npy` header and the bytes after the header.
fn npy_header<'a>(display: &str, bytes: &'a [u8]) -> Result<(String, &'a [u8])> {
    let (npy, start) = npy_parts(display, bytes)?;
    Ok((npy.descr, &bytes[start..]))
}

fn parse_npy(display: &str, bytes: &[u8]) -> Result<Npy> {
    let bytes = maybe_gunzip(display, bytes)?;
    let (mut npy, start) = npy_parts(display, &bytes)?;
    if npy.descr.contains('O') {
        return Err(StageError::data(
            display,
            DataPlace::File,
            format!("holds pickled Python objects (dtype {}), e.g. the Reuters-10k dict-in-npy files: declare the dataset with `format: pickle` and the roles `train`/`test` (or `data`), which read them as they are", npy.descr),
        ));
    }
    npy.data = bytes[start..].to_vec();
    Ok(npy)
}

/// The header of an `.npy` file (data left empty) and where its data starts.
fn npy_parts(display: &str, bytes: &[u8]) -> Result<(Npy, usize)> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(StageError::data(
            display,
            DataPlace::File,
            "is not a .npy file (bad magic)".to_string(),
        ));
    }
    let major = bytes[6];
    let (hlen, start) = if major == 1 {
        (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10)
    } else {
        if bytes.len() < 12 {
            return Err(StageError::data(
                display,
                DataPlace::File,
                "truncated .npy header".to_string(),
            ));
        }
        (
            u32::from_le_bytes(bytes[8..12].try_into().expect("4")) as usize,
            12,
        )
    };
    if bytes.len() < start + hlen {
        return Err(StageError::data(
            display,
            DataPlace::File,
            "truncated .npy header".to_string(),
        ));
    }
    let header = String::from_utf8_lossy(&bytes[start..start + hlen]).to_string();
    let field = |key: &str| -> Option<String> {
        let i = header.find(&format!("'{key}'"))?;
        let rest = &header[i + key.len() + 2..];
        let rest = rest[rest.find(':')? + 1..].trim_start();
        if let Some(r) = rest.strip_prefix('\'') {
            Some(r[..r.find('\'')?].to_string())
        } else if let Some(r) = rest.strip_prefix('(') {
            Some(r[..r.find(')')?].to_string())
        } else {
            Some(rest.split([',', '}']).next()?.trim().to_string())
        }
    };
    let descr = field("descr").ok_or_else(|| {
        StageError::data(
            display,
            DataPlace::File,
            ".npy header has no `descr`".to_string(),
        )
    })?;
    let fortran = field("fortran_order").map(|v| v == "True").unwrap_or(false);
    let shape: Vec<usize> = field("shape")
        .ok_or_else(|| {
            StageError::data(
                display,
                DataPlace::File,
                ".npy header has no `shape`".to_string(),
            )
        })?
        .split(',')
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| {
            StageError::data(display, DataPlace::File, "malformed .npy shape".to_string())
        })?;
    Ok((
        Npy {
            descr,
            fortran,
            shape,
            data: Vec::new(),
        },
        start + hlen,
    ))
}

fn npy_values(display: &str, npy: &Npy) -> Result<Vec<f64>> {
    let d = npy.descr.as_str();
    if d.starts_with('>') {
        return Err(StageError::data(
            display,
            DataPlace::File,
            format!("big-endian arrays ({d}) are not supported; save with `.astype('<f4')`"),
        ));
    }
    let kind = d.trim_start_matches(['<', '|', '=']);
    let width = match kind {
        "f4" | "i4" | "u4" => 4,
        "f8" | "i8" | "u8" => 8,
        "i2" | "u2" => 2,
        "u1" | "i1" | "b1" => 1,
        other => {
            return Err(StageError::data(
                display,
                DataPlace::File,
                format!(
                    "unsupported dtype `{other}` (use float32, float64, uint8 or an integer type)"
                ),
            ))
        }
    };
    let count: usize = npy.shape.iter().product();
    if npy.data.len() < count * width {
        return Err(StageError::data(
            display,
            DataPlace::File,
            format!(
                "shape {:?} needs {} bytes of data, the file has {}",
                npy.shape,
                count * width,
                npy.data.len()
            ),
        ));
    }
    let b = &npy.data[..count * width];
    Ok(match kind {
        "f4" => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4")) as f64)
            .collect(),
        "f8" => b
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8")))
            .collect(),
        "i4" => b
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().expect("4")) as f64)
            .collect(),
        "u4" => b
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4")) as f64)
            .collect(),
        "i8" => b
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8")) as f64)
            .collect(),
        "u8" => b
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8")) as f64)
            .collect(),
        "i2" => b
            .chunks_exact(2)
            .map(|c| i16::from_le_bytes([c[0], c[1]]) as f64)
            .collect(),
        "u2" => b
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]) as f64)
            .collect(),
        "i1" => b.iter().map(|&v| v as i8 as f64).collect(),
        _ => b.iter().map(|&v| v as f64).collect(),
    })
}

fn read_npy_matrix(display: &str, bytes: &[u8]) -> Result<(Vec<f32>, usize, usize)> {
    npy_matrix(display, parse_npy(display, bytes)?)
}

fn npy_matrix(display: &str, npy: Npy) -> Result<(Vec<f32>, usize, usize)> {
    if npy.shape.len() < 2 {
        return Err(StageError::data(
            display,
            DataPlace::File,
            format!(
                "expected a 2-D (or image) array of samples, found shape {:?}",
                npy.shape
            ),
        ));
    }
    let rows = npy.shape[0];
    let dim: usize = npy.shape[1..].iter().product();
    let values = npy_values(display, &npy)?;
    let x: Vec<f32> = if npy.fortran {
        if npy.shape.len() != 2 {
            return Err(StageError::data(
                display,
                DataPlace::File,
                "Fortran-ordered arrays must be 2-D".to_string(),
            ));
        }
        let mut x = vec![0f32; rows * dim];
        for c in 0..dim {
            for r in 0..rows {
                x[r * dim + c] = values[c * rows + r] as f32;
            }
        }
        x
    } else {
        values.into_iter().map(|v| v as f32).collect()
    };
    check_finite(display, &x, dim)?;
    Ok((x, rows, dim))
}

fn read_npy_labels(display: &str, bytes: &[u8]) -> Result<Vec<i64>> {
    let npy = parse_npy(display, bytes)?;
    if !(npy.shape.len() == 1 || (npy.shape.len() == 2 && npy.shape[1] == 1)) {
        return Err(StageError::data(
            display,
            DataPlace::File,
            format!("expected a 1-D label vector, found shape {:?}", npy.shape),
        ));
    }
    to_int_labels(display, npy_values(display, &npy)?)
}

/// The pickle inside `bytes`: a pickle itself, or an object `.npy` (`np.save` of a dict).
fn pickle_of(display: &str, bytes: &[u8]) -> Result<pickle::Value> {
    let bytes = maybe_gunzip(display, bytes)?;
    if bytes.starts_with(b"\x93NUMPY") {
        let (descr, payload) = npy_header(display, &bytes)?;
        if !descr.contains('O') {
            return Err(StageError::data(
                display,
                DataPlace::File,
                format!("is a plain .npy array (dtype {descr}), not a pickle of features and labels: declare it with `format: npy` and the roles `x`/`y`"),
            ));
        }
        return pickle::read(display, payload);
    }
    if !pickle::is_pickle(&bytes) {
        return Err(StageError::data(
            display,
            DataPlace::File,
            "is not a pickle (protocol 2 or later) nor an object .npy file".to_string(),
        ));
    }
    pickle::read(display, &bytes)
}

/// Features and labels of a pickled `(X, y)` tuple or `{'data': X, 'label': y}` dict (also
/// inside a 0-d object array, as `np.save` of a dict writes it).
fn read_pickle(display: &str, bytes: &[u8]) -> Result<Raw> {
    use pickle::{ArrayData, Value};
    let bad = |msg: String| StageError::data(display, DataPlace::File, msg);
    let mut v = pickle_of(display, bytes)?;
    // A 0-d object array wrapping the real value.
    if let Value::Array(a) = &v {
        if let (true, ArrayData::Objects(items)) = (a.shape.is_empty(), &a.data) {
            if let [one] = items.as_slice() {
                v = one.clone();
            }
        }
    }
    let (x, y) = match v {
        Value::Tuple(items) | Value::List(items) if items.len() == 2 => {
            let mut it = items.into_iter();
            (it.next().expect("2"), it.next().expect("2"))
        }
        Value::Dict(pairs) => {
            let get = |names: &[&str]| {
                pairs
                    .iter()
                    .find(|(k, _)| matches!(k, Value::Str(s) if names.contains(&s.as_str())))
                    .map(|(_, v)| v.clone())
            };
            match (get(&["data", "X", "x"]), get(&["label", "labels", "y"])) {
                (Some(x), Some(y)) => (x, y),
                _ => {
                    let keys: Vec<String> = pairs
                        .iter()
                        .map(|(k, _)| match k {
                            Value::Str(s) => format!("'{s}'"),
                            other => format!("{other:?}"),
                        })
                        .collect();
                    return Err(bad(format!(
                        "holds a dict with keys {}; expected 'data' (features) and 'label' (labels)",
                        keys.join(", ")
                    )));
                }
            }
        }
        other => {
            return Err(bad(format!(
            "holds {}; expected a tuple (X, y) of numpy arrays or a dict {{'data': X, 'label': y}}",
            pickle_kind(&other)
        )))
        }
    };
    let (x, rows, dim) = match x {
        Value::Array(a) => pickle_matrix(display, a)?,
        other => {
            return Err(bad(format!(
                "holds {} as its features; expected a numpy array",
                pickle_kind(&other)
            )))
        }
    };
    let labels = match y {
        Value::Array(a) => {
            let npy = pickle_npy(display, a)?;
            if !(npy.shape.len() == 1 || (npy.shape.len() == 2 && npy.shape[1] == 1)) {
                return Err(bad(format!(
                    "its labels have shape {:?}; expected a 1-D vector",
                    npy.shape
                )));
            }
            to_int_labels(display, npy_values(display, &npy)?)?
        }
        Value::List(items) | Value::Tuple(items) => items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::Int(l) => Ok(*l),
                other => Err(StageError::data(
                    display,
                    DataPlace::Row(i + 1),
                    format!("label {} is not an integer", pickle_kind(other)),
                )),
            })
            .collect::<Result<Vec<_>>>()?,
        other => {
            return Err(bad(format!(
                "holds {} as its labels; expected a numpy array or a list of integers",
                pickle_kind(&other)
            )))
        }
    };
    if labels.len() != rows {
        return Err(bad(format!(
            "holds {rows} feature rows but {} labels: they must describe the same samples",
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

fn pickle_kind(v: &pickle::Value) -> String {
    use pickle::Value;
    match v {
        Value::None => "None".into(),
        Value::Bool(_) => "a bool".into(),
        Value::Int(_) => "an integer".into(),
        Value::Float(_) => "a float".into(),
        Value::Str(_) => "a string".into(),
        Value::Bytes(_) => "bytes".into(),
        Value::Tuple(t) => format!("a tuple of {} items", t.len()),
        Value::List(t) => format!("a list of {} items", t.len()),
        Value::Dict(d) => format!("a dict of {} items", d.len()),
        Value::Array(a) => format!("a numpy array {} of shape {:?}", a.descr, a.shape),
    }
}

/// A numeric pickled array as the `.npy` reader's array.
fn pickle_npy(display: &str, a: pickle::Array) -> Result<Npy> {
    match a.data {
        pickle::ArrayData::Raw(bytes) => Ok(Npy {
            descr: a.descr,
            fortran: a.fortran,
            shape: a.shape,
            data: std::rc::Rc::try_unwrap(bytes).unwrap_or_else(|rc| (*rc).clone()),
        }),
        pickle::ArrayData::Objects(_) => Err(StageError::data(
            display,
            DataPlace::File,
            format!(
                "holds an array of Python objects (shape {:?}) where numbers were expected",
                a.shape
            ),
        )),
    }
}

fn pickle_matrix(display: &str, a: pickle::Array) -> Result<(Vec<f32>, usize, usize)> {
    npy_matrix(display, pickle_npy(display, a)?)
}

fn read_parquet(display: &str, bytes: &[u8], label_column: &str) -> Result<Raw> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float32Type, Float64Type};
    use arrow_array::Array;
    use arrow_schema::DataType;
    let t = Table::from_parquet(bytes, &format!("`{display}`"))?;
    let names = t.column_names();
    let label_name = match label_column {
        "last" => names.last().cloned().unwrap_or_default(),
        "first" => names.first().cloned().unwrap_or_default(),
        other => match other.parse::<usize>() {
            Ok(i) => names.get(i).cloned().ok_or_else(|| {
                StageError::input(format!(
                    "`label_column: {i}` is out of range: `{display}` has {} columns",
                    names.len()
                ))
            })?,
            Err(_) => other.to_string(),
        },
    };
    if !names.contains(&label_name) {
        return Err(StageError::data(
            display,
            DataPlace::File,
            format!(
                "has no label column `{label_name}` (columns: {})",
                names.join(", ")
            ),
        ));
    }
    let mut labels = Vec::new();
    let mut x = Vec::new();
    let mut dim = 0;
    let mut rows = 0;
    for batch in t.batches() {
        let lab = arrow_cast_f64(
            batch.column_by_name(&label_name).expect("checked"),
            display,
            &label_name,
        )?;
        labels.extend(to_int_labels(display, lab)?);
        let feature_cols: Vec<(String, &arrow_array::ArrayRef)> = batch
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .filter(|n| n != &label_name)
            .map(|n| {
                let c = batch.column_by_name(&n).expect("exists");
                (n, c)
            })
            .collect();
        let list = feature_cols.iter().find(|(_, c)| {
            matches!(
                c.data_type(),
                DataType::FixedSizeList(_, _) | DataType::List(_)
            )
        });
        if let Some((name, col)) = list {
            let n = col.len();
            for i in 0..n {
                let v = match col.data_type() {
                    DataType::FixedSizeList(_, _) => col.as_fixed_size_list().value(i),
                    _ => col.as_list::<i32>().value(i),
                };
                let vals: Vec<f64> = match v.data_type() {
                    DataType::Float32 => v
                        .as_primitive::<Float32Type>()
                        .values()
                        .iter()
                        .map(|&f| f as f64)
                        .collect(),
                    DataType::Float64 => v.as_primitive::<Float64Type>().values().to_vec(),
                    other => {
                        return Err(StageError::data(
                            display,
                            DataPlace::File,
                            format!("list column `{name}` holds {other}, expected floats"),
                        ))
                    }
                };
                if dim == 0 {
                    dim = vals.len();
                } else if vals.len() != dim {
                    return Err(StageError::data(
                        display,
                        DataPlace::File,
                        format!(
                            "row {} of `{name}` has {} values, expected {dim} (ragged rows)",
                            rows + i + 1,
                            vals.len()
                        ),
                    ));
                }
                x.extend(vals.into_iter().map(|f| f as f32));
            }
        } else {
            let cols: Vec<Vec<f64>> = feature_cols
                .iter()
                .map(|(n, c)| arrow_cast_f64(c, display, n))
                .collect::<Result<_>>()?;
            dim = cols.len();
            for i in 0..batch.num_rows() {
                for c in &cols {
                    x.push(c[i] as f32);
                }
            }
        }
        rows += batch.num_rows();
    }
    if dim == 0 {
        return Err(StageError::data(
            display,
            DataPlace::File,
            format!("has no feature columns besides the label `{label_name}`"),
        ));
    }
    check_finite(display, &x, dim)?;
    Ok(Raw {
        x,
        rows,
        dim,
        labels,
    })
}

fn arrow_cast_f64(col: &arrow_array::ArrayRef, display: &str, name: &str) -> Result<Vec<f64>> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::*;
    use arrow_schema::DataType;
    if col.null_count() > 0 {
        return Err(StageError::data(
            display,
            DataPlace::File,
            format!(
                "column `{name}` has {} missing values; remove or impute them",
                col.null_count()
            ),
        ));
    }
    Ok(match col.data_type() {
        DataType::Float32 => col
            .as_primitive::<Float32Type>()
            .values()
            .iter()
            .map(|&v| v as f64)
            .collect(),
        DataType::Float64 => col.as_primitive::<Float64Type>().values().to_vec(),
        DataType::Int8 => col
            .as_primitive::<Int8Type>()
            .values()
            .iter()
            .map(|&v| v as f64)
            .collect(),
        DataType::Int16 => col
            .as_primitive::<Int16Type>()
            .values()
            .iter()
            .map(|&v| v as f64)
            .collect(),
        DataType::Int32 => col
            .as_primitive::<Int32Type>()
            .values()
            .iter()
            .map(|&v| v as f64)
            .collect(),
        DataType::Int64 => col
            .as_primitive::<Int64Type>()
            .values()
            .iter()
            .map(|&v| v as f64)
            .collect(),
        DataType::UInt8 => col
            .as_primitive::<UInt8Type>()
            .values()
            .iter()
            .map(|&v| v as f64)
            .collect(),
        DataType::UInt16 => col
            .as_primitive::<UInt16Type>()
            .values()
            .iter()
            .map(|&v| v as f64)
            .collect(),
        DataType::UInt32 => col
            .as_primitive::<UInt32Type>()
            .values()
            .iter()
            .map(|&v| v as f64)
            .collect(),
        DataType::UInt64 => col
            .as_primitive::<UInt64Type>()
            .values()
            .iter()
            .map(|&v| v as f64)
            .collect(),
        other => {
            return Err(StageError::data(
                display,
                DataPlace::File,
                format!("column `{name}` has type {other}, expected numbers"),
            ))
        }
    })
}

#[cfg(test)]
mod tests;
