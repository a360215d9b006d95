//! The status annotation `pdp-injector.io/status`: what was wired, by which config and version, so that a Pod
//! explains itself and a reinvocation re-wires only what is missing.

use serde::{Deserialize, Serialize};

use crate::config::Mode;
use crate::core::codes::{Reason, WarningCode};

/// The JSON the injector writes into `pdp-injector.io/status`: enough to explain and to re-wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// Mode used.
    pub mode: Mode,
    /// Profile used.
    pub profile: String,
    /// Reason code of the injection.
    pub reason: Reason,
    /// Hash of the config that did it.
    pub config_hash: String,
    /// Injector version that did it.
    pub version: String,
    /// PDP container added, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sidecar: Option<String>,
    /// Volumes added.
    #[serde(default)]
    pub volumes: Vec<String>,
    /// App containers wired.
    #[serde(default)]
    pub containers: Vec<String>,
    /// Environment variables added to app containers.
    #[serde(default)]
    pub env: Vec<String>,
    /// Codes of the warnings given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<WarningCode>,
    /// `csi` when the node's socket came as the node plugin's CSI inline volume (the Pod started only once its
    /// node's PDP answered); absent for a hostPath socket or none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_volume: Option<String>,
    /// The init container that holds the app until its node's PDP answers (the profile's `awaitNode`), when
    /// one was added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<String>,
}
