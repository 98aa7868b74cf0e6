//! CSV (optionally gzipped): one row per instance, a label column.

use super::*;

/// Decompress if the bytes start with the gzip magic.
pub(super) fn maybe_gunzip<'a>(
    display: &str,
    bytes: &'a [u8],
) -> Result<std::borrow::Cow<'a, [u8]>> {
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

pub(super) fn read_csv(
    display: &str,
    bytes: &[u8],
    label_column: &str,
    header: HeaderMode,
) -> Result<Raw> {
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
    let mut lines = text_lines(text);
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

/// The non-blank lines of a CSV text with their 0-based line numbers, past the byte-order mark
/// Excel's "CSV UTF-8" starts with.
pub(crate) fn text_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.strip_prefix('\u{feff}')
        .unwrap_or(text)
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
}

pub(super) fn is_nonfinite_token(f: &str) -> bool {
    matches!(
        f.to_ascii_lowercase().as_str(),
        "nan" | "inf" | "-inf" | "+inf" | "infinity" | "-infinity"
    )
}
