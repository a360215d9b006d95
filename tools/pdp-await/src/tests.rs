//! pdp-await's commands on fixtures: parsing, the HTTP probe, the process watch, the stale sockets.

use super::*;
use crate::watch::app_processes;
use std::net::TcpListener;

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// The command line `pdp-await LIST...`, parsed.
fn parse(list: &[&str]) -> Result<Command, clap::Error> {
    super::parse(std::iter::once("pdp-await").chain(list.iter().copied()))
}

/// `pdp-await wait LIST...`'s options.
fn wait_options(list: &[&str]) -> Result<WaitOptions, clap::Error> {
    match parse(&[&["wait"], list].concat())? {
        Command::Wait(o) => Ok(o),
        other => panic!("{other:?}"),
    }
}

/// `pdp-await watch LIST...`'s options.
fn watch_options(list: &[&str]) -> Result<WatchOptions, clap::Error> {
    match parse(&[&["watch"], list].concat())? {
        Command::Watch(o) => Ok(o),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_command_line_is_well_formed() {
    cli().debug_assert();
}

#[test]
fn wait_options_parse() {
    let o = wait_options(&["--http", "127.0.0.1:3592/_cerbos/health", "--timeout=5s"]).unwrap();
    assert_eq!(o.http.authority, "127.0.0.1:3592");
    assert_eq!(o.http.path, "/_cerbos/health");
    assert_eq!(o.timeout, Duration::from_secs(5));
    assert_eq!(o.interval, Duration::from_millis(100));
    let o = wait_options(&["--http=http://[::1]:8014", "--interval", "50ms"]).unwrap();
    assert_eq!(
        (o.http.authority.as_str(), o.http.path.as_str()),
        ("[::1]:8014", "/")
    );
    assert_eq!(o.interval, Duration::from_millis(50));
    assert_eq!(
        wait_options(&["--http=h:1", "--interval=1ms"])
            .unwrap()
            .interval,
        Duration::from_millis(10)
    );
    for bad in [
        &["--http"][..],
        &["--timeout", "5s"],
        &["--http", "/_cerbos/health"],
        &["--http", "localhost"],
        &["--http", "127.0.0.1:1/", "--timeout", "soon"],
        &["--http", "127.0.0.1:1/", "--verbose"],
    ] {
        assert!(wait_options(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn commands_refuse_bad_usage_with_exit_2() {
    for bad in [
        &[][..],
        &["install"],
        &["install", "a", "b"],
        &["apps-done"],
        &["chown", "1:1"],
        &["chown", "root", "/tmp"],
        &["sleep"],
    ] {
        let e = parse(bad).unwrap_err();
        assert_eq!(e.exit_code(), 2, "{bad:?}: {e}");
    }
}

#[test]
fn status_lines() {
    assert_eq!(status_code(b"HTTP/1.1 200 OK\r\n"), Some(200));
    assert_eq!(
        status_code(b"HTTP/1.0 503 Service Unavailable\r\nx"),
        Some(503)
    );
    assert_eq!(status_code(b"HTTP/1.1 204\r\n"), Some(204));
    assert_eq!(status_code(b"SSH-2.0-OpenSSH\r\n"), None);
    assert_eq!(status_code(b"HTTP/1.1 20 OK\r\n"), None);
    assert_eq!(status_code(b""), None);
}

/// A server that answers 503 to the first `unready` requests, then 200; returns its address.
fn server(unready: usize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for (i, stream) in listener.incoming().enumerate() {
            let mut stream = stream.unwrap();
            let mut buf = [0u8; 1024];
            let n = stream.read(&mut buf).unwrap();
            let request = String::from_utf8_lossy(&buf[..n]).to_string();
            assert!(request.starts_with("GET /health HTTP/1.1\r\n"), "{request}");
            let status = if i < unready {
                "503 Service Unavailable"
            } else {
                "200 OK"
            };
            let _ = write!(stream, "HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n");
        }
    });
    addr
}

#[test]
fn wait_returns_once_the_pdp_answers_and_not_before() {
    let addr = server(3);
    let o = wait_options(&["--http", &format!("{addr}/health"), "--interval=20ms"]).unwrap();
    let message = wait(&o).unwrap();
    assert!(message.contains("with 200"), "{message}");
    assert!(message.contains("(4 attempts)"), "{message}");
}

#[test]
fn wait_gives_up_at_the_timeout_saying_what_it_last_saw() {
    // A port nothing listens on (bound, then released).
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let o = wait_options(&[
        "--http",
        &format!("{addr}/health"),
        "--timeout=300ms",
        "--interval=50ms",
    ])
    .unwrap();
    let started = Instant::now();
    let message = wait(&o).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        message.contains("did not answer") && message.contains("refused"),
        "{message}"
    );
    // Always unready: the last answer is named.
    let addr = server(usize::MAX);
    let o = wait_options(&[
        "--http",
        &format!("{addr}/health"),
        "--timeout=200ms",
        "--interval=20ms",
    ])
    .unwrap();
    assert!(wait(&o).unwrap_err().contains("last: HTTP 503"));
}

#[test]
fn exec_arguments() {
    let Command::Exec { stale, program } = parse(&[
        "exec",
        "--unlink-stale",
        "/a.sock",
        "--unlink-stale=/b.sock",
        "--",
        "/flagd-build",
        "start",
        "--port=8013",
    ])
    .unwrap() else {
        panic!("not exec")
    };
    assert_eq!(
        stale,
        vec![PathBuf::from("/a.sock"), PathBuf::from("/b.sock")]
    );
    assert_eq!(program, args(&["/flagd-build", "start", "--port=8013"]));
    for bad in [
        &["exec", "--unlink-stale", "/a"][..],
        &["exec", "--"],
        &["exec", "--unlink-stale", "--"],
        &["exec", "--keep", "/a", "--", "x"],
        &["exec", "/a.sock"],
    ] {
        assert!(parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn only_a_socket_nobody_answers_on_is_removed() {
    let dir = std::env::temp_dir().join(format!("pdp-await-stale-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // A listener dropped without unlinking its path: what a killed process leaves.
    let stale = dir.join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let live = dir.join("live.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&live).unwrap();
    let file = dir.join("file.sock");
    std::fs::write(&file, "not a socket").unwrap();

    assert!(
        unlink_stale(&stale)
            .unwrap()
            .unwrap()
            .contains("removed the stale socket")
    );
    assert!(!stale.exists());
    assert!(unlink_stale(&live).unwrap().unwrap().contains("answers"));
    assert!(live.exists());
    assert!(
        unlink_stale(&file)
            .unwrap()
            .unwrap()
            .contains("not a socket")
    );
    assert!(file.exists());
    assert_eq!(unlink_stale(&dir.join("absent.sock")), Ok(None));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A Pod's shared process namespace, faked: the sandbox (1), the PDP (10, 11), an app (20), a second watch
/// container (40), and this watch container (30, and "self").
#[test]
fn watch_stops_the_pdp_once_no_app_process_is_left() {
    let root = std::env::temp_dir().join(format!("pdp-await-watch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let (proc_root, state) = (root.join("proc"), root.join("state"));
    std::fs::create_dir_all(&state).unwrap();
    let put = |pid: &str, cg: &str| {
        std::fs::create_dir_all(proc_root.join(pid)).unwrap();
        std::fs::write(proc_root.join(pid).join("cgroup"), cg).unwrap();
    };
    for (pid, cg) in [
        ("1", "0::/../sandbox\n"),
        ("10", "0::/../pdp\n"),
        ("11", "0::/../pdp\n"),
        ("20", "0::/../app\n"),
        ("30", "0::/\n"),
        ("self", "0::/\n"),
        ("40", "0::/../watch2\n"),
    ] {
        put(pid, cg);
    }
    std::fs::write(state.join("cerbos-pdp.pids"), "10").unwrap();
    std::fs::write(state.join("watch-2.pids"), "40").unwrap();
    assert_eq!(app_processes(&proc_root, &state), vec![20]);
    // Without the PDP's record, its processes would count as apps.
    std::fs::remove_file(state.join("cerbos-pdp.pids")).unwrap();
    let mut apps = app_processes(&proc_root, &state);
    apps.sort();
    assert_eq!(apps, vec![10, 11, 20]);
    std::fs::write(state.join("cerbos-pdp.pids"), "10").unwrap();
    record_own(&proc_root, &state.join("watch-own.pids")).unwrap();
    assert_eq!(
        std::fs::read_to_string(state.join("watch-own.pids")).unwrap(),
        "30"
    );

    let stop = state.join("stop-cerbos-pdp");
    let options = WatchOptions {
        state: state.clone(),
        stop: stop.clone(),
        grace: Duration::from_millis(100),
        interval: Duration::from_millis(10),
    };
    std::fs::remove_dir_all(proc_root.join("20")).unwrap();
    let started = Instant::now();
    let said = watch(&proc_root, &options).unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(100),
        "stopped before the grace"
    );
    assert!(said.contains("no app process left"), "{said}");
    assert!(apps_done(&stop).is_some());
    assert!(watch_options(&["--state", "/s"]).is_err());
    let o = watch_options(&["--state=/s", "--stop", "/s/x", "--grace", "330s"]).unwrap();
    assert_eq!(o.grace, Duration::from_secs(330));
    assert_eq!(o.interval, Duration::from_secs(1));
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn chown_takes_numeric_owners_and_only_directories() {
    assert_eq!(
        owner_ids("10001:10001"),
        Ok(Owner {
            uid: 10001,
            gid: 10001
        })
    );
    for bad in ["10001", "cerbos:cerbos", "1:", ":1", "-1:1"] {
        assert!(owner_ids(bad).is_err(), "{bad}");
    }
    let dir = std::env::temp_dir().join(format!("pdp-await-chown-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    use std::os::unix::fs::MetadataExt;
    let me = std::fs::metadata(&dir).unwrap();
    // To its current owner: allowed without any capability.
    let message = chown(&dir, me.uid(), me.gid()).unwrap();
    assert!(message.contains("now belongs to"), "{message}");
    let file = dir.join("f");
    std::fs::write(&file, "").unwrap();
    assert!(
        chown(&file, me.uid(), me.gid())
            .unwrap_err()
            .contains("not a directory")
    );
    let link = dir.join("link");
    std::os::unix::fs::symlink(&dir, &link).unwrap();
    assert!(
        chown(&link, me.uid(), me.gid())
            .unwrap_err()
            .contains("not a directory")
    );
    assert!(chown(&dir.join("missing"), 0, 0).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn apps_done_only_when_the_annotation_has_a_value() {
    let dir = std::env::temp_dir().join(format!("pdp-await-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("apps-done");
    assert_eq!(apps_done(&file), None, "missing file");
    std::fs::write(&file, "").unwrap();
    assert_eq!(apps_done(&file), None, "empty: the annotation is not set");
    std::fs::write(&file, "app: exit 0").unwrap();
    assert!(apps_done(&file).unwrap().contains("(app: exit 0)"));
    // install copies the running binary (here: the test binary) under its fixed name, executable.
    let message = install(&dir).unwrap();
    assert!(message.contains("pdp-await"), "{message}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.join("pdp-await"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o555);
    assert!(install(&dir.join("missing")).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}
