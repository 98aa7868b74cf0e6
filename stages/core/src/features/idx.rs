//! IDX (MNIST/FMNIST, gzipped or not): a matrix file and a label file.

use super::*;

pub(super) fn idx_payload(display: &str, bytes: &[u8]) -> Result<(u8, Vec<usize>, Vec<u8>)> {
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

pub(super) fn idx_values(ty: u8, payload: &[u8]) -> Vec<f64> {
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

pub(super) fn read_idx_matrix(display: &str, bytes: &[u8]) -> Result<(Vec<f32>, usize, usize)> {
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

pub(super) fn read_idx_labels(display: &str, bytes: &[u8]) -> Result<Vec<i64>> {
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
