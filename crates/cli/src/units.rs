//! Quantities on the command line: counts (1e9, 2^34, 500_000_000) and byte
//! sizes (64G, 512M), for `plan` and `index build`.

/// A count of at least 1: a number (underscores allowed, exponents too) or a
/// power of two written `2^N`.
pub fn parse_count(s: &str) -> Result<f64, String> {
    let v = if let Some(exp) = s.strip_prefix("2^") {
        exp.parse::<i32>()
            .map(|e| 2f64.powi(e))
            .map_err(|e| e.to_string())
    } else {
        s.replace('_', "").parse::<f64>().map_err(|e| e.to_string())
    }?;
    if !(v >= 1.0 && v.is_finite()) {
        return Err(format!(
            "{s}: give a count of at least 1 (e.g. 1e9 or 2^34)"
        ));
    }
    Ok(v)
}

/// A byte size: a number with an optional unit K, M, G or T (powers of
/// 1024; `KB`, `KiB` and the like are the same).
pub fn parse_bytes(s: &str) -> Result<f64, String> {
    let (num, unit) = s.trim().split_at(
        s.trim()
            .find(|c: char| c.is_ascii_alphabetic())
            .unwrap_or(s.trim().len()),
    );
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s}: expected a size such as 64G or 512M"))?;
    let mult = match unit
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 1.0,
        "K" => 1024.0,
        "M" => 1024f64.powi(2),
        "G" => 1024f64.powi(3),
        "T" => 1024f64.powi(4),
        _ => return Err(format!("{s}: unknown unit; use K, M, G or T")),
    };
    Ok(n * mult)
}
