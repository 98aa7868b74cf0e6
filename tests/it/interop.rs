//! Stored artifacts are plain Parquet and safetensors that other tools read.

use polars::prelude::*;

use crate::util::*;

#[test]
fn table_and_metrics_read_back_with_polars() {
    let env = Env::new();
    env.run_ok(&[]);
    let path = output_path(&env, "table/main", "table");
    let df = ParquetReader::new(std::fs::File::open(&path).unwrap())
        .finish()
        .unwrap();
    let names: Vec<String> = df
        .get_column_names()
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(
        names,
        [
            "dataset",
            "supervision",
            "method",
            "pretrain",
            "split",
            "metric",
            "mean",
            "std",
            "n"
        ]
    );
    // 4 cells × 2 splits × 3 metrics.
    assert_eq!(df.height(), 24);
    let n: Vec<u32> = df
        .column("n")
        .unwrap()
        .u32()
        .unwrap()
        .iter()
        .map(|v| v.unwrap())
        .collect();
    assert!(n.iter().all(|&v| v == 2), "{n:?}");
    let metrics = output_path(&env, "metrics/blobs/lv0.1/probpair/pre/t1", "metrics");
    let m = ParquetReader::new(std::fs::File::open(&metrics).unwrap())
        .finish()
        .unwrap();
    assert_eq!(m.height(), 2);
    for c in ["split", "acc", "nmi_arithmetic", "nmi_geometric", "ari"] {
        assert!(m.column(c).is_ok(), "metrics lacks `{c}`");
    }
    // Embeddings hold a FixedSizeList column (read by pyarrow, pandas, DuckDB; polars needs
    // its `dtype-array` feature, which upcc does not build): check the flat columns.
    let e = output_path(&env, "train/blobs/lv0.1/probpair/pre/t1", "embeddings");
    let emb = ParquetReader::new(std::fs::File::open(&e).unwrap())
        .with_columns(Some(vec!["id".into(), "split".into()]))
        .finish()
        .unwrap();
    assert_eq!(emb.height(), 240);
}

#[test]
fn pretrained_weights_read_back_with_safetensors() {
    let env = Env::new();
    env.run_ok(&[]);
    let bytes = std::fs::read(output_path(&env, "pretrain/blobs/s0", "weights")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names = st.names();
    names.sort();
    let expected = [
        "decoder.0.bias",
        "decoder.0.weight",
        "decoder.1.bias",
        "decoder.1.weight",
        "decoder.2.bias",
        "decoder.2.weight",
        "encoder.0.bias",
        "encoder.0.weight",
        "encoder.1.bias",
        "encoder.1.weight",
        "encoder.2.bias",
        "encoder.2.weight",
    ];
    assert_eq!(names, expected);
    // encoder.0: 8 features → 16 hidden, stored out×in as PyTorch does.
    let w = st.tensor("encoder.0.weight").unwrap();
    assert_eq!(w.shape(), &[16, 8]);
    assert_eq!(w.dtype(), safetensors::Dtype::F32);
    assert_eq!(st.tensor("decoder.2.weight").unwrap().shape(), &[8, 16]);
    assert_eq!(st.tensor("encoder.2.weight").unwrap().shape(), &[4, 16]);
}
