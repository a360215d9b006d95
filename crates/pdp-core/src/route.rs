//! Which PDP instance a new connection goes to: pure functions over what a directory listing returned, so the
//! order is tested without sockets (the I/O is in [`super::proxy`]).
//!
//! An instance is one PDP Pod; it serves on its own socket `<instances dir>/<name><suffix>` (for example
//! `/var/run/cerbos/instances/cerbos-pdp-x7k2q.grpc.sock`). Because every instance has its own path, an old
//! instance that unlinks its socket on exit (Cerbos does, on start and on exit) never removes the socket a newer
//! one serves.
//!
//! **Newest first, by the socket's modification time.** A socket file is created by `bind(2)`, so its mtime is
//! the moment the instance started listening: the instance that bound last is the newest. Pod names are random
//! (`cerbos-pdp-x7k2q`) and cannot be ordered, so the name only breaks ties (greater name first), which keeps
//! the order total and repeatable. The front tries the instances in this order and takes the first that accepts
//! a connection: an instance whose file is gone, or that refuses (it closed its listener: Cerbos does so first
//! on SIGTERM, then drains its gRPC streams with GOAWAY), is skipped and gets no new connection.

use std::time::SystemTime;

/// One socket file found in the instances directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The instance name: the file name without the route's suffix.
    pub name: String,
    /// When the socket was bound (its mtime).
    pub bound_at: SystemTime,
}

/// The instance name of a directory entry for a route whose sockets end in `suffix`, or `None` when the entry
/// is not one: a hidden or temporary file (leading `.`), another route's socket, or the bare suffix.
pub fn instance_name<'a>(file_name: &'a str, suffix: &str) -> Option<&'a str> {
    let name = file_name.strip_suffix(suffix)?;
    (!name.is_empty() && !name.starts_with('.')).then_some(name)
}

/// Sorts the candidates in the order they are tried: newest bind first, then the greater name.
pub fn newest_first(candidates: &mut [Candidate]) {
    candidates.sort_by(|a, b| {
        b.bound_at
            .cmp(&a.bound_at)
            .then_with(|| b.name.cmp(&a.name))
    });
}

/// Checks a route's socket suffix: it must name files in one directory, so it is non-empty and has no `/`.
pub fn suffix_flag(text: &str) -> Result<String, String> {
    if text.is_empty() || text.contains('/') || text.contains('\0') {
        return Err(format!(
            "invalid instance socket suffix {text:?}: a non-empty file name ending without '/' (example: .grpc.sock)"
        ));
    }
    Ok(text.to_string())
}

/// Parses a file mode written in octal (`666`, `0o660`, `0660`), as `chmod` takes it; at most `0o777`.
pub fn mode_flag(text: &str) -> Result<u32, String> {
    let digits = text
        .strip_prefix("0o")
        .or_else(|| text.strip_prefix("0O"))
        .unwrap_or(text);
    match u32::from_str_radix(digits, 8) {
        Ok(mode) if !digits.is_empty() && mode <= 0o777 => Ok(mode),
        _ => Err(format!(
            "invalid socket mode {text:?}: octal permission bits up to 777 (examples: 666, 0o660)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(name: &str, secs: u64) -> Candidate {
        Candidate {
            name: name.to_string(),
            bound_at: SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
        }
    }

    #[test]
    fn names_of_a_route() {
        assert_eq!(
            instance_name("pdp-a.grpc.sock", ".grpc.sock"),
            Some("pdp-a")
        );
        assert_eq!(instance_name("pdp-a.http.sock", ".grpc.sock"), None);
        assert_eq!(instance_name(".grpc.sock", ".grpc.sock"), None);
        assert_eq!(instance_name(".pdp-a.grpc.sock", ".grpc.sock"), None);
        assert_eq!(instance_name("pdp-a.grpc.sock.tmp", ".grpc.sock"), None);
        // With a shorter suffix, every socket is an instance of the route.
        assert_eq!(
            instance_name("pdp-a.grpc.sock", ".sock"),
            Some("pdp-a.grpc")
        );
    }

    #[test]
    fn newest_bind_first_then_greater_name() {
        let mut c = vec![at("b", 10), at("a", 30), at("c", 20), at("d", 30)];
        newest_first(&mut c);
        let names: Vec<_> = c.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["d", "a", "c", "b"]);
    }

    #[test]
    fn flags() {
        assert_eq!(mode_flag("666"), Ok(0o666));
        assert_eq!(mode_flag("0o660"), Ok(0o660));
        assert_eq!(mode_flag("0777"), Ok(0o777));
        for bad in ["", "0o", "888", "1777", "rw", "-1"] {
            assert!(mode_flag(bad).is_err(), "{bad:?}");
        }
        assert_eq!(suffix_flag(".sock").as_deref(), Ok(".sock"));
        for bad in ["", "a/b.sock", "/x"] {
            assert!(suffix_flag(bad).is_err(), "{bad:?}");
        }
    }
}
