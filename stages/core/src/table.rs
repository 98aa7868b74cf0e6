//! Parquet tables with pinned writer settings, so the same data always gives the same bytes
//! (`created_by` is fixed, so a parquet upgrade does not change artifact bytes by itself).

use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Float32Builder, Float64Builder, Int64Builder, StringBuilder,
};
use arrow_array::{
    Array, ArrayRef, BooleanArray, FixedSizeListArray, Float32Array, Float64Array, Int64Array,
    RecordBatch, StringArray, UInt16Array, UInt32Array,
};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;

use crate::error::{Result, StageError};

/// The `created_by` string written into every Parquet file (pinned on purpose).
pub const CREATED_BY: &str = "upcc";
pub const PARQUET_MEDIA_TYPE: &str = "application/vnd.apache.parquet";

/// Builds one table column by column.
#[derive(Default)]
pub struct TableBuilder {
    fields: Vec<Field>,
    columns: Vec<ArrayRef>,
    metadata: Vec<(String, String)>,
}

impl TableBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    fn push(mut self, name: &str, array: ArrayRef, nullable: bool) -> Self {
        self.fields
            .push(Field::new(name, array.data_type().clone(), nullable));
        self.columns.push(array);
        self
    }

    pub fn u16(self, name: &str, v: Vec<u16>) -> Self {
        self.push(name, Arc::new(UInt16Array::from(v)), false)
    }
    pub fn u32(self, name: &str, v: Vec<u32>) -> Self {
        self.push(name, Arc::new(UInt32Array::from(v)), false)
    }
    pub fn f32(self, name: &str, v: Vec<f32>) -> Self {
        self.push(name, Arc::new(Float32Array::from(v)), false)
    }
    pub fn f64(self, name: &str, v: Vec<f64>) -> Self {
        self.push(name, Arc::new(Float64Array::from(v)), false)
    }
    pub fn str(self, name: &str, v: Vec<String>) -> Self {
        self.push(name, Arc::new(StringArray::from(v)), false)
    }
    pub fn i64(self, name: &str, v: Vec<i64>) -> Self {
        self.push(name, Arc::new(Int64Array::from(v)), false)
    }
    pub fn bool(self, name: &str, v: Vec<bool>) -> Self {
        self.push(name, Arc::new(BooleanArray::from(v)), false)
    }
    /// The train/test split column (`"train"` / `"test"`).
    pub fn split(self, name: &str, is_test: &[bool]) -> Self {
        self.split3(name, is_test, &[])
    }
    /// A split column `train` / `test` / `val` (validation rows; `is_val` may be empty).
    pub fn split3(self, name: &str, is_test: &[bool], is_val: &[bool]) -> Self {
        self.str(
            name,
            is_test
                .iter()
                .enumerate()
                .map(|(i, &t)| {
                    if t {
                        "test"
                    } else if is_val.get(i).copied().unwrap_or(false) {
                        "val"
                    } else {
                        "train"
                    }
                    .to_string()
                })
                .collect(),
        )
    }
    pub fn f32_opt(self, name: &str, v: Vec<Option<f32>>) -> Self {
        let mut b = Float32Builder::with_capacity(v.len());
        for x in v {
            b.append_option(x);
        }
        self.push(name, Arc::new(b.finish()), true)
    }
    pub fn f64_opt(self, name: &str, v: Vec<Option<f64>>) -> Self {
        let mut b = Float64Builder::with_capacity(v.len());
        for x in v {
            b.append_option(x);
        }
        self.push(name, Arc::new(b.finish()), true)
    }
    pub fn i64_opt(self, name: &str, v: Vec<Option<i64>>) -> Self {
        let mut b = Int64Builder::with_capacity(v.len());
        for x in v {
            b.append_option(x);
        }
        self.push(name, Arc::new(b.finish()), true)
    }
    pub fn str_opt(self, name: &str, v: Vec<Option<String>>) -> Self {
        let mut b = StringBuilder::new();
        for x in v {
            b.append_option(x);
        }
        self.push(name, Arc::new(b.finish()), true)
    }
    pub fn bool_opt(self, name: &str, v: Vec<Option<bool>>) -> Self {
        let mut b = BooleanBuilder::with_capacity(v.len());
        for x in v {
            b.append_option(x);
        }
        self.push(name, Arc::new(b.finish()), true)
    }
    /// A FixedSizeList<Float32>(dim) column from row-major values.
    pub fn f32_rows(self, name: &str, dim: usize, values: Vec<f32>) -> Self {
        let item = Arc::new(Field::new("item", DataType::Float32, false));
        let arr = FixedSizeListArray::try_new(
            item,
            dim as i32,
            Arc::new(Float32Array::from(values)),
            None,
        )
        .expect("row-major values have a multiple of dim elements");
        self.push(name, Arc::new(arr), false)
    }
    pub fn meta(mut self, key: &str, value: impl ToString) -> Self {
        self.metadata.push((key.to_string(), value.to_string()));
        self
    }

    /// Serialise as Parquet (snappy, one row group per 64k rows, pinned `created_by`).
    pub fn to_parquet(self) -> Result<Vec<u8>> {
        let schema = Arc::new(Schema::new(self.fields));
        let batch = RecordBatch::try_new(schema.clone(), self.columns)
            .map_err(|e| StageError::failed(format!("internal: cannot build table: {e}")))?;
        let kv: Vec<KeyValue> = self
            .metadata
            .into_iter()
            .map(|(k, v)| KeyValue::new(k, v))
            .collect();
        let props = WriterProperties::builder()
            .set_created_by(CREATED_BY.to_string())
            .set_compression(Compression::SNAPPY)
            .set_max_row_group_row_count(Some(65_536))
            .set_key_value_metadata(if kv.is_empty() { None } else { Some(kv) })
            .build();
        let mut out = Vec::new();
        let mut w = ArrowWriter::try_new(&mut out, schema, Some(props))
            .map_err(|e| StageError::failed(format!("internal: parquet writer: {e}")))?;
        w.write(&batch)
            .map_err(|e| StageError::failed(format!("internal: parquet write: {e}")))?;
        w.close()
            .map_err(|e| StageError::failed(format!("internal: parquet close: {e}")))?;
        Ok(out)
    }
}

/// A Parquet table read into memory.
pub struct Table {
    what: String,
    batches: Vec<RecordBatch>,
    metadata: Vec<(String, String)>,
    rows: usize,
}

impl Table {
    /// Read Parquet bytes; `what` names the table in error messages.
    pub fn from_parquet(bytes: &[u8], what: &str) -> Result<Table> {
        let bad = |e: String| StageError::Table {
            what: what.to_string(),
            message: format!("not a readable Parquet file: {e}"),
        };
        let builder =
            ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::copy_from_slice(bytes))
                .map_err(|e| bad(e.to_string()))?;
        let metadata = builder
            .metadata()
            .file_metadata()
            .key_value_metadata()
            .map(|kv| {
                kv.iter()
                    .map(|k| (k.key.clone(), k.value.clone().unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default();
        let reader = builder.build().map_err(|e| bad(e.to_string()))?;
        let mut batches = Vec::new();
        let mut rows = 0;
        for b in reader {
            let b = b.map_err(|e| bad(e.to_string()))?;
            rows += b.num_rows();
            batches.push(b);
        }
        Ok(Table {
            what: what.to_string(),
            batches,
            metadata,
            rows,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn meta(&self, key: &str) -> Option<&str> {
        self.metadata
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn column_names(&self) -> Vec<String> {
        self.batches
            .first()
            .map(|b| {
                b.schema()
                    .fields()
                    .iter()
                    .map(|f| f.name().clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn has_column(&self, name: &str) -> bool {
        self.column_names().iter().any(|c| c == name)
    }

    fn columns(&self, name: &str) -> Result<Vec<ArrayRef>> {
        self.batches
            .iter()
            .map(|b| {
                b.column_by_name(name)
                    .cloned()
                    .ok_or_else(|| StageError::Table {
                        what: self.what.clone(),
                        message: format!(
                            "no column `{name}` (columns: {})",
                            self.column_names().join(", ")
                        ),
                    })
            })
            .collect()
    }

    fn typed<A: Array + 'static, V>(
        &self,
        name: &str,
        ty: &str,
        f: impl Fn(&A) -> Vec<V>,
    ) -> Result<Vec<V>> {
        let mut out = Vec::with_capacity(self.rows);
        for col in self.columns(name)? {
            let arr = col
                .as_any()
                .downcast_ref::<A>()
                .ok_or_else(|| StageError::Table {
                    what: self.what.clone(),
                    message: format!(
                        "column `{name}` has type {}, expected {ty}",
                        col.data_type()
                    ),
                })?;
            out.extend(f(arr));
        }
        Ok(out)
    }

    pub fn u16(&self, name: &str) -> Result<Vec<u16>> {
        self.typed::<UInt16Array, _>(name, "UInt16", |a| a.values().to_vec())
    }
    pub fn u32(&self, name: &str) -> Result<Vec<u32>> {
        self.typed::<UInt32Array, _>(name, "UInt32", |a| a.values().to_vec())
    }
    pub fn f32(&self, name: &str) -> Result<Vec<f32>> {
        self.typed::<Float32Array, _>(name, "Float32", |a| a.values().to_vec())
    }
    pub fn f64(&self, name: &str) -> Result<Vec<f64>> {
        self.typed::<Float64Array, _>(name, "Float64", |a| a.values().to_vec())
    }
    pub fn str(&self, name: &str) -> Result<Vec<String>> {
        self.typed::<StringArray, _>(name, "Utf8", |a| {
            a.iter()
                .map(|s| s.unwrap_or_default().to_string())
                .collect()
        })
    }
    /// A split column as `is_test` flags.
    pub fn is_test(&self, name: &str) -> Result<Vec<bool>> {
        Ok(self.str(name)?.iter().map(|s| s == "test").collect())
    }
    /// A split column as `is_val` flags (validation rows).
    pub fn is_val(&self, name: &str) -> Result<Vec<bool>> {
        Ok(self.str(name)?.iter().map(|s| s == "val").collect())
    }
    pub fn f32_opt(&self, name: &str) -> Result<Vec<Option<f32>>> {
        self.typed::<Float32Array, _>(name, "Float32", |a| a.iter().collect())
    }
    pub fn bool_opt(&self, name: &str) -> Result<Vec<Option<bool>>> {
        self.typed::<BooleanArray, _>(name, "Boolean", |a| a.iter().collect())
    }

    /// A FixedSizeList<Float32> column as row-major values and its width.
    pub fn f32_rows(&self, name: &str) -> Result<(Vec<f32>, usize)> {
        let mut out = Vec::new();
        let mut width = None;
        for col in self.columns(name)? {
            let arr = col
                .as_any()
                .downcast_ref::<FixedSizeListArray>()
                .ok_or_else(|| StageError::Table {
                    what: self.what.clone(),
                    message: format!(
                        "column `{name}` has type {}, expected FixedSizeList<Float32>",
                        col.data_type()
                    ),
                })?;
            width = Some(arr.value_length() as usize);
            let values = arr
                .values()
                .as_any()
                .downcast_ref::<Float32Array>()
                .ok_or_else(|| StageError::Table {
                    what: self.what.clone(),
                    message: format!("column `{name}` does not hold Float32 values"),
                })?;
            let start = arr.offset() * arr.value_length() as usize;
            out.extend_from_slice(
                &values.values()[start..start + arr.len() * arr.value_length() as usize],
            );
        }
        Ok((out, width.unwrap_or(0)))
    }

    /// The first record batch's schema fields (for readers of user files).
    pub fn batches(&self) -> &[RecordBatch] {
        &self.batches
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_bytes_are_deterministic() {
        let build = || {
            TableBuilder::new()
                .u32("id", vec![0, 1, 2])
                .str("split", vec!["train".into(), "train".into(), "test".into()])
                .f32_rows("x", 2, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
                .f32_opt("y_clean", vec![Some(0.5), None, Some(1.0)])
                .meta("n_classes", 3)
                .to_parquet()
                .unwrap()
        };
        let bytes = build();
        assert_eq!(bytes, build());
        let t = Table::from_parquet(&bytes, "test table").unwrap();
        assert_eq!(t.rows(), 3);
        assert_eq!(t.u32("id").unwrap(), [0, 1, 2]);
        assert_eq!(
            t.f32_rows("x").unwrap(),
            (vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2)
        );
        assert_eq!(t.f32_opt("y_clean").unwrap(), [Some(0.5), None, Some(1.0)]);
        assert_eq!(t.meta("n_classes"), Some("3"));
        let err = t.u32("nope").unwrap_err().to_string();
        assert!(err.contains("no column `nope`"), "{err}");
        let err = t.f32("id").unwrap_err().to_string();
        assert!(err.contains("expected Float32"), "{err}");
    }
}
