//! The cluster source: one watch of FeatureFlag objects and one of ConfigMaps labelled
//! `pdp-injector.io/flags: "true"`, each over every namespace, for the whole cluster.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::Value;

use crate::metrics::Metrics;
use crate::set::{FlagSet, Origin, SetError, SetId};
use crate::store::Store;

/// The label that makes a ConfigMap a flag set.
pub const CONFIGMAP_LABEL: &str = "pdp-injector.io/flags";

/// The FeatureFlag kind of the OpenFeature operator.
pub fn feature_flag_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk("core.openfeature.dev", "v1beta1", "FeatureFlag");
    ApiResource::from_gvk_with_plural(&gvk, "featureflags")
}

/// A FeatureFlag's flag set: its `spec.flagSpec`.
pub fn from_feature_flag(object: &DynamicObject) -> Result<FlagSet, SetError> {
    match object.data.get("spec").and_then(|s| s.get("flagSpec")) {
        Some(spec) => FlagSet::from_value(spec.clone()),
        None => Err(SetError::Shape("a FeatureFlag needs spec.flagSpec".into())),
    }
}

/// A ConfigMap's flag set: its `*.flagd.json` keys, merged in key order.
pub fn from_config_map(map: &ConfigMap) -> Result<FlagSet, SetError> {
    let mut merged = FlagSet::default();
    let mut any = false;
    for (key, text) in map.data.iter().flatten() {
        if key.ends_with(super::dir::SUFFIX) {
            let set = FlagSet::from_json(text)
                .map_err(|e| SetError::Shape(format!("key {key:?}: {e}")))?;
            merged.merge(&set);
            any = true;
        }
    }
    if !any {
        return Err(SetError::Shape(format!(
            "no key ending in {:?}",
            super::dir::SUFFIX
        )));
    }
    Ok(merged)
}

fn id_of<K: Resource>(object: &K, origin: Origin) -> SetId {
    SetId {
        origin,
        namespace: object.namespace().unwrap_or_default(),
        name: object.name_any(),
    }
}

/// Watches `api` and keeps the store's sets of `origin` in step; a set that does not read keeps its last good
/// version. Runs until the store is dropped by every other holder.
async fn follow<K>(
    api: Api<K>,
    config: watcher::Config,
    origin: Origin,
    read: fn(&K) -> Result<FlagSet, SetError>,
    store: Arc<Store>,
    metrics: Arc<Metrics>,
) where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let mut events = watcher(api, config).default_backoff().boxed();
    let mut listing: Option<BTreeMap<SetId, FlagSet>> = None;
    let take = |object: &K| -> Option<FlagSet> {
        match read(object) {
            Ok(set) => Some(set),
            Err(e) => {
                metrics.rejected_sets.inc();
                let id = id_of(object, origin);
                tracing::warn!(object = %id, error = %e, "flag set not taken; keeping its last good version");
                None
            }
        }
    };
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => listing = Some(BTreeMap::new()),
            Ok(watcher::Event::InitApply(object)) => {
                let id = id_of(&object, origin);
                let set = take(&object).or_else(|| store.current().get(&id));
                if let (Some(listing), Some(set)) = (listing.as_mut(), set) {
                    listing.insert(id, set);
                }
            }
            Ok(watcher::Event::InitDone) => {
                store.replace_origin(origin, listing.take().unwrap_or_default());
            }
            Ok(watcher::Event::Apply(object)) => {
                if let Some(set) = take(&object) {
                    store.put(id_of(&object, origin), set);
                }
            }
            Ok(watcher::Event::Delete(object)) => store.remove(&id_of(&object, origin)),
            Err(e) => {
                tracing::warn!(source = origin.prefix(), error = %e, "flag watch failed; retrying")
            }
        }
        if Arc::strong_count(&store) == 1 {
            return;
        }
    }
}

/// Follows the FeatureFlag objects of the cluster.
pub async fn feature_flags(client: Client, store: Arc<Store>, metrics: Arc<Metrics>) {
    let api: Api<DynamicObject> = Api::all_with(client, &feature_flag_resource());
    follow(
        api,
        watcher::Config::default(),
        Origin::FeatureFlag,
        from_feature_flag,
        store,
        metrics,
    )
    .await;
}

/// Follows the labelled ConfigMaps of the cluster.
pub async fn config_maps(client: Client, store: Arc<Store>, metrics: Arc<Metrics>) {
    let api: Api<ConfigMap> = Api::all(client);
    let config = watcher::Config::default().labels(&format!("{CONFIGMAP_LABEL}=true"));
    follow(
        api,
        config,
        Origin::ConfigMap,
        from_config_map,
        store,
        metrics,
    )
    .await;
}

/// The FeatureFlag JSON a test or an example writes: `spec.flagSpec` holding `flags`.
pub fn feature_flag_object(namespace: &str, name: &str, flag_spec: Value) -> Value {
    serde_json::json!({
        "apiVersion": "core.openfeature.dev/v1beta1",
        "kind": "FeatureFlag",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"flagSpec": flag_spec},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feature_flags_and_config_maps_read_as_sets() {
        let object: DynamicObject = serde_json::from_value(feature_flag_object(
            "team-a",
            "app",
            serde_json::json!({"flags": {"f": {"state": "ENABLED", "variants": {"on": true}, "defaultVariant": "on"}}}),
        ))
        .unwrap();
        assert_eq!(from_feature_flag(&object).unwrap().flags.len(), 1);
        assert_eq!(
            id_of(&object, Origin::FeatureFlag).to_string(),
            "core.openfeature.dev/team-a/app"
        );

        let mut map = ConfigMap {
            data: Some(BTreeMap::from([
            (
                "a.flagd.json".to_string(),
                r#"{"flags":{"x":{"state":"ENABLED","variants":{"v":1},"defaultVariant":"v"}}}"#
                    .to_string(),
            ),
            ("README".to_string(), "ignored".to_string()),
        ])),
            ..ConfigMap::default()
        };
        assert!(from_config_map(&map).unwrap().flags.contains_key("x"));
        map.data = Some(BTreeMap::from([("README".to_string(), "x".to_string())]));
        assert!(from_config_map(&map).is_err());
    }
}
