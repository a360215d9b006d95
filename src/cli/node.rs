//! `pdp-injector node-proxy`: the node-local front, one process for every listener group.

use clap::Args;

use super::{LogArgs, init_logging, runtime, shutdown_signal};
use crate::node::groups as node_groups;
use crate::node::proxy::NodeProxyFlags;

#[derive(Args)]
pub(crate) struct NodeProxyArgs {
    #[command(flatten)]
    log: LogArgs,
    #[command(flatten)]
    flags: NodeProxyFlags,
    /// One more listener pair in this process, for another PDP endpoint (repeatable; ';' separates them in the environment): comma-separated port=PORT ([::]:PORT, with the IPv4 fallback) or listen=ADDR (repeatable, as written), socket=PATH, socket-mode=MODE, instances=DIR, tcp-backend=SUFFIX, socket-backend=SUFFIX or backend=SUFFIX (both). Example, flagd's sync endpoint: port=8015,socket=/var/run/flagd/sync.sock,instances=/var/run/flagd-instances,backend=.sync.sock. Everything else (waits, timeouts, drain) is this process's, and each group gets an equal share of --memory-budget for its connection bounds; TLS only on the front's own TCP addresses.
    #[arg(long = "group", env = "PDP_NODE_PROXY_GROUPS", value_delimiter = ';', value_parser = node_groups::group_flag)]
    groups: Vec<node_groups::Group>,
}

pub(crate) fn run(args: NodeProxyArgs) -> anyhow::Result<()> {
    init_logging(args.log.log_format);
    runtime()?.block_on(async {
        let groups = args.groups.iter().map(|g| g.flags(&args.flags));
        let running =
            node_groups::start_all(std::iter::once(args.flags.clone()).chain(groups).collect())
                .await?;
        shutdown_signal().await;
        node_groups::shutdown_all(running).await;
        anyhow::Ok(())
    })
}
