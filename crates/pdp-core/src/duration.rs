//! The duration syntax of every flag and of the apiserver's `?timeout=`: Go-style (`10s`, `500ms`, `2m`), a bare
//! number being seconds. Its own layer, below the others, so that the front and the commands read durations
//! exactly as the webhook does without depending on the webhook.

use std::time::Duration;

/// Parses a Go-style duration as the apiserver writes it (`10s`, `500ms`, `1m`); a bare number is seconds.
/// `None` for anything else, and for a value too large for a [`Duration`] (never a panic: the text may come
/// from a request).
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().ok()?;
    let secs = match unit {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "us" | "µs" => value / 1e6,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(secs).ok()
}

/// A clap value parser for duration flags.
pub fn duration_flag(text: &str) -> Result<Duration, String> {
    parse_duration(text)
        .ok_or_else(|| format!("invalid duration {text:?} (examples: 50ms, 10s, 2m)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_like_the_apiserver_writes_them() {
        assert_eq!(parse_duration("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Some(Duration::from_secs(3)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("ten"), None);
        assert_eq!(parse_duration("5d"), None);
        assert_eq!(parse_duration(""), None);
        assert_eq!(parse_duration("99999999999999999999h"), None);
        assert_eq!(parse_duration("1e400"), None);
        assert_eq!(parse_duration("NaN"), None);
        assert!(
            duration_flag("ten")
                .unwrap_err()
                .contains("invalid duration \"ten\"")
        );
    }
}
