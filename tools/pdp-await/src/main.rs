//! `pdp-await`: what pdp-injector puts into a classic sidecar (clusters before Kubernetes 1.29, which have no
//! native sidecars), so that the classic form keeps the two promises of the native one:
//!
//! - `install DIR`: the init container `pdp-injector-tools` copies this binary into an emptyDir shared with the
//!   PDP container (the PDP's image has no tool of its own to wait with: Cerbos's is FROM scratch).
//! - `wait --http HOST:PORT/PATH`: the PDP container's `postStart` hook. The kubelet starts a Pod's containers in
//!   order and does not start the next one until the previous one's `postStart` hook has returned; the PDP is
//!   first in the list, so the app starts only once the PDP answers its health check (Istio's
//!   `holdApplicationUntilProxyStarts` works the same way).
//! - `apps-done FILE`: the PDP container's liveness probe in a Pod that runs to completion (a Job's). FILE is the
//!   stop file in the Pod's shared emptyDir that `watch` writes once the Pod's app containers have ended; the
//!   probe then fails, the kubelet stops the PDP (SIGTERM: it exits 0) and does not restart it
//!   (`restartPolicy: Never`/`OnFailure`), so the Pod, and its Job, complete.
//! - `watch --state DIR --stop FILE [--grace D]`: the last container of such a Pod (started after the apps), in
//!   its shared process namespace: writes FILE once no app process has been left for D. `wait --record FILE`
//!   gives it the PDP's processes, which are not apps.
//! - `exec --unlink-stale PATH... -- PROGRAM ARGS...`: the command of the node-local flagd
//!   (manifests/components/flagd-node): removes each PATH that is a socket nobody answers on, then becomes
//!   PROGRAM. flagd (Go) refuses to bind a socket path that exists and never removes one it did not close, so a
//!   flagd container killed uncleanly (OOM, SIGKILL) could not restart in its Pod; this runs before every start
//!   of that container (the helper lives in an emptyDir of the Pod, so it survives the restarts).
//! - `chown UID:GID DIR...`: the init containers of the node-local DaemonSets hand the hostPath directory the
//!   kubelet created (as root, mode 0755) to the PDP's or the front's user, from the project's own image
//!   (root with CAP_CHOWN only, no shell, no third-party image).
//!
//! Standard library only, linked statically: it runs inside images without a C library.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

// The duration syntax of every pdp-injector flag (`120s`, `100ms`), shared as source: this binary links no
// crate but the standard library.
#[path = "../../../crates/pdp-core/src/duration.rs"]
mod duration;

const USAGE: &str = "usage:
  pdp-await install DIR                                   copy this binary to DIR/pdp-await
  pdp-await wait --http HOST:PORT/PATH [--timeout 120s] [--interval 100ms] [--record FILE]
                                                          exit 0 once GET answers 2xx/3xx; 1 at the timeout
                                                          (FILE: this container's processes, for watch)
  pdp-await watch --state DIR --stop FILE [--grace 0s] [--interval 1s]
                                                          write FILE once no app process of the Pod has
                                                          been left for the grace
  pdp-await apps-done FILE                                exit 1 when FILE is not empty (the app containers
                                                          of a run-to-completion Pod have ended)
  pdp-await exec [--unlink-stale PATH]... -- PROGRAM [ARG]...
                                                          remove each PATH that is a socket nobody answers
                                                          on, then run PROGRAM in this process
  pdp-await chown UID:GID DIR...                          give each DIR (not what is in it) to UID:GID";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(code) => code,
        Err(Usage(message)) => {
            eprintln!("pdp-await: {message}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// A command line that cannot be run.
#[derive(Debug, PartialEq)]
struct Usage(String);

fn run(args: &[String]) -> Result<ExitCode, Usage> {
    match args.first().map(String::as_str) {
        Some("install") => match &args[1..] {
            [dir] => Ok(report(install(Path::new(dir)))),
            _ => Err(Usage("install takes one directory".into())),
        },
        Some("wait") => {
            let options = WaitOptions::parse(&args[1..])?;
            let waited = wait(&options);
            // The PDP's own processes, for the watch container of a run-to-completion Pod (never fatal).
            if waited.is_ok()
                && let Some(file) = &options.record
                && let Err(e) = record_own(Path::new("/proc"), file)
            {
                eprintln!("pdp-await: {e}");
            }
            Ok(report(waited))
        }
        Some("watch") => {
            let options = WatchOptions::parse(&args[1..])?;
            Ok(report(watch(Path::new("/proc"), &options)))
        }
        Some("apps-done") => match &args[1..] {
            [file] => Ok(match apps_done(Path::new(file)) {
                Some(message) => {
                    println!("pdp-await: {message}");
                    ExitCode::from(1)
                }
                None => ExitCode::SUCCESS,
            }),
            _ => Err(Usage("apps-done takes one file".into())),
        },
        Some("exec") => {
            let (stale, program) = exec_args(&args[1..])?;
            for path in &stale {
                match unlink_stale(path) {
                    Ok(Some(note)) => println!("pdp-await: {note}"),
                    Ok(None) => {}
                    Err(e) => eprintln!("pdp-await: {e}"),
                }
            }
            Ok(report(exec(&program)))
        }
        Some("chown") => match &args[1..] {
            [owner, dirs @ ..] if !dirs.is_empty() => {
                let (uid, gid) = owner_ids(owner)?;
                // Every directory, each said; the first failure is the exit status.
                let outcomes: Vec<ExitCode> = dirs
                    .iter()
                    .map(|d| report(chown(Path::new(d), uid, gid)))
                    .collect();
                Ok(outcomes
                    .into_iter()
                    .find(|c| *c != ExitCode::SUCCESS)
                    .unwrap_or(ExitCode::SUCCESS))
            }
            _ => Err(Usage(
                "chown takes UID:GID and one or more directories".into(),
            )),
        },
        Some(other) => Err(Usage(format!("unknown command {other:?}"))),
        None => Err(Usage("no command".into())),
    }
}

/// Prints the outcome (the kubelet shows a failed hook's output in the Pod's events) and turns it into an exit
/// code.
fn report(outcome: Result<String, String>) -> ExitCode {
    match outcome {
        Ok(message) => {
            println!("pdp-await: {message}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("pdp-await: {message}");
            ExitCode::from(1)
        }
    }
}

/// Copies the running binary to `dir/pdp-await`, through a temporary name so that a half-written file is never
/// run.
fn install(dir: &Path) -> Result<String, String> {
    let me = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let target = dir.join("pdp-await");
    let partial = dir.join(".pdp-await.partial");
    let bytes = std::fs::copy(&me, &partial)
        .map_err(|e| format!("cannot copy {} to {}: {e}", me.display(), partial.display()))?;
    set_executable(&partial)?;
    std::fs::rename(&partial, &target)
        .map_err(|e| format!("cannot move {} into place: {e}", partial.display()))?;
    Ok(format!("installed {} ({bytes} bytes)", target.display()))
}

/// `UID:GID`, both numeric (the image has no user database).
fn owner_ids(text: &str) -> Result<(u32, u32), Usage> {
    let parsed = text
        .split_once(':')
        .and_then(|(u, g)| Some((u.parse().ok()?, g.parse().ok()?)));
    parsed.ok_or_else(|| Usage(format!("owner {text:?} is not UID:GID (numbers)")))
}

/// Gives `dir` itself to `uid:gid`; a symlink is refused rather than followed, since the directory is a hostPath
/// of the node.
fn chown(dir: &Path, uid: u32, gid: u32) -> Result<String, String> {
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    std::os::unix::fs::lchown(dir, Some(uid), Some(gid))
        .map_err(|e| format!("cannot give {} to {uid}:{gid}: {e}", dir.display()))?;
    Ok(format!("{} now belongs to {uid}:{gid}", dir.display()))
}

fn set_executable(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    // Readable and runnable by any user: the PDP container runs as a user of its own.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o555))
        .map_err(|e| format!("cannot make {} executable: {e}", path.display()))
}

/// `exec`'s arguments: the paths to clear, and the program with its arguments (after `--`).
fn exec_args(args: &[String]) -> Result<(Vec<PathBuf>, Vec<String>), Usage> {
    let split = args
        .iter()
        .position(|a| a == "--")
        .ok_or_else(|| Usage("exec needs -- PROGRAM".into()))?;
    let (flags, program) = (&args[..split], &args[split + 1..]);
    if program.is_empty() {
        return Err(Usage("exec needs a PROGRAM after --".into()));
    }
    let mut stale = Vec::new();
    let mut rest = flags.iter();
    while let Some(arg) = rest.next() {
        match arg.split_once('=') {
            Some(("--unlink-stale", v)) => stale.push(PathBuf::from(v)),
            None if arg == "--unlink-stale" => stale.push(PathBuf::from(
                rest.next()
                    .ok_or_else(|| Usage("--unlink-stale needs a path".into()))?,
            )),
            _ => return Err(Usage(format!("unknown flag {arg:?}"))),
        }
    }
    Ok((stale, program.to_vec()))
}

/// Removes `path` if it is a Unix socket that refuses connections (its process is gone); leaves anything else
/// (a live socket, another kind of file) for the program to report. `Ok(None)`: nothing was there.
fn unlink_stale(path: &Path) -> Result<Option<String>, String> {
    use std::os::unix::fs::FileTypeExt;
    let shown = path.display();
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot inspect {shown}: {e}")),
        Ok(m) if !m.file_type().is_socket() => {
            return Ok(Some(format!("{shown} is not a socket: left alone")));
        }
        Ok(_) => {}
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Ok(Some(format!("a process answers on {shown}: left alone"))),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            std::fs::remove_file(path).map_err(|e| format!("cannot remove {shown}: {e}"))?;
            Ok(Some(format!("removed the stale socket {shown}")))
        }
        Err(e) => Ok(Some(format!("{shown}: {e}: left alone"))),
    }
}

/// Replaces this process with `program` (same PID, so the kubelet's signals reach it); returns only on failure.
fn exec(program: &[String]) -> Result<String, String> {
    use std::os::unix::process::CommandExt;
    let err = std::process::Command::new(&program[0])
        .args(&program[1..])
        .exec();
    Err(format!("cannot run {}: {err}", program[0]))
}

/// What `wait` checks, and for how long.
#[derive(Debug, PartialEq)]
struct WaitOptions {
    /// `HOST:PORT`, as given.
    authority: String,
    /// The request path, with its leading `/`.
    path: String,
    timeout: Duration,
    interval: Duration,
    /// Where to write the PIDs of this container's processes once the PDP answers (`--record`), for `watch`.
    record: Option<PathBuf>,
}

impl WaitOptions {
    fn parse(args: &[String]) -> Result<WaitOptions, Usage> {
        let mut http = None;
        let mut timeout = Duration::from_secs(120);
        let mut interval = Duration::from_millis(100);
        let mut record = None;
        each_flag(args, |flag, value| {
            match flag {
                "--http" => http = Some(value),
                "--timeout" => timeout = duration_value(flag, &value)?,
                "--interval" => interval = duration_value(flag, &value)?,
                "--record" => record = Some(PathBuf::from(value)),
                _ => return Err(Usage(format!("unknown flag {flag:?}"))),
            }
            Ok(())
        })?;
        let http = http.ok_or_else(|| Usage("wait needs --http HOST:PORT/PATH".into()))?;
        let target = http.strip_prefix("http://").unwrap_or(&http);
        let (authority, path) = match target.find('/') {
            Some(at) => (&target[..at], &target[at..]),
            None => (target, "/"),
        };
        if authority.is_empty() || !authority.contains(':') {
            return Err(Usage(format!(
                "--http {http:?}: expected HOST:PORT/PATH, for example 127.0.0.1:3592/_cerbos/health"
            )));
        }
        Ok(WaitOptions {
            authority: authority.to_string(),
            path: path.to_string(),
            timeout,
            interval: interval.max(Duration::from_millis(10)),
            record,
        })
    }
}

/// The cgroup of a process as this process sees it (the same text for every process of one container).
fn cgroup_of(proc_root: &Path, pid: &str) -> Option<String> {
    std::fs::read_to_string(proc_root.join(pid).join("cgroup")).ok()
}

/// Every process of the Pod's shared process namespace, with its cgroup: `(pid, cgroup)`.
fn processes(proc_root: &Path) -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir(proc_root) else {
        return vec![];
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid: u32 = name.parse().ok()?;
            Some((pid, cgroup_of(proc_root, &name)?))
        })
        .collect()
}

/// Writes the PIDs of the processes that share this process's cgroup (its container) to `file`, through a
/// temporary name, so that a reader never sees half a list.
fn record_own(proc_root: &Path, file: &Path) -> Result<(), String> {
    let mine = cgroup_of(proc_root, "self").ok_or("cannot read /proc/self/cgroup")?;
    let pids: Vec<String> = processes(proc_root)
        .into_iter()
        .filter(|(_, cg)| *cg == mine)
        .map(|(pid, _)| pid.to_string())
        .collect();
    let partial = file.with_extension("partial");
    std::fs::write(&partial, pids.join("\n"))
        .and_then(|()| std::fs::rename(&partial, file))
        .map_err(|e| {
            format!(
                "cannot record this container's processes in {}: {e}",
                file.display()
            )
        })
}

/// What `watch` needs.
#[derive(Debug, PartialEq)]
struct WatchOptions {
    /// The shared emptyDir: `*.pids` files of the PDP and watch containers.
    state: PathBuf,
    /// The file the PDP's liveness probe reads (`apps-done`): written once the apps have ended.
    stop: PathBuf,
    /// How long no app process must be seen before that (`OnFailure`: longer than the kubelet's restart backoff).
    grace: Duration,
    interval: Duration,
}

impl WatchOptions {
    fn parse(args: &[String]) -> Result<WatchOptions, Usage> {
        let (mut state, mut stop) = (None, None);
        let mut grace = Duration::ZERO;
        let mut interval = Duration::from_secs(1);
        each_flag(args, |flag, value| {
            match flag {
                "--state" => state = Some(PathBuf::from(value)),
                "--stop" => stop = Some(PathBuf::from(value)),
                "--grace" => grace = duration_value(flag, &value)?,
                "--interval" => interval = duration_value(flag, &value)?,
                _ => return Err(Usage(format!("unknown flag {flag:?}"))),
            }
            Ok(())
        })?;
        Ok(WatchOptions {
            state: state.ok_or_else(|| Usage("watch needs --state DIR".into()))?,
            stop: stop.ok_or_else(|| Usage("watch needs --stop FILE".into()))?,
            grace,
            interval: interval.max(Duration::from_millis(10)),
        })
    }
}

/// The app processes of the Pod: every process but the sandbox's (PID 1), this container's, and those of the
/// containers recorded in `state` (the PDPs' and the other watchers').
fn app_processes(proc_root: &Path, state: &Path) -> Vec<u32> {
    let all = processes(proc_root);
    let recorded: Vec<u32> = std::fs::read_dir(state)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".pids"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .flat_map(|t| {
            t.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    let mut ours: Vec<&str> = all
        .iter()
        .filter(|(pid, _)| *pid == 1 || recorded.contains(pid))
        .map(|(_, cg)| cg.as_str())
        .collect();
    let mine = cgroup_of(proc_root, "self");
    ours.extend(mine.as_deref());
    all.iter()
        .filter(|(_, cg)| !ours.contains(&cg.as_str()))
        .map(|(pid, _)| *pid)
        .collect()
}

/// The watch container of a run-to-completion Pod with a classic sidecar: it starts after the app containers
/// (it is the last container, and the kubelet starts them in order), so once no app process is left (for
/// `grace`), the apps have ended: it writes the stop file, which the PDP's liveness probe reads, and the
/// kubelet stops the PDP. No API access, no Pod write right: only the Pod's shared process namespace.
fn watch(proc_root: &Path, options: &WatchOptions) -> Result<String, String> {
    let own = options
        .state
        .join(format!("watch-{}.pids", std::process::id()));
    record_own(proc_root, &own)?;
    let mut gone_since: Option<Instant> = None;
    loop {
        let apps = app_processes(proc_root, &options.state);
        if !apps.is_empty() {
            gone_since = None;
        } else {
            let since = *gone_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= options.grace {
                std::fs::write(&options.stop, "the app containers have ended")
                    .map_err(|e| format!("cannot write {}: {e}", options.stop.display()))?;
                return Ok(format!(
                    "no app process left: wrote {}, the PDP's liveness probe stops it",
                    options.stop.display()
                ));
            }
        }
        std::thread::sleep(options.interval);
    }
}

/// Walks `--flag VALUE` and `--flag=VALUE`, handing each flag and its value to `set`.
fn each_flag(
    args: &[String],
    mut set: impl FnMut(&str, String) -> Result<(), Usage>,
) -> Result<(), Usage> {
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let (flag, value) = match arg.split_once('=') {
            Some((f, v)) => (f, v.to_string()),
            None => (
                arg.as_str(),
                rest.next()
                    .cloned()
                    .ok_or_else(|| Usage(format!("{arg} needs a value")))?,
            ),
        };
        set(flag, value)?;
    }
    Ok(())
}

fn duration_value(flag: &str, text: &str) -> Result<Duration, Usage> {
    duration::duration_flag(text).map_err(|e| Usage(format!("{flag}: {e}")))
}

/// Asks `GET path` until the answer is 2xx or 3xx (what a Kubernetes HTTP probe counts as success), or the
/// timeout passes.
fn wait(options: &WaitOptions) -> Result<String, String> {
    let started = Instant::now();
    let deadline = started + options.timeout;
    let url = format!("http://{}{}", options.authority, options.path);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let remaining = deadline.saturating_duration_since(Instant::now());
        let last = match probe(
            options,
            remaining.clamp(Duration::from_millis(1), Duration::from_secs(1)),
        ) {
            Ok(status) if (200..400).contains(&status) => {
                return Ok(format!(
                    "the PDP answered GET {url} with {status} after {} ms ({attempts} attempts)",
                    started.elapsed().as_millis()
                ));
            }
            Ok(status) => format!("HTTP {status}"),
            Err(e) => e,
        };
        if Instant::now() + options.interval >= deadline {
            return Err(format!(
                "the PDP did not answer GET {url} within {:?} ({attempts} attempts; last: {last}): the app \
                 containers start without it",
                options.timeout
            ));
        }
        std::thread::sleep(options.interval);
    }
}

/// One `GET`: the status code of the answer.
fn probe(options: &WaitOptions, limit: Duration) -> Result<u16, String> {
    let addr: SocketAddr = options
        .authority
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {}: {e}", options.authority))?
        .next()
        .ok_or_else(|| format!("{} has no address", options.authority))?;
    let mut stream = TcpStream::connect_timeout(&addr, limit).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(limit))
        .map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(Some(limit))
        .map_err(|e| e.to_string())?;
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: pdp-await\r\nConnection: close\r\n\r\n",
        options.path, options.authority
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|e| e.to_string())?;
    let mut head = Vec::with_capacity(64);
    let mut buf = [0u8; 256];
    while !head.contains(&b'\n') && head.len() < 4096 {
        let n = stream.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    status_code(&head).ok_or_else(|| {
        let line = String::from_utf8_lossy(&head);
        format!(
            "not an HTTP answer: {:?}",
            line.lines().next().unwrap_or("")
        )
    })
}

/// The status code of an HTTP/1.x status line.
fn status_code(head: &[u8]) -> Option<u16> {
    let line = head.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?.trim_end();
    let mut parts = line.split(' ');
    let version = parts.next()?;
    if !version.starts_with("HTTP/1.") {
        return None;
    }
    let code = parts.next()?;
    if code.len() != 3 {
        return None;
    }
    code.parse().ok()
}

/// Why the PDP should stop, when the file says so: the webhook writes the annotation once the Pod's app
/// containers have ended. A file that is missing or cannot be read says nothing: the PDP is never stopped on a
/// doubt.
fn apps_done(file: &Path) -> Option<String> {
    let text = std::fs::read_to_string(file).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| {
        format!("the Pod's app containers have ended ({text}): this PDP sidecar stops, so the Pod can complete")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn wait_options_parse() {
        let o = WaitOptions::parse(&args(&[
            "--http",
            "127.0.0.1:3592/_cerbos/health",
            "--timeout=5s",
        ]))
        .unwrap();
        assert_eq!(o.authority, "127.0.0.1:3592");
        assert_eq!(o.path, "/_cerbos/health");
        assert_eq!(o.timeout, Duration::from_secs(5));
        assert_eq!(o.interval, Duration::from_millis(100));
        let o =
            WaitOptions::parse(&args(&["--http=http://[::1]:8014", "--interval", "50ms"])).unwrap();
        assert_eq!((o.authority.as_str(), o.path.as_str()), ("[::1]:8014", "/"));
        assert_eq!(o.interval, Duration::from_millis(50));
        for bad in [
            &["--http"][..],
            &["--timeout", "5s"],
            &["--http", "/_cerbos/health"],
            &["--http", "localhost"],
            &["--http", "127.0.0.1:1/", "--timeout", "soon"],
            &["--http", "127.0.0.1:1/", "--verbose"],
        ] {
            assert!(WaitOptions::parse(&args(bad)).is_err(), "{bad:?}");
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
            assert!(run(&args(bad)).is_err(), "{bad:?}");
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
        let o = WaitOptions::parse(&args(&[
            "--http",
            &format!("{addr}/health"),
            "--interval=20ms",
        ]))
        .unwrap();
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
        let o = WaitOptions::parse(&args(&[
            "--http",
            &format!("{addr}/health"),
            "--timeout=300ms",
            "--interval=50ms",
        ]))
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
        let o = WaitOptions::parse(&args(&[
            "--http",
            &format!("{addr}/health"),
            "--timeout=200ms",
            "--interval=20ms",
        ]))
        .unwrap();
        assert!(wait(&o).unwrap_err().contains("last: HTTP 503"));
    }

    #[test]
    fn exec_arguments() {
        let (stale, program) = exec_args(&args(&[
            "--unlink-stale",
            "/a.sock",
            "--unlink-stale=/b.sock",
            "--",
            "/flagd-build",
            "start",
        ]))
        .unwrap();
        assert_eq!(
            stale,
            vec![PathBuf::from("/a.sock"), PathBuf::from("/b.sock")]
        );
        assert_eq!(program, args(&["/flagd-build", "start"]));
        for (bad, says) in [
            (&["--unlink-stale", "/a"][..], "needs -- PROGRAM"),
            (&["--"][..], "needs a PROGRAM"),
            (&["--unlink-stale", "--"][..], "needs a PROGRAM"),
            (&["--keep", "/a", "--", "x"][..], "unknown flag"),
        ] {
            let Usage(message) = exec_args(&args(bad)).unwrap_err();
            assert!(message.contains(says), "{bad:?}: {message}");
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
        assert!(WatchOptions::parse(&args(&["--state", "/s"])).is_err());
        assert_eq!(
            WatchOptions::parse(&args(&["--state=/s", "--stop", "/s/x", "--grace", "330s"]))
                .unwrap()
                .grace,
            Duration::from_secs(330)
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn chown_takes_numeric_owners_and_only_directories() {
        assert_eq!(owner_ids("10001:10001"), Ok((10001, 10001)));
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
}
