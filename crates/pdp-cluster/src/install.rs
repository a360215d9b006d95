//! Where the installed pieces are: one set of flags, environment variables and defaults (`names.rs`) for every
//! command that names them (`serve`, `check`; `certs` takes the Service part).

use pdp_core::names::{DEFAULT_NAME, DEFAULT_SECRET};
use pdp_tls::certs::ServiceName;

/// The webhook's namespace and Service, its certificate's Secret and its MutatingWebhookConfiguration.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct InstallNames {
    /// The Service and the namespace.
    #[command(flatten)]
    pub webhook: ServiceName,
    /// The Secret with the serving certificate (`tls.crt`; self-managed: `ca.crt`, `ca.key`, `tls.crt`, `tls.key`),
    /// also spelt `--secret-name` by `serve`.
    #[arg(
        long = "secret",
        alias = "secret-name",
        env = "PDP_INJECTOR_SECRET",
        default_value = DEFAULT_SECRET
    )]
    pub secret: String,
    /// The MutatingWebhookConfiguration (self-managed certificates keep its caBundle current).
    #[arg(long, env = "PDP_INJECTOR_WEBHOOK_CONFIG", default_value = DEFAULT_NAME)]
    pub webhook_config: String,
}
