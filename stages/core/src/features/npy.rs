//! `.npy`: an f32/f64/u8/int matrix and an int label vector (also what a pickle's
//! numpy arrays become).

use super::*;

pub(super) struct Npy {
    pub(super) descr: String,
    pub(super) fortran: bool,
    pub(super) shape: Vec<usize>,
    pub(super) data: Vec<u8>,
}

/// The `descr` of an `.npy` header and the bytes after the header.
pub(super) fn npy_header<'a>(display: &str, bytes: &'a [u8]) -> Result<(String, &'a [u8])> {
    let (npy, start) = npy_parts(display, bytes)?;
    Ok((npy.descr, &bytes[start..]))
}

pub(super) fn parse_npy(display: &str, bytes: &[u8]) -> Result<Npy> {
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
pub(super) fn npy_parts(display: &str, bytes: &[u8]) -> Result<(Npy, usize)> {
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

pub(super) fn npy_values(display: &str, npy: &Npy) -> Result<Vec<f64>> {
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

pub(super) fn read_npy_matrix(display: &str, bytes: &[u8]) -> Result<(Vec<f32>, usize, usize)> {
    npy_matrix(display, parse_npy(display, bytes)?)
}

pub(super) fn npy_matrix(display: &str, npy: Npy) -> Result<(Vec<f32>, usize, usize)> {
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

pub(super) fn read_npy_labels(display: &str, bytes: &[u8]) -> Result<Vec<i64>> {
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
