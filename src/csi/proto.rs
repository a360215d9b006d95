//! The protobuf messages of the RPCs the plugin serves, written by hand with prost's derive: the CSI spec v1
//! (`csi.v1`, github.com/container-storage-interface/spec, csi.proto) and the kubelet's plugin registration
//! (`pluginregistration`, k8s.io/kubelet/pkg/apis/pluginregistration/v1/api.proto).
//!
//! Only the fields this plugin reads or writes are declared; protobuf skips unknown fields when decoding, so a
//! newer kubelet that sends more is still understood. Field numbers and types are those of the .proto files
//! (the tests below check a few encodings byte for byte against what the spec's numbering gives).

use std::collections::HashMap;

// --- pluginregistration ---

/// `pluginregistration.InfoRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InfoRequest {}

/// `pluginregistration.PluginInfo`: what the kubelet's plugin watcher learns from the registration socket.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PluginInfo {
    /// `CSIPlugin`.
    #[prost(string, tag = "1")]
    pub r#type: String,
    /// The CSI driver name.
    #[prost(string, tag = "2")]
    pub name: String,
    /// The CSI socket, as a path on the node (the kubelet dials it).
    #[prost(string, tag = "3")]
    pub endpoint: String,
    /// CSI versions served.
    #[prost(string, repeated, tag = "4")]
    pub supported_versions: Vec<String>,
}

/// `pluginregistration.RegistrationStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RegistrationStatus {
    #[prost(bool, tag = "1")]
    pub plugin_registered: bool,
    #[prost(string, tag = "2")]
    pub error: String,
}

/// `pluginregistration.RegistrationStatusResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RegistrationStatusResponse {}

// --- csi.v1 Identity ---

/// `csi.v1.GetPluginInfoRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginInfoRequest {}

/// `csi.v1.GetPluginInfoResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginInfoResponse {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub vendor_version: String,
    #[prost(map = "string, string", tag = "3")]
    pub manifest: HashMap<String, String>,
}

/// `csi.v1.GetPluginCapabilitiesRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginCapabilitiesRequest {}

/// `csi.v1.GetPluginCapabilitiesResponse`: a node-only plugin has none (no controller service, no topology),
/// so its `capabilities` (field 1, `repeated PluginCapability`) stay empty and are not declared.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginCapabilitiesResponse {}

/// `csi.v1.ProbeRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProbeRequest {}

/// `google.protobuf.BoolValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BoolValue {
    #[prost(bool, tag = "1")]
    pub value: bool,
}

/// `csi.v1.ProbeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProbeResponse {
    #[prost(message, optional, tag = "1")]
    pub ready: Option<BoolValue>,
}

// --- csi.v1 Node ---

/// `csi.v1.NodeGetInfoRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetInfoRequest {}

/// `csi.v1.NodeGetInfoResponse` (no topology: field 3 is not declared).
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetInfoResponse {
    #[prost(string, tag = "1")]
    pub node_id: String,
    /// 0: no limit (an inline socket volume costs nothing the node counts).
    #[prost(int64, tag = "2")]
    pub max_volumes_per_node: i64,
}

/// `csi.v1.NodeGetCapabilitiesRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetCapabilitiesRequest {}

/// `csi.v1.NodeGetCapabilitiesResponse`: no STAGE_UNSTAGE_VOLUME (publish does everything), no stats, so the
/// `capabilities` (field 1) stay empty and are not declared.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetCapabilitiesResponse {}

/// `csi.v1.VolumeCapability.MountVolume`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct MountVolume {
    #[prost(string, tag = "1")]
    pub fs_type: String,
    #[prost(string, repeated, tag = "2")]
    pub mount_flags: Vec<String>,
    #[prost(string, tag = "3")]
    pub volume_mount_group: String,
}

/// `csi.v1.VolumeCapability.BlockVolume`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BlockVolume {}

/// `csi.v1.VolumeCapability.AccessMode`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AccessMode {
    /// `csi.v1.VolumeCapability.AccessMode.Mode` (0 UNKNOWN, 1 SINGLE_NODE_WRITER, 2 SINGLE_NODE_READER_ONLY, ...).
    #[prost(int32, tag = "1")]
    pub mode: i32,
}

/// `csi.v1.VolumeCapability.access_type`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum AccessType {
    #[prost(message, tag = "1")]
    Block(BlockVolume),
    #[prost(message, tag = "2")]
    Mount(MountVolume),
}

/// `csi.v1.VolumeCapability`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct VolumeCapability {
    #[prost(oneof = "AccessType", tags = "1, 2")]
    pub access_type: Option<AccessType>,
    #[prost(message, optional, tag = "3")]
    pub access_mode: Option<AccessMode>,
}

/// `csi.v1.NodePublishVolumeRequest` (`publish_context` 2, `staging_target_path` 3 and `secrets` 7 are not
/// used by an inline volume without staging, and not declared: a secret is never decoded).
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodePublishVolumeRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(string, tag = "4")]
    pub target_path: String,
    #[prost(message, optional, tag = "5")]
    pub volume_capability: Option<VolumeCapability>,
    #[prost(bool, tag = "6")]
    pub readonly: bool,
    #[prost(map = "string, string", tag = "8")]
    pub volume_context: HashMap<String, String>,
}

/// `csi.v1.NodePublishVolumeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodePublishVolumeResponse {}

/// `csi.v1.NodeUnpublishVolumeRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnpublishVolumeRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(string, tag = "2")]
    pub target_path: String,
}

/// `csi.v1.NodeUnpublishVolumeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnpublishVolumeResponse {}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn the_encodings_follow_the_spec_field_numbers() {
        // PluginInfo{type: "A", name: "B", endpoint: "C", supported_versions: ["1.0.0"]}: tags 1-4, wire type 2.
        let info = PluginInfo {
            r#type: "A".into(),
            name: "B".into(),
            endpoint: "C".into(),
            supported_versions: vec!["1.0.0".into()],
        };
        assert_eq!(
            info.encode_to_vec(),
            b"\x0a\x01A\x12\x01B\x1a\x01C\x22\x051.0.0".to_vec()
        );
        // ProbeResponse{ready: {value: true}}: field 1 a message holding field 1 varint 1.
        let probe = ProbeResponse {
            ready: Some(BoolValue { value: true }),
        };
        assert_eq!(probe.encode_to_vec(), vec![0x0a, 0x02, 0x08, 0x01]);
        // NodeGetInfoResponse: node_id (1, string), max_volumes_per_node (2, varint).
        let info = NodeGetInfoResponse {
            node_id: "n".into(),
            max_volumes_per_node: 3,
        };
        assert_eq!(info.encode_to_vec(), vec![0x0a, 0x01, b'n', 0x10, 0x03]);
    }

    #[test]
    fn a_publish_request_decodes_and_skips_what_is_not_declared() {
        // volume_id "v" (1), publish_context (2, skipped), target_path "/t" (4), volume_capability{mount{},
        // access_mode{mode 1}} (5), readonly (6), secrets (7, skipped), volume_context {"k": "x"} (8).
        let mut bytes = vec![0x0a, 0x01, b'v'];
        bytes.extend([0x12, 0x06, 0x0a, 0x01, b'a', 0x12, 0x01, b'b']);
        bytes.extend([0x22, 0x02, b'/', b't']);
        bytes.extend([0x2a, 0x06, 0x12, 0x00, 0x1a, 0x02, 0x08, 0x01]);
        bytes.extend([0x30, 0x01]);
        bytes.extend([0x3a, 0x06, 0x0a, 0x01, b's', 0x12, 0x01, b'p']);
        bytes.extend([0x42, 0x06, 0x0a, 0x01, b'k', 0x12, 0x01, b'x']);
        let request = NodePublishVolumeRequest::decode(bytes.as_slice()).unwrap();
        assert_eq!(request.volume_id, "v");
        assert_eq!(request.target_path, "/t");
        assert!(request.readonly);
        assert_eq!(request.volume_context["k"], "x");
        let capability = request.volume_capability.unwrap();
        assert_eq!(capability.access_mode.unwrap().mode, 1);
        assert!(matches!(capability.access_type, Some(AccessType::Mount(_))));
    }
}
