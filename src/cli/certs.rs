//! `pdp-injector certs`: a CA and a serving certificate for the webhook Service, written as a TLS Secret's files.

use std::path::PathBuf;

use clap::Args;

use pdp_tls::certs;

#[derive(Args)]
pub(crate) struct CertsArgs {
    #[command(flatten)]
    pub(crate) webhook: certs::ServiceName,
    #[command(flatten)]
    pub(crate) old_namespace: super::OldNamespaceFlag,
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

pub(crate) fn run(mut args: CertsArgs) -> anyhow::Result<()> {
    args.old_namespace.apply(&mut args.webhook);
    let mut sans = args.webhook.sans();
    sans.extend(args.extra_sans);
    let bundle = certs::generate(&sans, args.ca_days, args.days)?;
    certs::write_bundle(&bundle, &args.out_dir)?;
    eprintln!(
        "wrote ca.crt, ca.key, tls.crt, tls.key to {} for {}",
        args.out_dir.display(),
        sans.join(", ")
    );
    eprintln!("caBundle for the MutatingWebhookConfiguration:");
    println!("{}", bundle.ca_bundle());
    Ok(())
}
