//! `pdp-injector node-proxy`: the node-local front, one process for every listener group.

use clap::Args;

use super::{LogArgs, init_logging, runtime, shutdown_signal};
use pdp_node::groups as node_groups;
use pdp_node::proxy::NodeProxyFlags;

#[derive(Args)]
pub(crate) struct NodeProxyArgs {
    #[command(flatten)]
    log: LogArgs,
    #[command(flatten)]
    flags: NodeProxyFlags,
    // Waits, timeouts and drain are the process's; each group gets an equal share of --memory-budget for its
    // connection bounds; TLS only on the front's own TCP addresses (docs/deployment-models.md).
    /// One more listener pair for another PDP endpoint, as a YAML mapping of port or listen, socket, socketMode, instances and tcpBackend, socketBackend or backend, e.g. {port: 8015, socket: /var/run/flagd/sync.sock, instances: /var/run/flagd-instances, backend: .sync.sock} (repeatable; ';' separates them in the environment).
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
