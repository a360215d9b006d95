//! One front process for several node-local PDPs (`node-proxy --group`): the real binary serves Cerbos's socket
//! and flagd's two endpoints (evaluation, sync) at once, each to its own instance sockets. The fake instances
//! are echo servers on Unix sockets that tag each reply with their name; TCP stays on 127.0.0.1.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_pdp-injector");

/// A scratch directory with both groups' instance and socket directories.
fn temp_dir(name: &str) -> TempDir {
    let dir = TempDir::new(&format!("groups-{name}"));
    for sub in ["cerbos-instances", "flagd-instances", "cerbos", "flagd"] {
        // Writable by its owner alone, whatever the umask: the front refuses instance directories others can write.
        dir.mkdir(sub, 0o755);
    }
    dir
}

/// Kills the front if a test fails before stopping it.
struct Front(Child);

impl Drop for Front {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A fake instance: answers each line `x` with `<tag>:x`, on a thread per connection.
fn instance(path: &Path, tag: &'static str) {
    let listener = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            std::thread::spawn(move || {
                let mut write = stream.try_clone().unwrap();
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { return };
                    if writeln!(write, "{tag}:{line}").is_err() {
                        return;
                    }
                }
            });
        }
    });
}

use pdp_testkit::dir::TempDir;
use pdp_testkit::net::free_port;

fn ask<S: std::io::Read + Write>(mut stream: S, text: &str) -> String {
    writeln!(stream, "{text}").unwrap();
    let mut reply = String::new();
    BufReader::new(stream).read_line(&mut reply).unwrap();
    reply.trim_end().to_string()
}

fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(started.elapsed() < Duration::from_secs(10), "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the front did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The args of a front serving Cerbos's socket and flagd's evaluation and sync endpoints.
fn front_args(dir: &TempDir, eval_port: u16, sync_port: u16) -> Vec<String> {
    let p = |s: &str| dir.join(s).display().to_string();
    vec![
        "node-proxy".into(),
        "--no-tcp".into(),
        format!("--socket={}", p("cerbos/cerbos.sock")),
        format!("--instances={}", p("cerbos-instances")),
        "--socket-backend=.http.sock".into(),
        "--group".into(),
        format!(
            r#"{{listen: ["127.0.0.1:{eval_port}"], socket: {}, instances: {}, backend: .eval.sock}}"#,
            p("flagd/flagd.sock"),
            p("flagd-instances")
        ),
        "--group".into(),
        format!(
            r#"{{listen: ["127.0.0.1:{sync_port}"], socket: {}, instances: {}, backend: .sync.sock}}"#,
            p("flagd/sync.sock"),
            p("flagd-instances")
        ),
    ]
}

#[test]
fn one_front_serves_every_pdp_endpoint_to_its_own_instances() {
    let dir = temp_dir("serve");
    instance(
        &dir.join("cerbos-instances/cerbos-pdp-a.http.sock"),
        "cerbos-http",
    );
    instance(
        &dir.join("flagd-instances/flagd-node-a.eval.sock"),
        "flagd-eval",
    );
    instance(
        &dir.join("flagd-instances/flagd-node-a.sync.sock"),
        "flagd-sync",
    );
    let (eval_port, sync_port) = (free_port(), free_port());
    let mut front = Front(
        Command::new(BIN)
            .args(front_args(&dir, eval_port, sync_port))
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let sockets =
        ["cerbos/cerbos.sock", "flagd/flagd.sock", "flagd/sync.sock"].map(|s| dir.join(s));
    wait_until("the front created its three sockets", || {
        sockets.iter().all(|s| s.exists())
    });
    wait_until("the front listens on both flagd ports", || {
        [eval_port, sync_port]
            .iter()
            .all(|p| TcpStream::connect(("127.0.0.1", *p)).is_ok())
    });
    let unix = |s: &str| UnixStream::connect(dir.join(s)).unwrap();
    let tcp = |p: u16| TcpStream::connect(("127.0.0.1", p)).unwrap();
    assert_eq!(
        ask(unix("cerbos/cerbos.sock"), "check"),
        "cerbos-http:check"
    );
    assert_eq!(ask(unix("flagd/flagd.sock"), "eval"), "flagd-eval:eval");
    assert_eq!(ask(tcp(eval_port), "eval"), "flagd-eval:eval");
    assert_eq!(ask(unix("flagd/sync.sock"), "sync"), "flagd-sync:sync");
    assert_eq!(ask(tcp(sync_port), "sync"), "flagd-sync:sync");

    // SIGTERM drains every group and removes every stable socket.
    let killed = Command::new("kill")
        .args(["-TERM", &front.0.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = wait_exit(&mut front.0);
    assert!(status.success(), "{status}");
    for s in &sockets {
        assert!(!s.exists(), "{} left behind", s.display());
    }
}

#[test]
fn a_group_that_cannot_start_stops_the_whole_front() {
    let dir = temp_dir("partial");
    // The sync group's socket directory does not exist: that group cannot bind, so the front must not run with
    // Cerbos's socket and flagd's evaluation endpoint only.
    std::fs::remove_dir_all(dir.join("flagd")).unwrap();
    std::fs::create_dir_all(dir.join("flagd")).unwrap();
    let mut args = front_args(&dir, free_port(), free_port());
    let last = args.len() - 1;
    args[last] = args[last].replace("flagd/sync.sock", "missing/sync.sock");
    let mut front = Front(
        Command::new(BIN)
            .args(&args)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let status = wait_exit(&mut front.0);
    assert!(!status.success());
    let mut stderr = String::new();
    std::io::Read::read_to_string(front.0.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(stderr.contains("missing/sync.sock"), "{stderr}");
    assert!(!dir.join("cerbos/cerbos.sock").exists());
    assert!(!dir.join("flagd/flagd.sock").exists());

    // A group that does not parse is refused before anything starts, with what to write.
    let out = Command::new(BIN)
        .args([
            "node-proxy",
            "--group",
            r#"{listen: ["[::]:8015"], backend: .sync.sock}"#,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("a group needs instances"), "{stderr}");
}
