use super::carried::same_volume;
use k8s_openapi::api::core::v1::{ConfigMapVolumeSource, HostPathVolumeSource, Volume};

#[test]
fn the_apiservers_defaults_do_not_make_a_wired_volume_another() {
    let wanted = Volume {
        name: "cerbos-policies".into(),
        config_map: Some(ConfigMapVolumeSource {
            name: "cerbos-policies".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let defaulted = serde_json::json!({"name": "cerbos-policies", "configMap": {"name": "cerbos-policies", "defaultMode": 420}});
    assert!(same_volume(defaulted, &wanted));
    let other_mode = serde_json::json!({"name": "cerbos-policies", "configMap": {"name": "cerbos-policies", "defaultMode": 511}});
    assert!(!same_volume(other_mode, &wanted));
    let other_map = serde_json::json!({"name": "cerbos-policies", "configMap": {"name": "elsewhere", "defaultMode": 420}});
    assert!(!same_volume(other_map, &wanted));
    let host = Volume {
        name: "s".into(),
        host_path: Some(HostPathVolumeSource {
            path: "/var/run/cerbos".into(),
            type_: None,
        }),
        ..Default::default()
    };
    assert!(same_volume(
        serde_json::json!({"name": "s", "hostPath": {"path": "/var/run/cerbos", "type": ""}}),
        &host
    ));
    assert!(!same_volume(
        serde_json::json!({"name": "s", "hostPath": {"path": "/etc", "type": ""}}),
        &host
    ));
}
