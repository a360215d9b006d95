//! The command line: each subcommand's flags and the `run` that wires the library's pieces for it. `main.rs`
//! only calls [`main`]. Every long-running command gets one tokio runtime ([`runtime`]), one logging set-up and
//! one way to stop ([`shutdown_signal`]).

mod certs;
mod check;
mod csi;
mod flag_sync;
mod heal;
mod hooks;
mod inject;
mod logging;
mod management;
mod node;
mod serve;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

use pdp_tls as tls;

#[derive(Parser)]
#[command(
    name = "pdp-injector",
    version,
    about = "Wires Kubernetes Pods to a policy decision point (sidecar or node-local DaemonSet)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the HTTPS admission webhook (/mutate, /healthz, /readyz, /metrics).
    Serve(Box<serve::ServeArgs>),
    /// Inject a multi-document YAML stream offline and print the result.
    Inject(inject::InjectArgs),
    /// Generate a CA and a serving certificate for the webhook Service.
    Certs(certs::CertsArgs),
    /// Report whether the cluster is wired as the config says: install, nodes, namespaces, Pods (read-only).
    ///
    /// With --pre, before install: whether the cluster can run each model, with what stops one and its fix.
    ///
    /// Exit status: 0 nothing needs action, 1 something needs action, 2 the check could not run.
    Check(check::CheckArgs),
    /// Node-local front: serve the node's PDP port and socket, forward to the newest ready PDP instance.
    NodeProxy(Box<node::NodeProxyArgs>),
    /// CSI node plugin: give app Pods the node's PDP socket as a read-only inline volume, once the PDP answers.
    CsiNode(Box<csi::CsiNodeArgs>),
    /// Serve flagd's gRPC sync (flagd.sync.v1) from the cluster's flag objects, each stream scoped to its caller.
    FlagSync(Box<flag_sync::FlagSyncArgs>),
    /// Wait until the webhook's /readyz answers through its Service, trusted by its caBundle (the chart's
    /// post-install hook).
    ///
    /// Exit status: 0 ready, 1 not within the timeout.
    WaitReady(hooks::WaitReadyArgs),
    /// Delete the MutatingWebhookConfiguration (the chart's pre-delete hook, before the webhook's Pods go).
    Unregister(hooks::UnregisterArgs),
    /// Replace, through their controllers and within PodDisruptionBudgets, the Pods not wired as the webhook
    /// would wire them now (opt-in reconciler; bare Pods are reported, never deleted).
    Heal(Box<heal::HealArgs>),
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// The logging flag of the long-running commands (serve, node-proxy).
#[derive(Args)]
pub(crate) struct LogArgs {
    /// Log format.
    #[arg(
        long,
        env = "PDP_INJECTOR_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub(crate) log_format: LogFormat,
}

/// The logging set-up of the long-running commands.
pub(crate) use logging::init as init_logging;

pub(crate) async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the server");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}

/// `--namespace`, the old spelling of `--webhook-namespace` in `serve` and `certs`: hidden, kept for one
/// release (in `check` and `inject`, `--namespace` is the namespace of the workloads, as in kubectl).
#[derive(Args)]
pub(crate) struct OldNamespaceFlag {
    #[arg(long = "namespace", hide = true, conflicts_with = "namespace")]
    old_namespace: Option<String>,
}

impl OldNamespaceFlag {
    /// Applies the old spelling where it was given.
    pub(crate) fn apply(self, webhook: &mut pdp_tls::certs::ServiceName) {
        if let Some(ns) = self.old_namespace {
            webhook.namespace = ns;
        }
    }
}

/// The one runtime of a command that talks to the network.
pub(crate) fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

/// An error and its causes for the terminal, each said once: many errors (the project's, kube's, std's) already
/// put their cause in their own message, which anyhow's `{:#}` would print again.
fn describe(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if text.contains(part.as_str()) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

/// Parses the command line and runs the subcommand; the process's exit status.
pub fn main() -> ExitCode {
    tls::install_default_provider();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Check(args) => {
            return match check::run(args) {
                Ok(code) => ExitCode::from(code),
                Err(e) => {
                    eprintln!("error: {}", describe(&e));
                    ExitCode::from(pdp_core::check::report::EXIT_CANNOT_CHECK)
                }
            };
        }
        Command::WaitReady(args) => {
            return match hooks::run(args) {
                Ok(code) => ExitCode::from(code),
                Err(e) => {
                    eprintln!("error: {}", describe(&e));
                    ExitCode::FAILURE
                }
            };
        }
        Command::Unregister(args) => hooks::unregister(args),
        Command::Serve(args) => serve::run(*args),
        Command::Inject(args) => inject::run(args),
        Command::Certs(args) => certs::run(args),
        Command::NodeProxy(args) => node::run(*args),
        Command::CsiNode(args) => csi::run(*args),
        Command::FlagSync(args) => flag_sync::run(*args),
        Command::Heal(args) => heal::run(*args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", describe(&e));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn an_error_says_each_cause_once() {
        // As thiserror's `#[error("...: {source}")]`: the cause in the message and as `source()`.
        #[derive(Debug)]
        struct Read {
            source: std::io::Error,
        }
        impl std::fmt::Display for Read {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "cannot read config file c.yaml: {}", self.source)
            }
        }
        impl std::error::Error for Read {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.source)
            }
        }
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory");
        let e = anyhow::Error::new(Read { source: io }).context("loading the config");
        assert_eq!(
            describe(&e),
            "loading the config: cannot read config file c.yaml: No such file or directory"
        );
        // A cause the message does not carry is still said.
        let e = anyhow::anyhow!("connection refused").context("cannot reach the apiserver");
        assert_eq!(
            describe(&e),
            "cannot reach the apiserver: connection refused"
        );
    }

    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        Cli::try_parse_from(std::iter::once("pdp-injector").chain(args.iter().copied()))
            .map(|c| c.command)
    }

    #[test]
    fn the_command_line_is_well_formed() {
        // Duplicate ids, flags or conflicting defaults are caught here rather than at a user's first run.
        Cli::command().debug_assert();
    }

    #[test]
    fn one_flag_per_concept_and_the_old_spellings_still_work() {
        for args in [
            &["certs", "--webhook-namespace", "team"][..],
            &["certs", "--namespace", "team"],
        ] {
            let Ok(Command::Certs(mut c)) = parse(args) else {
                panic!("{args:?} parses");
            };
            c.old_namespace.apply(&mut c.webhook);
            assert_eq!(c.webhook.namespace, "team", "{args:?}");
        }
        assert!(parse(&["certs", "--namespace", "a", "--webhook-namespace", "b"]).is_err());
        for args in [
            &["serve", "--secret", "s"][..],
            &["serve", "--secret-name", "s"],
        ] {
            let Ok(Command::Serve(s)) = parse(args) else {
                panic!("{args:?} parses");
            };
            assert_eq!(s.certificates.names.secret, "s", "{args:?}");
        }
        // In check, -n is the namespace checked and --webhook-namespace the webhook's, as in serve.
        let Ok(Command::Check(c)) = parse(&["check", "-n", "shop", "--webhook-namespace", "sys"])
        else {
            panic!("check parses");
        };
        assert_eq!(c.scope.as_deref(), Some("shop"));
        assert_eq!(c.install.webhook.namespace, "sys");
        // --model and --kubelet-dir belong to --pre, which judges no installed config.
        assert!(parse(&["check", "--model", "central"]).is_err());
        assert!(parse(&["check", "--pre", "--config", "c.yaml"]).is_err());
        assert!(
            parse(&[
                "check",
                "--pre",
                "--model",
                "central,daemonset",
                "-n",
                "a,b"
            ])
            .is_ok()
        );
    }
}
