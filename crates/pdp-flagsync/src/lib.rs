//! The flag sync source: flagd's `flagd.sync.v1.FlagSyncService`, served from flag sets kept in a [`Store`].
//!
//! A flag set is one FeatureFlag object (`core.openfeature.dev/v1beta1`), one ConfigMap of flagd JSON, or one
//! file ([`set`]). Sources ([`source`]) keep the store in step with the cluster or a directory; the service
//! ([`service`]) gives each stream the sets its selector names, only those its caller's namespace may read
//! ([`select`]), and a new configuration whenever one of them changes. One central source watches the cluster;
//! each node's relay ([`relay`]) re-serves its state on the node.

pub mod codec;
pub mod metrics;
pub mod relay;
pub mod select;
pub mod server;
pub mod service;
pub mod set;
pub mod source;
pub mod store;

/// The generated `flagd.sync.v1` messages, client and server (tools/protogen; proto/README.md says from where).
#[allow(clippy::all, deprecated, missing_docs)]
pub mod proto {
    include!("gen/flagd.sync.v1.rs");
}

/// The generated `pdp.relay.v1` messages: the central source to each node's relay.
#[allow(clippy::all, missing_docs)]
pub mod relay_proto {
    include!("gen/pdp.relay.v1.rs");
}

pub use select::{Caller, Selection, SelectorError};
pub use service::SyncService;
pub use set::{FlagSet, Origin, SetError, SetId};
pub use store::{Snapshot, Store};
