//! Parquet: a label column plus a list column or numeric columns.

use super::*;

pub(super) fn read_parquet(display: &str, bytes: &[u8], label_column: &str) -> Result<Raw> {
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

pub(super) fn arrow_cast_f64(
    col: &arrow_array::ArrayRef,
    display: &str,
    name: &str,
) -> Result<Vec<f64>> {
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
