//! `pdp-injector csi-node`: the CSI node plugin.

use clap::Args;

use super::{LogArgs, init_logging, runtime, shutdown_signal};
use pdp_csi::CsiNodeFlags;

#[derive(Args)]
pub(crate) struct CsiNodeArgs {
    #[command(flatten)]
    log: LogArgs,
    #[command(flatten)]
    flags: CsiNodeFlags,
}

pub(crate) fn run(args: CsiNodeArgs) -> anyhow::Result<()> {
    init_logging(args.log.log_format);
    runtime()?.block_on(pdp_csi::run(args.flags, shutdown_signal()))
}
