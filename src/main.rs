//! The `pdp-injector` binary: parses the command line and hands over to the library.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use pdp_injector::cluster;
use pdp_injector::cluster::selfcerts;
use pdp_injector::cluster::{NamespaceSource, NoCluster};
use pdp_injector::config::Config;
use pdp_injector::node::groups as node_groups;
use pdp_injector::node::proxy::NodeProxyFlags;
use pdp_injector::tls::certs;
use pdp_injector::tls::{TlsFiles, TlsMaterial};
use pdp_injector::webhook::server::{self, ServeFlags, ServeOptions, TlsSource};
use pdp_injector::{offline, tls};

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
    Serve(Box<ServeArgs>),
    /// Inject a multi-document YAML stream offline and print the result.
    Inject(InjectArgs),
    /// Generate a CA and a serving certificate for the webhook Service.
    Certs(CertsArgs),
    /// Report whether the cluster is wired as the config says: install, nodes, namespaces, Pods (read-only).
    ///
    /// Exit status: 0 nothing needs action, 1 something needs action, 2 the check could not run.
    Check(CheckArgs),
    /// Node-local front: serve the node's PDP port and socket, forward to the newest ready PDP instance.
    NodeProxy(Box<NodeProxyArgs>),
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ClusterMode {
    /// Connect when a kubeconfig or in-cluster config is found, else run without a cluster.
    Auto,
    /// Never connect: namespaces count as unlabelled.
    Off,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// The logging flag of the long-running commands (serve, node-proxy).
#[derive(Args)]
struct LogArgs {
    /// Log format.
    #[arg(
        long,
        env = "PDP_INJECTOR_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    log_format: LogFormat,
}

#[derive(Args)]
struct ServeArgs {
    /// Serving certificate chain (PEM). Without --cert and --key, a self-signed CA and certificate are generated.
    #[arg(long, env = "PDP_INJECTOR_CERT", requires = "key")]
    cert: Option<PathBuf>,
    /// Private key of the serving certificate (PEM).
    #[arg(long, env = "PDP_INJECTOR_KEY", requires = "cert")]
    key: Option<PathBuf>,
    /// CA for client certificates: when set, clients without a valid certificate are refused (mTLS).
    #[arg(long, env = "PDP_INJECTOR_CLIENT_CA")]
    client_ca: Option<PathBuf>,
    #[command(flatten)]
    log: LogArgs,
    /// Keep the CA and serving certificate in a Secret (create, renew, patch caBundle) instead of files.
    #[arg(long, env = "PDP_INJECTOR_SELF_MANAGED_CERTS", conflicts_with_all = ["cert", "key"])]
    self_managed_certs: bool,
    /// Cluster connection (KUBECONFIG or in-cluster) for namespace labels and the apiserver version.
    #[arg(long, env = "PDP_INJECTOR_CLUSTER", value_enum, default_value = "auto")]
    cluster: ClusterMode,
    /// Where the self-signed CA and certificate are written when no --cert/--key are given.
    #[arg(long, env = "PDP_INJECTOR_SELF_SIGNED_DIR", default_value_os_t = std::env::temp_dir().join("pdp-injector"))]
    self_signed_dir: PathBuf,
    #[command(flatten)]
    server: ServeFlags,
    #[command(flatten)]
    certificates: selfcerts::Settings,
}

#[derive(Args)]
struct NodeProxyArgs {
    #[command(flatten)]
    log: LogArgs,
    #[command(flatten)]
    flags: NodeProxyFlags,
    /// One more listener pair in this process, for another PDP endpoint (repeatable; ';' separates them in the environment): comma-separated port=PORT ([::]:PORT, with the IPv4 fallback) or listen=ADDR (repeatable, as written), socket=PATH, socket-mode=MODE, instances=DIR, tcp-backend=SUFFIX, socket-backend=SUFFIX or backend=SUFFIX (both). Example, flagd's sync endpoint: port=8015,socket=/var/run/flagd/sync.sock,instances=/var/run/flagd-instances,backend=.sync.sock. Everything else (waits, timeouts, drain) is this process's, and each group gets an equal share of --memory-budget for its connection bounds; TLS only on the front's own TCP addresses.
    #[arg(long = "group", env = "PDP_NODE_PROXY_GROUPS", value_delimiter = ';', value_parser = node_groups::group_flag)]
    groups: Vec<node_groups::Group>,
}

#[derive(Args)]
struct CertsArgs {
    #[command(flatten)]
    webhook: certs::ServiceName,
    /// Extra DNS names or IP addresses for the serving certificate (repeatable).
    #[arg(long = "extra-san")]
    extra_sans: Vec<String>,
    /// Directory for ca.crt, ca.key, tls.crt and tls.key.
    #[arg(long, default_value = "certs")]
    out_dir: PathBuf,
    /// Validity of the serving certificate, in days.
    #[arg(long, default_value_t = 365)]
    days: i64,
    /// Validity of the CA, in days.
    #[arg(long, default_value_t = 3650)]
    ca_days: i64,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .init(),
    }
}

async fn shutdown_signal() {
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

/// The cluster client, or `None` (said in the log) when there is no cluster to talk to.
async fn connect(mode: ClusterMode) -> Option<kube::Client> {
    if mode == ClusterMode::Off {
        tracing::info!("--cluster off: namespaces count as unlabelled; Pods opt in by annotation");
        return None;
    }
    match kube::Config::infer().await {
        Ok(config) => match kube::Client::try_from(config) {
            Ok(client) => Some(client),
            Err(e) => {
                tracing::warn!(error = %e, "cluster config found but unusable; running without a cluster");
                None
            }
        },
        Err(_) => {
            tracing::info!(
                "no cluster (no kubeconfig, not in a Pod): namespaces count as unlabelled; Pods opt in by annotation"
            );
            None
        }
    }
}

/// The first self-managed certificate: retried until the API answers (the server cannot start without one).
async fn first_certificate(client: &kube::Client, settings: &selfcerts::Settings) -> TlsMaterial {
    let mut delay = Duration::from_millis(500);
    loop {
        match selfcerts::reconcile(client, settings).await {
            Ok(material) => return material,
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?delay, "self-managed certificates not ready");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// A CA and a certificate for localhost and the webhook's Service, written where the user can find the CA.
fn self_signed(
    dir: &std::path::Path,
    webhook: &certs::ServiceName,
    client_ca_pem: Option<Vec<u8>>,
) -> anyhow::Result<TlsMaterial> {
    let mut sans = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    sans.extend(webhook.sans());
    let bundle = certs::generate(&sans, 30, 30)?;
    bundle.write(dir)?;
    let ca = dir.join("ca.crt");
    tracing::warn!(
        ca = %ca.display(),
        "no --cert/--key: serving a generated self-signed certificate for localhost; trust it with --cacert {}",
        ca.display()
    );
    Ok(TlsMaterial {
        cert_pem: bundle.cert_pem.into_bytes(),
        key_pem: bundle.key_pem.into_bytes(),
        client_ca_pem,
    })
}

fn run_serve(args: ServeArgs) -> anyhow::Result<()> {
    init_logging(args.log.log_format);
    let client_ca_pem = match &args.client_ca {
        Some(p) => Some(
            std::fs::read(p).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", p.display()))?,
        ),
        None => None,
    };
    let files = match (&args.cert, &args.key) {
        (Some(cert), Some(key)) => Some(TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: args.client_ca.clone(),
        }),
        _ => None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let client = connect(args.cluster).await;
        let counters = pdp_injector::cluster::ClusterCounters::default();
        let tls_source = match files {
            Some(files) => TlsSource::Files(files),
            None if args.self_managed_certs => {
                let Some(client) = client.clone() else {
                    anyhow::bail!(
                        "--self-managed-certs needs a cluster connection (in-cluster or KUBECONFIG)"
                    );
                };
                let mut settings = args.certificates.clone();
                settings.client_ca_pem = client_ca_pem;
                let material = first_certificate(&client, &settings).await;
                let (tx, rx) = tokio::sync::watch::channel(material);
                tokio::spawn(selfcerts::keep_reconciling(
                    client,
                    settings,
                    tx,
                    counters.clone(),
                ));
                TlsSource::Watched(rx)
            }
            None => TlsSource::Fixed(self_signed(
                &args.self_signed_dir,
                &args.certificates.webhook,
                client_ca_pem,
            )?),
        };
        let mut options = ServeOptions::with_flags(args.server.clone(), tls_source);
        options.fit.own_namespace = Some(args.certificates.webhook.namespace.clone());
        options.cluster_counters = counters.clone();
        let namespaces: Arc<dyn NamespaceSource> = match &client {
            Some(client) => {
                options.fit.native_sidecars = cluster::versions::native_sidecars(client).await;
                Arc::new(cluster::ClusterNamespaces::spawn(
                    client.clone(),
                    counters.clone(),
                ))
            }
            None => Arc::new(NoCluster),
        };
        let running = server::start(options, namespaces).await?;
        shutdown_signal().await;
        running.shutdown().await?;
        anyhow::Ok(())
    })
}

fn run_node_proxy(args: NodeProxyArgs) -> anyhow::Result<()> {
    init_logging(args.log.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let groups = args.groups.iter().map(|g| g.flags(&args.flags));
        let running =
            node_groups::start_all(std::iter::once(args.flags.clone()).chain(groups).collect())
                .await?;
        shutdown_signal().await;
        node_groups::shutdown_all(running).await;
        anyhow::Ok(())
    })
}

fn run_certs(args: CertsArgs) -> anyhow::Result<()> {
    let mut sans = args.webhook.sans();
    sans.extend(args.extra_sans);
    let bundle = certs::generate(&sans, args.ca_days, args.days)?;
    bundle.write(&args.out_dir)?;
    eprintln!(
        "wrote ca.crt, ca.key, tls.crt, tls.key to {} for {}",
        args.out_dir.display(),
        sans.join(", ")
    );
    eprintln!("caBundle for the MutatingWebhookConfiguration:");
    println!("{}", bundle.ca_bundle());
    Ok(())
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
    /// Profile for Pods without a pdp-injector.io/profile annotation (default: the config's default profile).
    #[arg(long, env = "PDP_INJECTOR_PROFILE")]
    profile: Option<String>,
    #[command(flatten)]
    documents: offline::Options,
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
    let input = if args.file == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        s
    } else {
        std::fs::read_to_string(&args.file)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", args.file))?
    };
    let (output, reports) = offline::inject_stream(&input, &config, &args.documents)?;
    // One line per Pod template: buffered, so a stream of thousands of documents is not a write per line.
    let mut log = std::io::BufWriter::new(std::io::stderr().lock());
    let mut injected = 0;
    for r in &reports {
        let Some(reason) = r.reason else { continue };
        // Every Pod template gets a line saying what happened and why, skips included.
        writeln!(
            log,
            "document {} ({} {:?}): {reason}",
            r.index, r.kind, r.name
        )?;
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

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OutputFormat {
    /// Sections and one line per finding (colour on a terminal only).
    Text,
    /// The whole report as JSON, for scripts.
    Json,
}

fn pdp_daemonset(s: &str) -> Result<(String, String, String), String> {
    let bad = || {
        format!(
            "invalid value {s:?}: expected PROFILE=NAMESPACE/NAME, e.g. cerbos=pdp-node/cerbos-pdp"
        )
    };
    let (profile, rest) = s.split_once('=').ok_or_else(bad)?;
    let (ns, name) = rest.split_once('/').ok_or_else(bad)?;
    if [profile, ns, name].iter().any(|p| p.is_empty()) {
        return Err(bad());
    }
    Ok((profile.into(), ns.into(), name.into()))
}

#[derive(Args)]
struct CheckArgs {
    /// Namespace whose namespace and Pods are checked (default: the kubeconfig context's namespace).
    #[arg(short = 'n', long, conflicts_with = "all_namespaces")]
    namespace: Option<String>,
    /// Check the namespaces and Pods of every namespace.
    #[arg(short = 'A', long)]
    all_namespaces: bool,
    /// Judge Pods by this config file instead of the installed ConfigMap (e.g. before applying a change).
    #[arg(long, env = "PDP_INJECTOR_CONFIG")]
    config: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    output: OutputFormat,
    /// Namespace of the webhook (its Deployment, Secret and ConfigMap).
    #[arg(long, default_value = "pdp-system")]
    webhook_namespace: String,
    /// The MutatingWebhookConfiguration.
    #[arg(long, default_value = "pdp-injector")]
    webhook_config: String,
    /// The webhook Deployment.
    #[arg(long, default_value = "pdp-injector")]
    deployment: String,
    /// The Secret with the serving certificate (tls.crt).
    #[arg(long, default_value = "pdp-injector-tls")]
    secret: String,
    /// The ConfigMap with config.yaml.
    #[arg(long, default_value = "pdp-injector-config")]
    config_map: String,
    /// The node-local PDP DaemonSet of a profile, when it is not PROFILE-pdp labelled
    /// app.kubernetes.io/component=pdp (repeatable): PROFILE=NAMESPACE/NAME.
    #[arg(long = "pdp-daemonset", value_parser = pdp_daemonset)]
    pdp_daemonsets: Vec<(String, String, String)>,
    /// Bound on connecting to the webhook's live endpoint.
    #[arg(long, default_value = "3s", value_parser = pdp_injector::duration::duration_flag)]
    probe_timeout: Duration,
}

/// Runs `check`; `Err` means it could not check (exit status 2).
fn run_check(args: CheckArgs) -> anyhow::Result<u8> {
    use pdp_injector::check::{analyse, gather};
    let config = match &args.config {
        Some(path) => Some((path.display().to_string(), Config::load(path)?)),
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let report = runtime.block_on(async {
        let client = kube::Client::try_default().await.map_err(|e| {
            anyhow::anyhow!(
                "no cluster to check (kubeconfig as kubectl finds it, or in-cluster): {e}"
            )
        })?;
        client
            .apiserver_version()
            .await
            .map_err(|e| anyhow::anyhow!("cannot reach the apiserver: {e}"))?;
        let scope = if args.all_namespaces {
            None
        } else {
            Some(
                args.namespace
                    .clone()
                    .unwrap_or_else(|| client.default_namespace().to_string()),
            )
        };
        let names = analyse::Names {
            namespace: args.webhook_namespace,
            webhook_config: args.webhook_config,
            deployment: args.deployment,
            secret: args.secret,
            config_map: args.config_map,
            pdp_daemonsets: args
                .pdp_daemonsets
                .into_iter()
                .map(|(p, ns, name)| (p, (ns, name)))
                .collect(),
        };
        let options = gather::Options {
            names,
            scope,
            config,
            probe_timeout: args.probe_timeout,
        };
        let view = gather::gather(&client, options).await;
        anyhow::Ok(analyse::analyse(&view))
    })?;
    let text = match args.output {
        OutputFormat::Json => report.to_json() + "\n",
        OutputFormat::Text => {
            let colour = std::io::IsTerminal::is_terminal(&std::io::stdout())
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
            report.to_text(colour)
        }
    };
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()?;
    Ok(report.exit_code())
}

fn main() -> ExitCode {
    tls::install_default_provider();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Check(args) => {
            return match run_check(args) {
                Ok(code) => ExitCode::from(code),
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::from(pdp_injector::check::report::EXIT_CANNOT_CHECK)
                }
            };
        }
        Command::Serve(args) => run_serve(*args),
        Command::Inject(args) => run_inject(args),
        Command::Certs(args) => run_certs(args),
        Command::NodeProxy(args) => run_node_proxy(*args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
