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
//!   (the chart's templates/flagd-node): removes each PATH that is a socket nobody answers on, then becomes
//!   PROGRAM. flagd (Go) refuses to bind a socket path that exists and never removes one it did not close, so a
//!   flagd container killed uncleanly (OOM, SIGKILL) could not restart in its Pod; this runs before every start
//!   of that container (the helper lives in an emptyDir of the Pod, so it survives the restarts).
//! - `chown UID:GID DIR...`: the init containers of the node-local DaemonSets hand the hostPath directory the
//!   kubelet created (as root, mode 0755) to the PDP's or the front's user, from the project's own image
//!   (root with CAP_CHOWN only, no shell, no third-party image).
//!
//! Linked statically: it runs inside images without a C library.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::ArgMatches;

// The duration syntax of every pdp-injector flag (`120s`, `100ms`), shared as source so that pdp-core's
// dependencies stay out of this binary.
#[path = "../../../crates/pdp-core/src/duration.rs"]
mod duration;
mod watch;

use watch::{WatchOptions, record_own, watch};

/// A command line, parsed.
#[derive(Debug)]
enum Command {
    Install {
        dir: PathBuf,
    },
    Wait(WaitOptions),
    Watch(WatchOptions),
    AppsDone {
        file: PathBuf,
    },
    Exec {
        stale: Vec<PathBuf>,
        program: Vec<String>,
    },
    Chown {
        owner: Owner,
        dirs: Vec<PathBuf>,
    },
}

const ABOUT: &str = "Holds a classic sidecar's app until the PDP answers, and stops the PDP once the apps have ended.";

/// The command line, in clap's builder API: its derive macro is a proc-macro, which the static build
/// (`+crt-static` for every crate, .cargo/config.toml) cannot compile.
fn cli() -> clap::Command {
    use clap::{Arg, ArgAction, value_parser};
    let path = |id: &'static str, name: &'static str| {
        Arg::new(id)
            .value_name(name)
            .required(true)
            .value_parser(value_parser!(PathBuf))
    };
    let flag = |id: &'static str, name: &'static str| Arg::new(id).long(id).value_name(name);
    clap::Command::new("pdp-await")
        .about(ABOUT)
        .version(env!("CARGO_PKG_VERSION"))
        .subcommand_required(true)
        .disable_help_subcommand(true)
        .args_override_self(true)
        .subcommand(
            clap::Command::new("install")
                .about("Copy this binary to DIR/pdp-await.")
                .arg(path("dir", "DIR")),
        )
        .subcommand(
            clap::Command::new("wait")
                .about("Exit 0 once GET answers 2xx or 3xx, 1 at the timeout.")
                .arg(
                    flag("http", "HOST:PORT/PATH")
                        .help("The PDP's health check to ask.")
                        .required(true)
                        .value_parser(http_target),
                )
                .arg(
                    flag("timeout", "DURATION")
                        .help("How long to ask before giving up.")
                        .default_value("120s")
                        .value_parser(duration::duration_flag),
                )
                .arg(
                    flag("interval", "DURATION")
                        .help("The pause between two attempts (at least 10ms).")
                        .default_value("100ms")
                        .value_parser(interval_flag),
                )
                .arg(
                    flag("record", "FILE")
                        .help("Where to write this container's PIDs (for watch) on success.")
                        .value_parser(value_parser!(PathBuf)),
                ),
        )
        .subcommand(
            clap::Command::new("watch")
                .about("Write the stop file once the Pod's apps have been gone for the grace.")
                .arg(
                    flag("state", "DIR")
                        .help("The shared emptyDir of the PDP's and watchers' *.pids files.")
                        .required(true)
                        .value_parser(value_parser!(PathBuf)),
                )
                .arg(
                    flag("stop", "FILE")
                        .help("The file apps-done reads, written once the apps have ended.")
                        .required(true)
                        .value_parser(value_parser!(PathBuf)),
                )
                .arg(
                    flag("grace", "DURATION")
                        .help("How long no app process must be seen first.")
                        .default_value("0s")
                        .value_parser(duration::duration_flag),
                )
                .arg(
                    flag("interval", "DURATION")
                        .help("The pause between two looks at the processes (at least 10ms).")
                        .default_value("1s")
                        .value_parser(interval_flag),
                ),
        )
        .subcommand(
            clap::Command::new("apps-done")
                .about("Exit 1 once FILE is not empty: the Pod's app containers have ended.")
                .arg(path("file", "FILE")),
        )
        .subcommand(
            clap::Command::new("exec")
                .about("Remove each PATH that is a socket nobody answers on, then become PROGRAM.")
                .arg(
                    flag("unlink-stale", "PATH")
                        .help("A socket path to remove when nobody answers on it.")
                        .action(ArgAction::Append)
                        .value_parser(value_parser!(PathBuf)),
                )
                .arg(
                    Arg::new("program")
                        .value_name("PROGRAM")
                        .help("The program and its arguments, after --.")
                        .required(true)
                        .last(true)
                        .num_args(1..),
                ),
        )
        .subcommand(
            clap::Command::new("chown")
                .about("Give each DIR (not what is in it) to UID:GID.")
                .arg(
                    Arg::new("owner")
                        .value_name("UID:GID")
                        .required(true)
                        .value_parser(owner_ids),
                )
                .arg(path("dirs", "DIR").num_args(1..)),
        )
}

/// Parses a command line (its first item is the program's name).
fn parse<I, T>(args: I) -> Result<Command, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let matches = cli().try_get_matches_from(args)?;
    // clap has checked that the subcommand and every required value are there.
    let (name, m) = matches.subcommand().expect("subcommand_required");
    let one = |id: &str| m.get_one::<PathBuf>(id).expect("required").clone();
    let all =
        |id: &str| -> Vec<PathBuf> { m.get_many(id).into_iter().flatten().cloned().collect() };
    let duration = |m: &ArgMatches, id: &str| *m.get_one::<Duration>(id).expect("defaulted");
    Ok(match name {
        "install" => Command::Install { dir: one("dir") },
        "wait" => Command::Wait(WaitOptions {
            http: m.get_one::<Target>("http").expect("required").clone(),
            timeout: duration(m, "timeout"),
            interval: duration(m, "interval"),
            record: m.get_one::<PathBuf>("record").cloned(),
        }),
        "watch" => Command::Watch(WatchOptions {
            state: one("state"),
            stop: one("stop"),
            grace: duration(m, "grace"),
            interval: duration(m, "interval"),
        }),
        "apps-done" => Command::AppsDone { file: one("file") },
        "exec" => Command::Exec {
            stale: all("unlink-stale"),
            program: m
                .get_many("program")
                .into_iter()
                .flatten()
                .cloned()
                .collect(),
        },
        "chown" => Command::Chown {
            owner: *m.get_one::<Owner>("owner").expect("required"),
            dirs: all("dirs"),
        },
        other => unreachable!("subcommand {other} is not in cli()"),
    })
}

fn main() -> ExitCode {
    // A usage error: clap's message and exit status 2.
    run(parse(std::env::args_os()).unwrap_or_else(|e| e.exit()))
}

fn run(command: Command) -> ExitCode {
    match command {
        Command::Install { dir } => report(install(&dir)),
        Command::Wait(options) => {
            let waited = wait(&options);
            // The PDP's own processes, for the watch container of a run-to-completion Pod (never fatal).
            if waited.is_ok()
                && let Some(file) = &options.record
                && let Err(e) = record_own(Path::new("/proc"), file)
            {
                eprintln!("pdp-await: {e}");
            }
            report(waited)
        }
        Command::Watch(options) => report(watch(Path::new("/proc"), &options)),
        Command::AppsDone { file } => match apps_done(&file) {
            Some(message) => {
                println!("pdp-await: {message}");
                ExitCode::from(1)
            }
            None => ExitCode::SUCCESS,
        },
        Command::Exec { stale, program } => {
            for path in &stale {
                match unlink_stale(path) {
                    Ok(Some(note)) => println!("pdp-await: {note}"),
                    Ok(None) => {}
                    Err(e) => eprintln!("pdp-await: {e}"),
                }
            }
            report(exec(&program))
        }
        Command::Chown { owner, dirs } => {
            // Every directory, each said; the first failure is the exit status.
            let outcomes: Vec<ExitCode> = dirs
                .iter()
                .map(|d| report(chown(d, owner.uid, owner.gid)))
                .collect();
            outcomes
                .into_iter()
                .find(|c| *c != ExitCode::SUCCESS)
                .unwrap_or(ExitCode::SUCCESS)
        }
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

/// The owner `chown` gives.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Owner {
    uid: u32,
    gid: u32,
}

/// `UID:GID`, both numeric (the image has no user database).
fn owner_ids(text: &str) -> Result<Owner, String> {
    let parsed = text
        .split_once(':')
        .and_then(|(u, g)| Some((u.parse().ok()?, g.parse().ok()?)));
    parsed
        .map(|(uid, gid)| Owner { uid, gid })
        .ok_or_else(|| "expected UID:GID, both numbers".into())
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
#[derive(Debug)]
struct WaitOptions {
    /// The PDP's health check to ask, as HOST:PORT/PATH.
    http: Target,
    /// How long to ask before giving up.
    timeout: Duration,
    /// The pause between two attempts (at least 10ms).
    interval: Duration,
    /// Where to write the PIDs of this container's processes once the PDP answers, for `watch`.
    record: Option<PathBuf>,
}

/// Where `wait` sends its `GET`.
#[derive(Clone, Debug, PartialEq)]
struct Target {
    /// `HOST:PORT`, as given.
    authority: String,
    /// The request path, with its leading `/`.
    path: String,
}

/// `HOST:PORT/PATH`, with or without `http://`; the path defaults to `/`.
fn http_target(text: &str) -> Result<Target, String> {
    let target = text.strip_prefix("http://").unwrap_or(text);
    let (authority, path) = match target.find('/') {
        Some(at) => (&target[..at], &target[at..]),
        None => (target, "/"),
    };
    if authority.is_empty() || !authority.contains(':') {
        return Err("expected HOST:PORT/PATH, for example 127.0.0.1:3592/_cerbos/health".into());
    }
    Ok(Target {
        authority: authority.to_string(),
        path: path.to_string(),
    })
}

/// A duration of at least 10ms, so that a loop never spins.
fn interval_flag(text: &str) -> Result<Duration, String> {
    duration::duration_flag(text).map(|d| d.max(Duration::from_millis(10)))
}

/// Asks `GET path` until the answer is 2xx or 3xx (what a Kubernetes HTTP probe counts as success), or the
/// timeout passes.
fn wait(options: &WaitOptions) -> Result<String, String> {
    let started = Instant::now();
    let deadline = started + options.timeout;
    let url = format!("http://{}{}", options.http.authority, options.http.path);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let remaining = deadline.saturating_duration_since(Instant::now());
        let last = match probe(
            &options.http,
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
fn probe(target: &Target, limit: Duration) -> Result<u16, String> {
    let addr: SocketAddr = target
        .authority
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {}: {e}", target.authority))?
        .next()
        .ok_or_else(|| format!("{} has no address", target.authority))?;
    let mut stream = TcpStream::connect_timeout(&addr, limit).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(limit))
        .map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(Some(limit))
        .map_err(|e| e.to_string())?;
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: pdp-await\r\nConnection: close\r\n\r\n",
        target.path, target.authority
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
mod tests;
