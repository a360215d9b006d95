//! The part of a Pod that the core reads, borrowed from the JSON it came in: the one parse path of the webhook,
//! the offline command and the tests.
//!
//! [`PodView`] holds what deciding and rendering read, and nothing else: the annotations and labels, the
//! containers' names, and, as unparsed slices of the body, the lists that rendering extends (each container's
//! `env` and `volumeMounts`, the Pod's `volumes`). Everything else in the object (images, probes, resources,
//! affinity, the init containers' contents, ...) is skipped by the parser without allocating. Since the core
//! receives only this type, what the core reads is fixed by the compiler: a field that is not here cannot be
//! read, and a field that is here is parsed the same way whatever the order of the keys around it.
//!
//! The slices are parsed only when a Pod is wired ([`EnvEntry`], [`MountEntry`], [`VolumeEntry`]), and again
//! only the parts that rendering compares. Rendering writes its changes as JSON Patch operations against the
//! same positions, so the patch never carries a value the parser skipped.

mod apply;
mod lists;

use std::borrow::Cow;
use std::fmt;

use k8s_openapi::api::core::v1::{EnvVar, Pod, Volume, VolumeMount};
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::names::{
    ANNOTATION_DEFAULT_CONTAINER, ANNOTATION_MIRROR, ANNOTATION_SAFE_TO_EVICT_LOCAL_VOLUMES, PREFIX,
};

pub use lists::{NameEntry, each_entry, first_unnamed, parse_list, volume_entries};

/// A JSON string, borrowed from the input when it has no escapes (serde's own `Cow<str>` always copies once it is
/// inside a map or a list).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Str<'a>(pub Cow<'a, str>);

impl Str<'_> {
    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for Str<'_> {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct StrVisitor;
        impl<'de> Visitor<'de> for StrVisitor {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v.to_string())))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(StrVisitor)
    }
}

/// The entries of a map of strings (labels, annotations) that the core reads: ours (`pdp-injector.io/...`), the
/// mirror-Pod marker, the autoscaler's list of local volumes and kubectl's default container. The others are skipped without allocating (a
/// Pod's labels and annotations can be large, and a few keys matter); whether the map exists at all is kept,
/// since a patch adds keys to an existing map but creates a missing one. A key given twice counts with its last
/// value, as in the typed Pod's map.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StrMap<'a>(pub Vec<(Str<'a>, Str<'a>)>);

/// Whether the core reads a label or annotation key.
pub fn is_read_key(key: &str) -> bool {
    key.starts_with(PREFIX)
        || key == ANNOTATION_MIRROR
        || key == ANNOTATION_SAFE_TO_EVICT_LOCAL_VOLUMES
        || key == ANNOTATION_DEFAULT_CONTAINER
}

impl StrMap<'_> {
    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k.as_str() == key)
            .map(|(_, v)| v.as_str())
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for StrMap<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for MapVisitor<'a> {
            type Value = StrMap<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of strings")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
                let mut out = Vec::new();
                while let Some(key) = map.next_key::<Str<'de>>()? {
                    // Every value is still checked to be a string, as for the typed Pod.
                    let value = map.next_value::<Str<'de>>()?;
                    if is_read_key(key.as_str()) {
                        out.push((key, value));
                    }
                }
                Ok(StrMap(out))
            }
        }
        deserializer.deserialize_map(MapVisitor(std::marker::PhantomData))
    }
}

/// What the core reads of a Pod.
#[derive(Debug, Default, Deserialize)]
#[serde(expecting = "a Pod")]
pub struct PodView<'a> {
    /// `metadata`; `None` when absent (a Pod template may have none).
    #[serde(borrow, default)]
    pub metadata: Option<MetaView<'a>>,
    /// `spec`.
    #[serde(borrow, default)]
    pub spec: Option<SpecView<'a>>,
}

/// What the core reads of `metadata`.
#[derive(Debug, Default, Deserialize)]
#[serde(expecting = "object metadata")]
pub struct MetaView<'a> {
    /// `annotations`, whole: rendering adds to them and must know whether the map exists.
    #[serde(borrow, default)]
    pub annotations: Option<StrMap<'a>>,
    /// `labels`.
    #[serde(borrow, default)]
    pub labels: Option<StrMap<'a>>,
}

/// What the core reads of `spec`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(expecting = "a Pod spec")]
pub struct SpecView<'a> {
    /// `containers` (a `null` list counts as empty, as for the typed Pod).
    #[serde(borrow, default)]
    pub containers: Option<Vec<ContainerView<'a>>>,
    /// `initContainers`: their names, and how many there are (a native sidecar goes among them).
    #[serde(borrow, default)]
    pub init_containers: Option<Vec<ContainerView<'a>>>,
    /// `volumes`, unparsed until the Pod is wired.
    #[serde(borrow, default)]
    pub volumes: Option<&'a RawValue>,
    /// `hostNetwork`.
    #[serde(default)]
    pub host_network: Option<bool>,
    /// `restartPolicy`: a classic sidecar in a Pod that runs to completion (`Never`, `OnFailure`) must be
    /// stopped when the app containers end.
    #[serde(borrow, default)]
    pub restart_policy: Option<Str<'a>>,
    /// `shareProcessNamespace`: the watch container of a classic sidecar in such a Pod needs it.
    #[serde(default)]
    pub share_process_namespace: Option<bool>,
    /// `priorityClassName`: the webhook's own class is refused to every other Pod.
    #[serde(borrow, default)]
    pub priority_class_name: Option<Str<'a>>,
    /// Volumes an earlier profile of the same review appended after `volumes` ([`PodView::apply`]).
    #[serde(skip)]
    pub added_volumes: Vec<Volume>,
}

/// What the core reads of a container.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(expecting = "a container")]
pub struct ContainerView<'a> {
    /// `name`.
    #[serde(borrow, default)]
    pub name: Str<'a>,
    /// `command`, unparsed: read only to tell the injector's own gate container from another of its name.
    #[serde(borrow, default)]
    pub command: Option<&'a RawValue>,
    /// `env`, unparsed until the Pod is wired.
    #[serde(borrow, default)]
    pub env: Option<&'a RawValue>,
    /// `volumeMounts`, unparsed until the Pod is wired.
    #[serde(borrow, default)]
    pub volume_mounts: Option<&'a RawValue>,
    /// What an earlier profile of the same review inserted into `env`: each variable with its index in the list
    /// at that point, in order ([`PodView::apply`]).
    #[serde(skip)]
    pub added_env: Vec<(usize, EnvVar)>,
    /// Mounts an earlier profile of the same review appended after `volumeMounts`.
    #[serde(skip)]
    pub added_mounts: Vec<VolumeMount>,
}

/// What rendering compares of an environment variable: its name and where its value comes from.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(expecting = "an environment variable")]
pub struct EnvEntry<'a> {
    /// `name`.
    #[serde(borrow, default)]
    pub name: Str<'a>,
    /// `value`.
    #[serde(borrow, default)]
    pub value: Option<Str<'a>>,
    /// `valueFrom`, of which only a field reference is compared.
    #[serde(borrow, default)]
    pub value_from: Option<ValueFromEntry<'a>>,
}

/// `valueFrom` of an environment variable.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(expecting = "an env valueFrom")]
pub struct ValueFromEntry<'a> {
    /// `fieldRef`.
    #[serde(borrow, default)]
    pub field_ref: Option<FieldRefEntry<'a>>,
}

/// `valueFrom.fieldRef`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(expecting = "a fieldRef")]
pub struct FieldRefEntry<'a> {
    /// `fieldPath`.
    #[serde(borrow, default)]
    pub field_path: Str<'a>,
}

/// What rendering compares of a volume mount.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(expecting = "a volume mount")]
pub struct MountEntry<'a> {
    /// `name`.
    #[serde(borrow, default)]
    pub name: Str<'a>,
    /// `mountPath`.
    #[serde(borrow, default)]
    pub mount_path: Str<'a>,
    /// `readOnly`.
    #[serde(default)]
    pub read_only: Option<bool>,
}

/// A volume: its name, and the whole entry, parsed only when rendering meets a volume of the name it adds.
#[derive(Debug)]
pub struct VolumeEntry<'a> {
    /// `name`.
    pub name: Str<'a>,
    /// The entry.
    pub body: VolumeBody<'a>,
}

/// A volume's entry: as it is in the input, or as an earlier profile of the same review added it.
#[derive(Debug)]
pub enum VolumeBody<'a> {
    /// The input's text.
    Raw(&'a RawValue),
    /// Added by an earlier profile.
    Added(&'a Volume),
}

impl<'a> PodView<'a> {
    /// Parses the view from a Pod's JSON. Fails on JSON that is not an object of the Pod's shape in the fields
    /// read, saying where (`spec.containers[0].name: invalid type ...`); fields that are not read are only
    /// checked to be JSON.
    pub fn parse(json: &'a str) -> Result<PodView<'a>, String> {
        crate::json::from_str(json).map_err(|e| where_wrong(json, e))
    }

    /// The value of annotation `key`.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata.as_ref()?.annotations.as_ref()?.get(key)
    }

    /// The value of label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.metadata.as_ref()?.labels.as_ref()?.get(key)
    }

    /// The app containers (`spec.containers`), empty without a spec.
    pub fn containers(&self) -> &[ContainerView<'a>] {
        self.spec
            .as_ref()
            .and_then(|s| s.containers.as_deref())
            .unwrap_or_default()
    }

    /// The init containers, empty when there are none.
    pub fn init_containers(&self) -> &[ContainerView<'a>] {
        self.spec
            .as_ref()
            .and_then(|s| s.init_containers.as_deref())
            .unwrap_or_default()
    }
}

/// The parser's message with the path of the field it stopped at: found again by a second parse that tracks
/// the path, so the successful parse pays nothing for it.
fn where_wrong(json: &str, error: serde_json::Error) -> String {
    let mut de = serde_json::Deserializer::from_str(json);
    match serde_path_to_error::deserialize::<_, PodView<'_>>(&mut de) {
        Err(e) if !e.path().to_string().is_empty() && e.path().to_string() != "." => {
            format!("{}: {}", e.path(), e.inner())
        }
        _ => error.to_string(),
    }
}

/// The JSON of a typed Pod, for callers that hold one (`check`, tests): the view is then parsed from
/// it, so they take exactly the webhook's path.
pub fn pod_json(pod: &Pod) -> String {
    serde_json::to_string(pod).expect("a typed Pod serializes")
}

#[cfg(test)]
mod tests;
