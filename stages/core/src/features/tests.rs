//! Readers, validation, splits and scaling on small files of every format.

use std::collections::BTreeMap;
use std::io::Write;

use super::*;

fn params(format: DataFormat) -> FeatureParams {
    FeatureParams {
        format,
        label_column: "last".into(),
        header: HeaderMode::Auto,
        scaling: Scaling::None,
        split: Split {
            kind: SplitKind::Stratified,
            test_fraction: 0.25,
            seed: 0,
        },
        n_classes: None,
        validation: 0,
        validation_order: None,
        labels: None,
    }
}

fn files<'a>(entries: &[(&str, &'a [u8])]) -> BTreeMap<String, SourceFile<'a>> {
    entries
        .iter()
        .map(|(role, bytes)| {
            (
                role.to_string(),
                SourceFile {
                    display: format!("{role}.file"),
                    bytes,
                },
            )
        })
        .collect()
}

/// 8 rows, 3 features, classes 0/1 alternating.
fn csv_text(header: bool) -> String {
    let mut s = String::new();
    if header {
        s.push_str("f1,f2,f3,label\n");
    }
    for i in 0..8 {
        s.push_str(&format!("{},{},{},{}\n", i, i * 2, 255 - i, i % 2));
    }
    s
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn err(params: &FeatureParams, f: &BTreeMap<String, SourceFile<'_>>) -> String {
    match build(params, f) {
        Err(e) if e.is_user() => e.to_string(),
        other => panic!("expected an input error, got {:?}", other.map(|f| f.rows())),
    }
}

#[test]
fn csv_with_and_without_header_and_gzip_agree() {
    let a = build(
        &params(DataFormat::Csv),
        &files(&[("data", csv_text(true).as_bytes())]),
    )
    .unwrap();
    let plain = csv_text(false);
    let b = build(
        &params(DataFormat::Csv),
        &files(&[("data", plain.as_bytes())]),
    )
    .unwrap();
    let gz = gzip(plain.as_bytes());
    let c = build(&params(DataFormat::Csv), &files(&[("data", &gz)])).unwrap();
    assert_eq!(a, b);
    assert_eq!(b, c);
    assert_eq!((a.rows(), a.dim, a.n_classes), (8, 3, 2));
    assert_eq!(a.row(3), &[3.0, 6.0, 252.0]);
    assert_eq!(a.labels[3], 1);
    // Stratified 25%: one test sample per class of 4.
    assert_eq!(a.is_test.iter().filter(|&&t| t).count(), 2);
}

#[test]
fn label_column_by_name_first_or_index() {
    let text = "label f1 f2\n0 1.5 2\n1 3 4\n0 5 6\n1 7 8\n0 1 1\n1 2 2\n0 3 3\n1 4 4\n";
    let mut p = params(DataFormat::Csv);
    for col in ["label", "first", "0"] {
        p.label_column = col.into();
        let f = build(&p, &files(&[("data", text.as_bytes())])).unwrap();
        assert_eq!(f.dim, 2);
        assert_eq!(f.row(0), &[1.5, 2.0]);
    }
}

#[test]
fn csv_errors_name_file_line_and_fix() {
    let p = params(DataFormat::Csv);
    let ragged = "1,2,0\n3,4,1\n5,1\n";
    assert!(
        err(&p, &files(&[("data", ragged.as_bytes())])).contains("line 3: 2 columns, expected 3")
    );
    let nan = "1,2,0\n3,nan,1\n5,6,0\n7,8,1\n";
    let m = err(&p, &files(&[("data", nan.as_bytes())]));
    assert!(
        m.contains("line 2, column 2") && m.contains("not finite"),
        "{m}"
    );
    // The place is structured, not only text.
    match build(&p, &files(&[("data", nan.as_bytes())])) {
        Err(StageError::Data { file, place, .. }) => {
            assert_eq!(file, "data.file");
            assert_eq!(place, DataPlace::Cell { line: 2, column: 2 });
        }
        other => panic!("expected a data error, got {:?}", other.map(|f| f.rows())),
    }
    let text = "1,2,0\n3,x,1\n";
    assert!(err(&p, &files(&[("data", text.as_bytes())])).contains("`x` is not a number"));
    let frac = "1,2,0.5\n3,4,1\n";
    assert!(err(&p, &files(&[("data", frac.as_bytes())])).contains("not an integer class index"));
    let neg = "1,2,-1\n3,4,1\n";
    assert!(err(&p, &files(&[("data", neg.as_bytes())])).contains("negative"));
    let mut bounded = params(DataFormat::Csv);
    bounded.n_classes = Some(2);
    let big = "1,2,0\n3,4,1\n5,6,7\n1,1,0\n";
    let m = err(&bounded, &files(&[("data", big.as_bytes())]));
    assert!(m.contains("label 7 (row 3) is outside 0..2"), "{m}");
    let gap = "1,2,0\n3,4,2\n5,6,0\n7,8,2\n";
    assert!(err(&p, &files(&[("data", gap.as_bytes())])).contains("class 1 has no"));
    assert!(err(&p, &files(&[("data", b"\xff\xfe\x00")])).contains("not UTF-8"));
    assert!(err(&p, &files(&[("data", b"")])).contains("is empty"));
}

fn idx(ty: u8, dims: &[u32], payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0, 0, ty, dims.len() as u8];
    for d in dims {
        v.extend_from_slice(&d.to_be_bytes());
    }
    v.extend_from_slice(payload);
    v
}

#[test]
fn idx_images_gzipped_or_not_with_official_split() {
    let img: Vec<u8> = (0..6 * 4).map(|i| i as u8).collect();
    let images = idx(0x08, &[6, 2, 2], &img);
    let labels = idx(0x08, &[6], &[0, 1, 2, 0, 1, 2]);
    let test_images = gzip(&idx(0x08, &[3, 2, 2], &img[..12]));
    let test_labels = gzip(&idx(0x08, &[3], &[2, 1, 0]));
    let mut p = params(DataFormat::Idx);
    p.split.kind = SplitKind::Official;
    p.scaling = Scaling::Multiply(0.02);
    let f = build(
        &p,
        &files(&[
            ("train_x", &images),
            ("train_y", &labels),
            ("test_x", &test_images),
            ("test_y", &test_labels),
        ]),
    )
    .unwrap();
    assert_eq!((f.rows(), f.dim, f.n_classes), (9, 4, 3));
    assert_eq!(f.is_test.iter().filter(|&&t| t).count(), 3);
    assert!((f.row(1)[0] - 4.0 * 0.02).abs() < 1e-6);
    assert_eq!(f.labels[6..], [2, 1, 0]);
    // Header claims more data than present.
    let bad = idx(0x08, &[7, 2, 2], &img);
    let m = err(
        &p,
        &files(&[
            ("train_x", &bad),
            ("train_y", &labels),
            ("test_x", &test_images),
            ("test_y", &test_labels),
        ]),
    );
    assert!(m.contains("IDX header says"), "{m}");
    // Label count differs from image count.
    let short = idx(0x08, &[5], &[0, 1, 2, 0, 1]);
    let m = err(
        &p,
        &files(&[
            ("train_x", &images),
            ("train_y", &short),
            ("test_x", &test_images),
            ("test_y", &test_labels),
        ]),
    );
    assert!(m.contains("6 rows but") && m.contains("5 labels"), "{m}");
}

fn npy(descr: &str, shape: &str, fortran: bool, data: &[u8]) -> Vec<u8> {
    let mut header = format!(
        "{{'descr': '{descr}', 'fortran_order': {}, 'shape': ({shape}), }}",
        if fortran { "True" } else { "False" }
    );
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut v = b"\x93NUMPY\x01\x00".to_vec();
    v.extend_from_slice(&(header.len() as u16).to_le_bytes());
    v.extend_from_slice(header.as_bytes());
    v.extend_from_slice(data);
    v
}

#[test]
fn npy_float_uint8_and_fortran_order() {
    let vals: Vec<f32> = (0..8 * 2).map(|i| i as f32 * 0.5).collect();
    let x = npy(
        "<f4",
        "8, 2",
        false,
        &vals
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<_>>(),
    );
    let labels: Vec<i64> = (0..8).map(|i| i % 2).collect();
    let y = npy(
        "<i8",
        "8,",
        false,
        &labels
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<_>>(),
    );
    let f = build(&params(DataFormat::Npy), &files(&[("x", &x), ("y", &y)])).unwrap();
    assert_eq!((f.rows(), f.dim), (8, 2));
    assert_eq!(f.row(3), &[3.0, 3.5]);
    // The same matrix in Fortran order.
    let mut fortran = Vec::new();
    for c in 0..2 {
        for r in 0..8 {
            fortran.extend_from_slice(&vals[r * 2 + c].to_le_bytes());
        }
    }
    let xf = npy("<f4", "8, 2", true, &fortran);
    assert_eq!(
        build(&params(DataFormat::Npy), &files(&[("x", &xf), ("y", &y)])).unwrap(),
        f
    );
    // uint8 images (3-D) with uint8 labels.
    let img: Vec<u8> = (0..8 * 4).map(|i| i as u8).collect();
    let x8 = npy("|u1", "8, 2, 2", false, &img);
    let y8 = npy("|u1", "8,", false, &[0, 1, 0, 1, 0, 1, 0, 1]);
    let f8 = build(&params(DataFormat::Npy), &files(&[("x", &x8), ("y", &y8)])).unwrap();
    assert_eq!(f8.dim, 4);
    // Pickled objects are refused with a conversion hint.
    let obj = npy("|O", "", false, b"");
    assert!(
        err(&params(DataFormat::Npy), &files(&[("x", &obj), ("y", &y)]))
            .contains("pickled Python objects")
    );
    // NaN in a float matrix.
    let mut bad = vals.clone();
    bad[5] = f32::NAN;
    let xn = npy(
        "<f4",
        "8, 2",
        false,
        &bad.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(),
    );
    assert!(
        err(&params(DataFormat::Npy), &files(&[("x", &xn), ("y", &y)]))
            .contains("row 3: column 2 is not finite")
    );
}

#[test]
fn parquet_with_list_column_or_numeric_columns() {
    let p = params(DataFormat::Parquet);
    let mut pl = p.clone();
    pl.label_column = "label".into();
    let listed = TableBuilder::new()
        .f32_rows("x", 2, (0..16).map(|i| i as f32).collect())
        .u32("label", (0..8).map(|i| i % 2).collect())
        .to_parquet()
        .unwrap();
    let f = build(&pl, &files(&[("data", &listed)])).unwrap();
    assert_eq!((f.rows(), f.dim), (8, 2));
    assert_eq!(f.row(2), &[4.0, 5.0]);
    let columns = TableBuilder::new()
        .f64("a", (0..8).map(|i| i as f64).collect())
        .f32("b", (0..8).map(|i| -(i as f32)).collect())
        .u32("label", (0..8).map(|i| i % 2).collect())
        .to_parquet()
        .unwrap();
    let g = build(&p, &files(&[("data", &columns)])).unwrap();
    assert_eq!(g.row(2), &[2.0, -2.0]);
    let mut missing = p.clone();
    missing.label_column = "class".into();
    assert!(err(&missing, &files(&[("data", &columns)])).contains("no label column `class`"));
}

#[test]
fn standardisation_is_fitted_on_train_only() {
    let mut p = params(DataFormat::Csv);
    p.scaling = Scaling::Standardize;
    let f = build(&p, &files(&[("data", csv_text(false).as_bytes())])).unwrap();
    let train = f.train_indices();
    for j in 0..f.dim {
        let vals: Vec<f64> = train.iter().map(|&i| f.row(i)[j] as f64).collect();
        let mean = vals.iter().sum::<f64>() / vals.len() as f64;
        let var = vals.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / vals.len() as f64;
        assert!(
            mean.abs() < 1e-5 && (var - 1.0).abs() < 1e-4,
            "feature {j}: {mean} {var}"
        );
    }
}

#[test]
fn stratified_split_depends_on_seed_only_and_round_trips_through_parquet() {
    let text = (0..40)
        .map(|i| format!("{i},{}\n", i % 4))
        .collect::<String>();
    let mut p = params(DataFormat::Csv);
    p.split.test_fraction = 0.2;
    let a = build(&p, &files(&[("data", text.as_bytes())])).unwrap();
    assert_eq!(a, build(&p, &files(&[("data", text.as_bytes())])).unwrap());
    p.split.seed = 1;
    let b = build(&p, &files(&[("data", text.as_bytes())])).unwrap();
    assert_ne!(a.is_test, b.is_test);
    for c in 0..4 {
        assert_eq!(
            (0..40)
                .filter(|&i| a.labels[i] == c && a.is_test[i])
                .count(),
            2
        );
    }
    let back = Features::from_parquet(&a.to_parquet().unwrap()).unwrap();
    assert_eq!(back, a);
}

#[test]
fn a_validation_split_takes_the_first_training_rows_and_leaves_the_rest() {
    // 40 rows, 4 classes, stratified 25% test: 30 training rows; reserve 6 of them, in row
    // order.
    let csv: String = (0..40).map(|i| format!("{}.0,{}\n", i, i % 4)).collect();
    let mut p = params(DataFormat::Csv);
    p.header = HeaderMode::No;
    p.validation = 6;
    p.validation_order = Some(ValidationOrder::Rows);
    let f = build(&p, &files(&[("data", csv.as_bytes())])).unwrap();
    let first_train: Vec<usize> = (0..40).filter(|&i| !f.is_test[i]).take(6).collect();
    assert_eq!(
        f.val_indices(),
        first_train,
        "the first training rows, in row order"
    );
    let n_train = f.is_test.iter().filter(|t| !**t).count();
    assert_eq!(f.train_indices().len(), n_train - 6);
    assert!(f
        .train_indices()
        .iter()
        .all(|&i| !f.is_val[i] && !f.is_test[i]));
    // Through Parquet and back.
    let g = Features::from_parquet(&f.to_parquet().unwrap()).unwrap();
    assert_eq!(g.is_val, f.is_val);
    assert_eq!(g.is_test, f.is_test);
    // Reserving every training row is refused.
    p.validation = n_train;
    let e = build(&p, &files(&[("data", csv.as_bytes())])).unwrap_err();
    assert!(
        e.to_string().contains(&format!("validation: {n_train}")),
        "{e}"
    );
}

#[test]
fn in_the_split_order_a_class_sorted_file_gives_validation_rows_of_every_class() {
    // Rows sorted by class (as the vendored MNIST sample is): in row order the first 5
    // training rows are all class 0; in a stratified split's own (shuffled) order they are
    // a seeded draw over the classes, the same on every build.
    let csv: String = (0..40).map(|i| format!("{}.0,{}\n", i, i / 10)).collect();
    let mut p = params(DataFormat::Csv);
    p.header = HeaderMode::No;
    p.validation = 5;
    p.validation_order = Some(ValidationOrder::Rows);
    let rows = build(&p, &files(&[("data", csv.as_bytes())])).unwrap();
    assert!(rows.val_indices().iter().all(|&i| rows.labels[i] == 0));
    p.validation_order = None; // the default: the split's order
    let a = build(&p, &files(&[("data", csv.as_bytes())])).unwrap();
    let b = build(&p, &files(&[("data", csv.as_bytes())])).unwrap();
    assert_eq!(a.is_val, b.is_val);
    assert_eq!(a.is_test, rows.is_test, "the split itself does not move");
    let classes: std::collections::BTreeSet<u32> =
        a.val_indices().iter().map(|&i| a.labels[i]).collect();
    assert!(classes.len() >= 2, "{classes:?}");
    assert_eq!(a.val_indices().len(), 5);
    assert!(a.val_indices().iter().all(|&i| !a.is_test[i]));
}

#[test]
fn without_a_validation_split_the_key_and_the_table_are_unchanged() {
    let p = params(DataFormat::Csv);
    let j = serde_json::to_value(&p).unwrap();
    assert!(j.get("validation").is_none(), "{j}");
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// `np.save(f, {'data': X, 'label': y}, allow_pickle=True)` by numpy 2.4.6 (the layout of the
/// Reuters-10k files): X float64 [[0.5, -1.25, 3.0], [1e-3, 2.5, -0.0]], y int32 [1, 0].
const DICT_NPY: &str = "934e554d5059010076007b276465736372273a20277c4f272c2027666f727472616e5f6f72646572273a2046616c73652c20277368617065273a2028292c207d2020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020200a80049555010000000000008c166e756d70792e5f636f72652e6d756c74696172726179948c0c5f7265636f6e7374727563749493948c056e756d7079948c076e6461727261799493944b0085944301629487945294284b012968038c0564747970659493948c024f3894898887945294284b038c017c944e4e4e4affffffff4affffffff4b3f749462895d947d94288c046461746194680268054b008594680787945294284b014b024b038694680b8c02663894898887945294284b038c013c944e4e4e4affffffff4affffffff4b00749462894330000000000000e03f000000000000f4bf0000000000000840000000e04d62503f00000000000004400000000000000080947494628c056c6162656c94680268054b008594680787945294284b014b028594680b8c02693494898887945294284b03681b4e4e4e4affffffff4affffffff4b0074946289430801000000000000009474946275617494622e";

#[test]
fn a_dict_inside_an_object_npy_reads_as_features_and_labels() {
    let raw = read_pickle("train.npy", &unhex(DICT_NPY)).unwrap();
    assert_eq!((raw.rows, raw.dim), (2, 3));
    assert_eq!(raw.x, vec![0.5, -1.25, 3.0, 1e-3, 2.5, -0.0]);
    assert_eq!(raw.labels, vec![1, 0]);
    // The same file through `format: npy` says which format reads it.
    let e = read_npy_matrix("train.npy", &unhex(DICT_NPY))
        .unwrap_err()
        .to_string();
    assert!(e.contains("format: pickle"), "{e}");
}

#[test]
fn cifar100_fine_labels_map_onto_the_twenty_superclasses() {
    // CIFAR-100's superclasses as CC's `cluster.py` lists them (superclass → its 5 fine
    // classes): the same table as the dataset's `coarse_labels`.
    let groups: [[usize; 5]; 20] = [
        [72, 4, 95, 30, 55],
        [73, 32, 67, 91, 1],
        [92, 70, 82, 54, 62],
        [16, 61, 9, 10, 28],
        [51, 0, 53, 57, 83],
        [40, 39, 22, 87, 86],
        [20, 25, 94, 84, 5],
        [14, 24, 6, 7, 18],
        [43, 97, 42, 3, 88],
        [37, 17, 76, 12, 68],
        [49, 33, 71, 23, 60],
        [15, 21, 19, 31, 38],
        [75, 63, 66, 64, 34],
        [77, 26, 45, 99, 79],
        [11, 2, 35, 46, 98],
        [29, 93, 27, 78, 44],
        [65, 50, 74, 36, 80],
        [56, 52, 47, 59, 96],
        [8, 58, 90, 13, 48],
        [81, 69, 41, 89, 85],
    ];
    for (coarse, fines) in groups.iter().enumerate() {
        for &f in fines {
            assert_eq!(CIFAR100_COARSE[f] as usize, coarse, "fine class {f}");
        }
    }
    let mut labels: Vec<i64> = (0..100).collect();
    LabelMap::Cifar100Coarse.apply(&mut labels, "`c`").unwrap();
    assert_eq!(labels.iter().copied().max(), Some(19));
    // Labels already below 20 are superclasses: left alone.
    let mut coarse: Vec<i64> = (0..20).collect();
    LabelMap::Cifar100Coarse.apply(&mut coarse, "`c`").unwrap();
    assert_eq!(coarse, (0..20).collect::<Vec<i64>>());
    let e = LabelMap::Cifar100Coarse
        .apply(&mut [3, 100], "`c`")
        .unwrap_err()
        .to_string();
    assert!(e.contains("label 100 is not a CIFAR-100 class"), "{e}");
}
