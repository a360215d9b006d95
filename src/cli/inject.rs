//! `pdp-injector inject`: the offline command, a YAML stream in and out, a line per Pod template on stderr.

use std::io::{Read, Write};
use std::path::PathBuf;

use clap::Args;

use pdp_core::config::Config;
use pdp_core::offline;

/// Defaults for the documents of one stream.
#[derive(Args)]
struct DocumentFlags {
    /// Namespace default for documents whose namespace the stream does not label: enabled, sidecar, daemonset,
    /// central or disabled (as the namespace label pdp-injector.io/injection).
    #[arg(long, env = "PDP_INJECTOR_MODE", value_parser = pdp_core::core::decide::namespace_label_value)]
    mode: Option<String>,
    /// Namespace of documents that name none.
    #[arg(
        long = "namespace",
        env = "PDP_INJECTOR_NAMESPACE",
        default_value = "default"
    )]
    default_namespace: Option<String>,
}

#[derive(Args)]
pub(crate) struct InjectArgs {
    /// File to read, or `-` for standard input.
    #[arg(
        short = 'f',
        long = "filename",
        env = "PDP_INJECTOR_INPUT",
        default_value = "-"
    )]
    file: String,
    /// Profile for Pods without a pdp-injector.io/profile annotation (default: the config's default profile).
    #[arg(long, env = "PDP_INJECTOR_PROFILE")]
    profile: Option<String>,
    #[command(flatten)]
    documents: DocumentFlags,
    /// Config file (YAML); the built-in config when absent.
    #[arg(long, env = "PDP_INJECTOR_CONFIG")]
    config: Option<PathBuf>,
    /// Render as in a cluster with the CSIDriver csi.pdp-injector.io, where socketVolume auto gives the socket as a CSI volume in every namespace (without it: hostPath in privileged namespaces, TCP elsewhere).
    #[arg(long, env = "PDP_INJECTOR_CSI_DRIVER")]
    csi_driver: bool,
}

pub(crate) fn run(args: InjectArgs) -> anyhow::Result<()> {
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::builtin(),
    };
    if args.csi_driver {
        config = config.with_csi_driver(true);
    }
    if let Some(profile) = args.profile {
        if !config.profiles.contains_key(&profile) {
            anyhow::bail!(
                "unknown profile {profile:?} for --profile: valid profiles are {}",
                config.profile_names()
            );
        }
        config.default_profile = profile;
    }
    let input = if args.file == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        s
    } else {
        std::fs::read_to_string(&args.file)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", args.file))?
    };
    let (output, reports) = offline::inject_stream(
        &input,
        &config,
        &offline::Options {
            mode: args.documents.mode,
            default_namespace: args.documents.default_namespace,
            // As many as the CPUs this process may run on (its affinity and cgroup quota included).
            workers: std::thread::available_parallelism().map_or(1, usize::from),
        },
    )?;
    // One line per Pod template: buffered, so a stream of thousands of documents is not a write per line.
    let mut log = std::io::BufWriter::new(std::io::stderr().lock());
    let mut injected = 0;
    for r in &reports {
        let Some(reason) = r.reason else { continue };
        // Every Pod template gets a line saying what happened and why, skips included.
        writeln!(log, "{}: {reason}", r.heading())?;
        for w in &r.warnings {
            writeln!(log, "  warning: {w}")?;
        }
        if reason.decision() == "inject" {
            injected += 1;
        }
    }
    let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
    writeln!(
        log,
        "pdp-injector: {}, {} injected",
        plural(reports.len(), "document"),
        plural(injected, "Pod template")
    )?;
    log.flush()?;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(output.as_bytes())?;
    stdout.flush()?;
    Ok(())
}
