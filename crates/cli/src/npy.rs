//! NumPy `.npy` arrays of dense vectors: the header (format versions 1 to 3),
//! then the rows, read one at a time so that an array larger than memory
//! streams. Only what embeddings come as is accepted: little-endian float32 or
//! float64, C order, two dimensions.

use std::io::Read;

use anyhow::{Result, bail};

/// The shape and element type of an array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub rows: u64,
    pub dim: usize,
    /// float64 entries (else float32).
    pub f64: bool,
}

impl Header {
    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.dim * if self.f64 { 8 } else { 4 }
    }
}

const MAGIC: &[u8] = b"\x93NUMPY";

/// Reads the header, leaving `r` at the first row; `name` is for messages.
pub fn read_header(r: &mut impl Read, name: &str) -> Result<Header> {
    let mut start = [0u8; 8];
    if r.read_exact(&mut start).is_err() || &start[..6] != MAGIC {
        bail!("{name}: not a NumPy .npy file (it does not start with \\x93NUMPY)");
    }
    let len = match start[6] {
        1 => {
            let mut b = [0u8; 2];
            r.read_exact(&mut b)?;
            u16::from_le_bytes(b) as usize
        }
        2 | 3 => {
            let mut b = [0u8; 4];
            r.read_exact(&mut b)?;
            u32::from_le_bytes(b) as usize
        }
        v => bail!("{name}: .npy format version {v} is not supported (1 to 3 are)"),
    };
    if len > 1 << 20 {
        bail!("{name}: the .npy header claims {len} bytes; the file is damaged");
    }
    let mut dict = vec![0u8; len];
    r.read_exact(&mut dict)
        .map_err(|_| anyhow::anyhow!("{name}: the .npy header is cut short"))?;
    let dict = String::from_utf8_lossy(&dict);
    parse_dict(&dict).map_err(|e| anyhow::anyhow!("{name}: {e}"))
}

/// Parses the header's Python dict literal, e.g.
/// `{'descr': '<f4', 'fortran_order': False, 'shape': (1000, 768), }`.
fn parse_dict(dict: &str) -> std::result::Result<Header, String> {
    let value = |key: &str| -> std::result::Result<&str, String> {
        let at = dict
            .find(&format!("'{key}'"))
            .ok_or_else(|| format!("the .npy header has no '{key}'"))?;
        let rest = dict[at + key.len() + 2..].trim_start();
        let rest = rest
            .strip_prefix(':')
            .ok_or_else(|| format!("the .npy header's '{key}' is malformed"))?;
        Ok(rest.trim_start())
    };
    let descr = value("descr")?;
    let f64 = if descr.starts_with("'<f4'") || descr.starts_with("'f4'") {
        false
    } else if descr.starts_with("'<f8'") || descr.starts_with("'f8'") {
        true
    } else {
        let shown: String = descr.chars().take_while(|&c| c != ',').collect();
        return Err(format!(
            "the array's element type is {shown}; vectors must be little-endian float32 \
             ('<f4') or float64 ('<f8'): convert with array.astype(numpy.float32)"
        ));
    };
    if value("fortran_order")?.starts_with("True") {
        return Err("the array is in Fortran order; save it in C order \
                    (numpy.ascontiguousarray(array))"
            .into());
    }
    let shape = value("shape")?;
    let inner = shape
        .strip_prefix('(')
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| "the .npy header's shape is malformed".to_string())?;
    let dims: Vec<u64> = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches('L').parse::<u64>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| format!("the .npy header's shape ({inner}) is malformed"))?;
    match dims[..] {
        [rows, dim] if dim > 0 => Ok(Header {
            rows,
            dim: dim as usize,
            f64,
        }),
        [_, 0] => Err("the array's vectors have 0 dimensions".into()),
        _ => Err(format!(
            "the array has shape ({inner}); vectors must come as a 2-D array of shape (n, d)"
        )),
    }
}

/// One row's entries as single precision (float64 rounded to nearest).
pub fn decode_row(bytes: &[u8], f64: bool) -> Vec<f32> {
    if f64 {
        bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32)
            .collect()
    } else {
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect()
    }
}

/// Writes a float32 `.npy` array of shape (rows, dim) from row-major `data`
/// (for benchmarks and tests).
#[cfg(any(test, feature = "bench"))]
pub fn write_f32(out: &mut impl std::io::Write, dim: usize, data: &[f32]) -> std::io::Result<()> {
    let rows = data.len() / dim;
    let mut dict =
        format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {dim}), }}");
    // Pad so that the data starts at a multiple of 64 bytes, ending with '\n'.
    while !(MAGIC.len() + 4 + dict.len() + 1).is_multiple_of(64) {
        dict.push(' ');
    }
    dict.push('\n');
    out.write_all(MAGIC)?;
    out.write_all(&[1, 0])?;
    out.write_all(&(dict.len() as u16).to_le_bytes())?;
    out.write_all(dict.as_bytes())?;
    for x in data {
        out.write_all(&x.to_le_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_numpy_writes_are_read() {
        let h =
            parse_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1000, 768), }").unwrap();
        assert_eq!(
            h,
            Header {
                rows: 1000,
                dim: 768,
                f64: false
            }
        );
        let h = parse_dict("{'descr': '<f8', 'fortran_order': False, 'shape': (3, 2)}").unwrap();
        assert!(h.f64 && h.rows == 3 && h.dim == 2);
        assert!(parse_dict("{'descr': '<i8', 'fortran_order': False, 'shape': (3, 2)}").is_err());
        assert!(parse_dict("{'descr': '>f4', 'fortran_order': False, 'shape': (3, 2)}").is_err());
        assert!(parse_dict("{'descr': '<f4', 'fortran_order': True, 'shape': (3, 2)}").is_err());
        assert!(parse_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (3,)}").is_err());
        assert!(parse_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 0)}").is_err());
    }

    #[test]
    fn written_arrays_read_back() {
        let data: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 2.0).collect();
        let mut bytes = Vec::new();
        write_f32(&mut bytes, 4, &data).unwrap();
        let mut r = &bytes[..];
        let h = read_header(&mut r, "x.npy").unwrap();
        assert_eq!((h.rows, h.dim, h.f64), (3, 4, false));
        assert_eq!((bytes.len() - r.len()) % 64, 0, "data aligned to 64 bytes");
        assert_eq!(decode_row(&r[..16], false), data[..4]);
    }
}
