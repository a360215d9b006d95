//! The `pdp-injector` binary: parses the command line and hands over to the library.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use pdp_injector::config::Config;
use pdp_injector::offline;

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
    /// Inject a multi-document YAML stream offline and print the result.
    Inject(InjectArgs),
}

#[derive(Args)]
struct InjectArgs {
    /// File to read, or `-` for standard input.
    #[arg(
        short = 'f',
        long = "filename",
        env = "PDP_INJECTOR_INPUT",
        default_value = "-"
    )]
    file: String,
    /// Namespace default for documents whose namespace the stream does not label: enabled, sidecar, daemonset or
    /// disabled (as the namespace label pdp-injector.io/injection).
    #[arg(long, env = "PDP_INJECTOR_MODE")]
    mode: Option<String>,
    /// Profile for Pods without a pdp-injector.io/profile annotation (default: the config's default profile).
    #[arg(long, env = "PDP_INJECTOR_PROFILE")]
    profile: Option<String>,
    /// Namespace of documents that name none.
    #[arg(long, env = "PDP_INJECTOR_NAMESPACE", default_value = "default")]
    namespace: String,
    /// Config file (YAML); the built-in config when absent.
    #[arg(long, env = "PDP_INJECTOR_CONFIG")]
    config: Option<PathBuf>,
}

fn run_inject(args: InjectArgs) -> anyhow::Result<()> {
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::builtin(),
    };
    if let Some(profile) = args.profile {
        if !config.profiles.contains_key(&profile) {
            anyhow::bail!(
                "unknown profile {profile:?} for --profile: valid profiles are {}",
                config.profile_names()
            );
        }
        config.default_profile = profile;
    }
    if let Some(mode) = &args.mode
        && !["enabled", "sidecar", "daemonset", "disabled"].contains(&mode.as_str())
    {
        anyhow::bail!(
            "invalid value {mode:?} for --mode: valid values are enabled, sidecar, daemonset, disabled"
        );
    }
    let input = if args.file == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        s
    } else {
        std::fs::read_to_string(&args.file)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", args.file))?
    };
    let options = offline::Options {
        mode: args.mode,
        default_namespace: Some(args.namespace),
    };
    let (output, reports) = offline::inject_stream(&input, &config, &options)?;
    let mut injected = 0;
    for r in &reports {
        for w in &r.warnings {
            eprintln!(
                "warning: document {} ({} {:?}): {w}",
                r.index, r.kind, r.name
            );
        }
        if matches!(
            r.reason.map(|r| r.code()),
            Some("injected_sidecar" | "injected_daemonset" | "rewired")
        ) {
            injected += 1;
        }
    }
    eprintln!(
        "pdp-injector: {} documents, {injected} injected",
        reports.len()
    );
    print!("{output}");
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inject(args) => run_inject(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
