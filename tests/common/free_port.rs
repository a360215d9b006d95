// Shared by tests/common/process.rs and tests/node_proxy_groups.rs: a port of 127.0.0.1 that was free a moment
// ago, for a child process that must be told its port (it cannot report one it picked itself).

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
