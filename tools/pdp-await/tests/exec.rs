//! `pdp-await exec` as the node-local flagd's container runs it: the real binary clears a stale socket and then
//! becomes the program (the same process), or says why the program cannot run.

use std::os::unix::net::UnixListener;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_pdp-await");

#[test]
fn exec_clears_the_stale_socket_then_becomes_the_program() {
    let dir = std::env::temp_dir().join(format!("pdp-await-exec-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // A listener dropped without unlinking its path: what a killed flagd leaves.
    let stale = dir.join("x.eval.sock");
    drop(UnixListener::bind(&stale).unwrap());
    let mut child = Command::new(BIN)
        .arg("exec")
        .arg(format!("--unlink-stale={}", stale.display()))
        .args([
            "--",
            "/bin/sh",
            "-c",
            "test ! -e \"$0\" && echo \"ran as $$\"",
        ])
        .arg(&stale)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = {
        let mut s = String::new();
        std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut s).unwrap();
        s
    };
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}: {out}");
    assert!(out.contains("removed the stale socket"), "{out}");
    // The program ran in the helper's own process: the kubelet's signals reach it.
    assert!(out.contains(&format!("ran as {pid}")), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn exec_says_why_the_program_cannot_run() {
    let out = Command::new(BIN)
        .args(["exec", "--", "/nonexistent/flagd-build"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot run /nonexistent/flagd-build"),
        "{stderr}"
    );
    let usage = Command::new(BIN)
        .args(["exec", "/a.sock"])
        .output()
        .unwrap();
    assert_eq!(usage.status.code(), Some(2));
}

#[test]
fn a_bad_argument_is_named_with_exit_status_2() {
    for (args, says) in [
        (
            &["wait", "--http", "localhost"][..],
            "expected HOST:PORT/PATH",
        ),
        (
            &["wait", "--http=127.0.0.1:1/", "--timeout=soon"],
            "invalid duration \"soon\"",
        ),
        (&["wait", "--http=127.0.0.1:1/", "--verbose"], "--verbose"),
        (&["chown", "cerbos:cerbos", "/tmp"], "expected UID:GID"),
        (&["sleep"], "sleep"),
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
    }
}
