//! What keeps the [`crate::Store`] in step: the cluster's FeatureFlag objects and labelled ConfigMaps (one watch
//! each, cluster-wide), or a directory of flagd JSON files; and the Pod addresses that identify TCP callers.

pub mod dir;
pub mod kube;
pub mod pods;

use std::sync::Arc;

use crate::metrics::Metrics;
use crate::store::Store;

/// Keeps the snapshot gauges (flag sets, generation) at the store's newest snapshot, until the store is dropped.
pub async fn track(store: Arc<Store>, metrics: Arc<Metrics>) {
    let mut rx = store.subscribe();
    drop(store);
    loop {
        {
            let snapshot = rx.borrow_and_update();
            metrics.flag_sets.set(snapshot.len() as i64);
            metrics.generation.set(snapshot.generation as i64);
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}
