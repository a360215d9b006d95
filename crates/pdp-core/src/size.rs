//! Sizes as the flags of the binary read them (`--memory-budget` of `serve` and of `node-proxy`): Kubernetes
//! quantities, so a flag and the container limit it is derived from are written alike.

/// A kibibyte.
pub const KIB: u64 = 1024;
/// A mebibyte.
pub const MIB: u64 = 1024 * KIB;

/// Parses a size as Kubernetes writes quantities (`96Mi`, `1Gi`, `500M`, `1048576`).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size (for example 96Mi)"))?;
    let factor: u64 = match unit {
        "" => 1,
        "Ki" => KIB,
        "Mi" => MIB,
        "Gi" => 1024 * MIB,
        "k" => 1000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        _ => {
            return Err(format!(
                "{text:?}: unknown unit {unit:?} (use Ki, Mi, Gi, k, M or G)"
            ));
        }
    };
    value
        .checked_mul(factor)
        .ok_or_else(|| format!("{text:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_like_quantities() {
        assert_eq!(parse_size("96Mi"), Ok(96 * MIB));
        assert_eq!(parse_size("1Gi"), Ok(1024 * MIB));
        assert_eq!(parse_size("500M"), Ok(500_000_000));
        assert_eq!(parse_size("1048576"), Ok(MIB));
        assert!(parse_size("96MB").is_err());
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999999999999Gi").is_err());
    }
}
