//! The `pdp-injector` binary: parses the command line and hands over to the library.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use pdp_injector::cluster;
use pdp_injector::cluster::selfcerts;
use pdp_injector::cluster::{NamespaceSource, NoCluster};
use pdp_injector::config::Config;
use pdp_injector::tls::certs;
use pdp_injector::tls::{TlsFiles, TlsMaterial};
use pdp_injector::webhook::server::{self, ServeOptions, TlsSource, parse_duration};
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

fn duration(s: &str) -> Result<Duration, String> {
    parse_duration(s).ok_or_else(|| format!("invalid duration {s:?} (examples: 500ms, 10s, 2m)"))
}

#[derive(Args)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "PDP_INJECTOR_LISTEN", default_value = "0.0.0.0:8443")]
    listen: SocketAddr,
    /// Serving certificate chain (PEM). Without --cert and --key, a self-signed CA and certificate are generated.
    #[arg(long, env = "PDP_INJECTOR_CERT", requires = "key")]
    cert: Option<PathBuf>,
    /// Private key of the serving certificate (PEM).
    #[arg(long, env = "PDP_INJECTOR_KEY", requires = "cert")]
    key: Option<PathBuf>,
    /// CA for client certificates: when set, clients without a valid certificate are refused (mTLS).
    #[arg(long, env = "PDP_INJECTOR_CLIENT_CA")]
    client_ca: Option<PathBuf>,
    /// Config file (YAML), reloaded when it changes; the built-in config when absent.
    #[arg(long, env = "PDP_INJECTOR_CONFIG")]
    config: Option<PathBuf>,
    /// Log format.
    #[arg(
        long,
        env = "PDP_INJECTOR_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    log_format: LogFormat,
    /// Keep the CA and serving certificate in a Secret (create, renew, patch caBundle) instead of files.
    #[arg(long, env = "PDP_INJECTOR_SELF_MANAGED_CERTS", conflicts_with_all = ["cert", "key"])]
    self_managed_certs: bool,
    /// Namespace of the webhook (its Secret and Service).
    #[arg(long, env = "POD_NAMESPACE", default_value = "pdp-system")]
    namespace: String,
    /// Service name the apiserver dials (the certificate's SANs).
    #[arg(long, env = "PDP_INJECTOR_SERVICE", default_value = "pdp-injector")]
    service: String,
    /// Secret for self-managed certificates.
    #[arg(long, env = "PDP_INJECTOR_SECRET", default_value = "pdp-injector-tls")]
    secret_name: String,
    /// MutatingWebhookConfiguration whose caBundle self-managed mode keeps current.
    #[arg(
        long,
        env = "PDP_INJECTOR_WEBHOOK_CONFIG",
        default_value = "pdp-injector"
    )]
    webhook_config: String,
    /// Validity of self-managed serving certificates, in days (renewed when 30 days or a third are left).
    #[arg(long, env = "PDP_INJECTOR_CERT_DAYS", default_value_t = 90)]
    cert_days: i64,
    /// Cluster connection (KUBECONFIG or in-cluster) for namespace labels and the apiserver version.
    #[arg(long, env = "PDP_INJECTOR_CLUSTER", value_enum, default_value = "auto")]
    cluster: ClusterMode,
    /// Where the self-signed CA and certificate are written when no --cert/--key are given.
    #[arg(long, env = "PDP_INJECTOR_SELF_SIGNED_DIR", default_value_os_t = std::env::temp_dir().join("pdp-injector"))]
    self_signed_dir: PathBuf,
    /// Admission requests answered at once; more get a fast 503.
    #[arg(long, env = "PDP_INJECTOR_MAX_IN_FLIGHT", default_value_t = 256)]
    max_in_flight: usize,
    /// Largest accepted request body, in bytes.
    #[arg(long, env = "PDP_INJECTOR_BODY_LIMIT", default_value_t = server::DEFAULT_BODY_LIMIT)]
    body_limit: usize,
    /// What the webhook may use (Kubernetes quantity: 96Mi): open connections, request bodies held at once and
    /// per-connection buffers are all derived from it (SECURITY.md, "Memory budget"). Keep it at about 75% of
    /// the container's memory limit.
    #[arg(long, env = "PDP_INJECTOR_MEMORY_BUDGET", default_value = "96Mi", value_parser = pdp_injector::webhook::limits::parse_size)]
    memory_budget: u64,
    /// Upper bound on one request (the apiserver's ?timeout= lowers it).
    #[arg(long, env = "PDP_INJECTOR_REQUEST_TIMEOUT", default_value = "10s", value_parser = duration)]
    request_timeout: Duration,
    /// How long a keep-alive connection may stay idle between requests (above the apiserver's 90 s).
    #[arg(long, env = "PDP_INJECTOR_IDLE_TIMEOUT", default_value = "150s", value_parser = duration)]
    idle_timeout: Duration,
    /// Bound on TLS handshakes and on the first request of a connection.
    #[arg(long, env = "PDP_INJECTOR_HANDSHAKE_TIMEOUT", default_value = "5s", value_parser = duration)]
    handshake_timeout: Duration,
    /// How often certificate and config files are checked for changes.
    #[arg(long, env = "PDP_INJECTOR_RELOAD_INTERVAL", default_value = "2s", value_parser = duration)]
    reload_interval: Duration,
    /// After SIGTERM, keep answering (while not ready) this long before draining.
    #[arg(long, env = "PDP_INJECTOR_DRAIN_DELAY", default_value = "0s", value_parser = duration)]
    drain_delay: Duration,
    /// How long in-flight requests get to finish when draining.
    #[arg(long, env = "PDP_INJECTOR_SHUTDOWN_GRACE", default_value = "25s", value_parser = duration)]
    shutdown_grace: Duration,
}

#[derive(Args)]
struct CertsArgs {
    /// Service name of the webhook.
    #[arg(long, env = "PDP_INJECTOR_SERVICE", default_value = "pdp-injector")]
    service: String,
    /// Namespace of the webhook.
    #[arg(long, env = "PDP_INJECTOR_NAMESPACE", default_value = "pdp-system")]
    namespace: String,
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

/// A CA and a certificate for localhost, written where the user can find the CA.
fn self_signed(
    dir: &std::path::Path,
    client_ca_pem: Option<Vec<u8>>,
) -> anyhow::Result<TlsMaterial> {
    let mut sans = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    sans.extend(certs::service_sans("pdp-injector", "pdp-system"));
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
    init_logging(args.log_format);
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
                let mut settings = selfcerts::Settings::new(args.namespace.clone());
                settings.service = args.service.clone();
                settings.secret_name = args.secret_name.clone();
                settings.webhook_config = args.webhook_config.clone();
                settings.cert_days = args.cert_days.max(1);
                settings.renew_before_days = (args.cert_days / 3).clamp(0, 30);
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
            None => TlsSource::Fixed(self_signed(&args.self_signed_dir, client_ca_pem)?),
        };
        let mut options = ServeOptions {
            config_path: args.config.clone(),
            max_in_flight: args.max_in_flight,
            body_limit: args.body_limit,
            memory_budget: args.memory_budget,
            handshake_timeout: args.handshake_timeout,
            header_timeout: args.handshake_timeout,
            idle_timeout: args.idle_timeout,
            request_timeout: args.request_timeout,
            reload_interval: args.reload_interval,
            drain_delay: args.drain_delay,
            shutdown_grace: args.shutdown_grace,
            ..ServeOptions::new(args.listen, tls_source)
        };
        options.fit.own_namespace = Some(args.namespace.clone());
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

fn run_certs(args: CertsArgs) -> anyhow::Result<()> {
    let mut sans = certs::service_sans(&args.service, &args.namespace);
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
    /// Namespace default for documents whose namespace the stream does not label: enabled, sidecar, daemonset,
    /// central or disabled (as the namespace label pdp-injector.io/injection).
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
        && !["enabled", "sidecar", "daemonset", "central", "disabled"].contains(&mode.as_str())
    {
        anyhow::bail!(
            "invalid value {mode:?} for --mode: valid values are enabled, sidecar, daemonset, central, disabled"
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

fn main() -> ExitCode {
    tls::install_default_provider();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => run_serve(*args),
        Command::Inject(args) => run_inject(args),
        Command::Certs(args) => run_certs(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
