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
#[derive(Debug)]
struct WatchOptions {
    /// The shared emptyDir holding the `*.pids` files of the PDP and watch containers.
    state: PathBuf,
    /// The file the PDP's liveness probe reads (`apps-done`), written once the apps have ended.
    stop: PathBuf,
    /// How long no app process must be seen first (`OnFailure`: longer than the kubelet's restart backoff).
    grace: Duration,
    /// The pause between two looks at the Pod's processes (at least 10ms).
    interval: Duration,
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
mod tests {
    use super::*;
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
}
