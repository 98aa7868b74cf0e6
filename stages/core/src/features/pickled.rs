//! Python pickles of numpy arrays as the paper's feature datasets are published: a tuple
//! `(X, y)` or a dict `{'data', 'label'}`, possibly inside an object `.npy` (the reader is
//! `pickle.rs`).

use super::*;

/// The pickle inside `bytes`: a pickle itself, or an object `.npy` (`np.save` of a dict).
pub(super) fn pickle_of(display: &str, bytes: &[u8]) -> Result<pickle::Value> {
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
pub(super) fn read_pickle(display: &str, bytes: &[u8]) -> Result<Raw> {
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

pub(super) fn pickle_kind(v: &pickle::Value) -> String {
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
pub(super) fn pickle_npy(display: &str, a: pickle::Array) -> Result<Npy> {
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

pub(super) fn pickle_matrix(display: &str, a: pickle::Array) -> Result<(Vec<f32>, usize, usize)> {
    npy_matrix(display, pickle_npy(display, a)?)
}
