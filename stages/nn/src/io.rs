//! safetensors writing with a canonical layout (sorted names, packed offsets, sorted header
//! keys), so that the same weights always give the same bytes.

use std::collections::BTreeMap;

/// Write tensors `(name, shape, little-endian bytes)` of one dtype as safetensors.
pub fn write_safetensors(
    tensors: impl Iterator<Item = (String, Vec<usize>, Vec<u8>)>,
    dtype: &str,
    metadata: &BTreeMap<String, String>,
) -> Vec<u8> {
    let tensors: Vec<_> = tensors.collect();
    let mut header = String::from("{");
    if !metadata.is_empty() {
        header.push_str("\"__metadata__\":{");
        let fields: Vec<String> = metadata
            .iter()
            .map(|(k, v)| format!("{}:{}", json_str(k), json_str(v)))
            .collect();
        header.push_str(&fields.join(","));
        header.push('}');
    }
    let mut offset = 0usize;
    let mut sorted: Vec<&(String, Vec<usize>, Vec<u8>)> = tensors.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    for (i, (name, shape, bytes)) in sorted.iter().enumerate() {
        if i > 0 || !metadata.is_empty() {
            header.push(',');
        }
        let shape: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        header.push_str(&format!(
            "{}:{{\"dtype\":\"{dtype}\",\"shape\":[{}],\"data_offsets\":[{offset},{}]}}",
            json_str(name),
            shape.join(","),
            offset + bytes.len()
        ));
        offset += bytes.len();
    }
    header.push('}');
    // Pad the header with spaces to a multiple of 8 bytes (as the reference writer does).
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut out = Vec::with_capacity(8 + header.len() + offset);
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for (_, _, bytes) in sorted {
        out.extend_from_slice(bytes);
    }
    out
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_file_is_read_back_by_the_safetensors_crate() {
        let w: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let b: Vec<u8> = [0.5f32, -0.5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let meta = BTreeMap::from([("stage".to_string(), "pretrain".to_string())]);
        let bytes = write_safetensors(
            vec![
                ("encoder.0.weight".to_string(), vec![2, 3], w),
                ("encoder.0.bias".to_string(), vec![2], b),
            ]
            .into_iter(),
            "F32",
            &meta,
        );
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut names = st.names();
        names.sort();
        assert_eq!(names, ["encoder.0.bias", "encoder.0.weight"]);
        let t = st.tensor("encoder.0.weight").unwrap();
        assert_eq!(t.shape(), &[2, 3]);
        assert_eq!(f32::from_le_bytes(t.data()[4..8].try_into().unwrap()), 2.0);
        let (_, md) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        assert_eq!(md.metadata().as_ref().unwrap()["stage"], "pretrain");
    }
}
