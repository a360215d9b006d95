//! Ports for child processes that must be told theirs.

/// A port of 127.0.0.1 that was free a moment ago (a child cannot report a port it picked itself).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap_or_else(|e| panic!("no free port on 127.0.0.1: {e}"))
        .port()
}
