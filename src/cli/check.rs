//! `pdp-injector check`: reads the cluster (list/get only), judges it with the core, prints the report.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::runtime;
use pdp_cluster::InstallNames;
use pdp_core::config::Config;
use pdp_core::names::{DEFAULT_CONFIG_MAP, DEFAULT_NAME};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OutputFormat {
    /// Sections and one line per finding (colour on a terminal only).
    Text,
    /// The whole report as JSON, for scripts.
    Json,
}

/// A deployment model of the chart (`pdp.model`).
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Model {
    /// The central Deployment and Service.
    Central,
    /// One PDP per node behind the node-local front.
    Daemonset,
    /// A PDP container in each wired Pod.
    Sidecar,
}

impl From<Model> for pdp_core::config::Mode {
    fn from(m: Model) -> Self {
        match m {
            Model::Central => Self::Central,
            Model::Daemonset => Self::Daemonset,
            Model::Sidecar => Self::Sidecar,
        }
    }
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
pub(crate) struct CheckArgs {
    /// Namespace whose namespace and Pods are checked (default: the kubeconfig context's namespace); with --pre, a comma list of the namespaces to opt in (default: those labelled pdp-injector.io/injection).
    #[arg(short = 'n', long = "namespace", conflicts_with = "all_namespaces")]
    pub(crate) scope: Option<String>,
    /// Before install: tell whether the cluster can run each model (central, daemonset, sidecar), and what stops one.
    #[arg(long, conflicts_with_all = ["all_namespaces", "config", "pdp_daemonsets"])]
    pre: bool,
    /// With --pre: the models to install, whose being stopped is an error (comma list; default: all three).
    #[arg(long = "model", value_enum, value_delimiter = ',', requires = "pre")]
    models: Vec<Model>,
    /// With --pre: the kubelet root directory the install will be given (the chart's pdp.nodeLocal.csi.kubeletDir).
    #[arg(long, default_value = pdp_core::check::pre::DEFAULT_KUBELET_DIR, requires = "pre")]
    kubelet_dir: String,
    /// Check the namespaces and Pods of every namespace.
    #[arg(short = 'A', long)]
    all_namespaces: bool,
    /// Judge Pods by this config file instead of the installed ConfigMap, for example before applying a change.
    #[arg(long, env = "PDP_INJECTOR_CONFIG")]
    config: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    output: OutputFormat,
    /// Where the webhook, its Secret and its configuration are.
    #[command(flatten)]
    pub(crate) install: InstallNames,
    /// The webhook Deployment.
    #[arg(long, env = "PDP_INJECTOR_DEPLOYMENT", default_value = DEFAULT_NAME)]
    deployment: String,
    /// The ConfigMap with config.yaml.
    #[arg(long, env = "PDP_INJECTOR_CONFIG_MAP", default_value = DEFAULT_CONFIG_MAP)]
    config_map: String,
    /// The node-local PDP DaemonSet of a profile, when it is not PROFILE-pdp labelled
    /// app.kubernetes.io/component=pdp (repeatable): PROFILE=NAMESPACE/NAME.
    #[arg(long = "pdp-daemonset", value_parser = pdp_daemonset)]
    pdp_daemonsets: Vec<(String, String, String)>,
    /// Bound on connecting to the webhook's live endpoint.
    #[arg(long, default_value = "3s", value_parser = pdp_core::duration::duration_flag)]
    probe_timeout: Duration,
}

/// Runs `check`; `Err` means it could not check (exit status 2).
pub(crate) fn run(args: CheckArgs) -> anyhow::Result<u8> {
    use pdp_check::gather;
    use pdp_core::check::analyse;
    let config = match &args.config {
        Some(path) => Some((path.display().to_string(), Config::load(path)?)),
        None => None,
    };
    let report = runtime()?.block_on(async {
        let client = kube::Client::try_default().await.map_err(|e| {
            anyhow::anyhow!(
                "no cluster to check (kubeconfig as kubectl finds it, or in-cluster): {e}"
            )
        })?;
        let version = client
            .apiserver_version()
            .await
            .map_err(|e| anyhow::anyhow!("cannot reach the apiserver: {e}"))?;
        if args.pre {
            let models = if args.models.is_empty() {
                pdp_core::check::pre::MODELS.to_vec()
            } else {
                args.models.iter().map(|m| (*m).into()).collect()
            };
            let targets = args
                .scope
                .iter()
                .flat_map(|s| s.split(','))
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            let options = gather::PreOptions {
                targets,
                kubelet_dir: args.kubelet_dir.clone(),
                models,
            };
            let view = gather::gather_pre(&client, options, &version).await;
            return anyhow::Ok(pdp_core::check::pre::pre_report(&view));
        }
        let scope = if args.all_namespaces {
            None
        } else {
            Some(
                args.scope
                    .clone()
                    .unwrap_or_else(|| client.default_namespace().to_string()),
            )
        };
        let names = analyse::Names {
            namespace: args.install.webhook.namespace,
            webhook_config: args.install.webhook_config,
            deployment: args.deployment,
            secret: args.install.secret,
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
        let scope = options.scope.clone();
        let view = gather::gather(&client, options).await;
        let mut judge = analyse::Judge::new(&view);
        gather::judge_pods(&client, &scope, &mut judge).await;
        anyhow::Ok(judge.report())
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
