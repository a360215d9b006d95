//! The part of a Pod that deciding and rendering read, parsed in the same pass as the AdmissionReview.
//!
//! [`decide`](crate::core::decide) reads the annotations, the labels and the container names;
//! [`render`](crate::core::render::render) also reads the app containers' `env` and `volumeMounts`, the volumes and
//! `hostNetwork`, and only ever *adds* to those. Everything else in the Pod (images, probes, resources, affinity,
//! ...) is skipped by the parser without allocating, which is most of the bytes and most of the cost of a typed
//! parse.
//!
//! Of the labels and annotations only the keys that are read are kept (ours, the mirror-Pod marker, the
//! autoscaler's list of local volumes). Environment variables are most of a large Pod, and rendering only looks
//! for the variables it injects: to leave a user's own definition alone and to place the address after a
//! user-defined host. So each `env` list is kept as a slice of the body and not parsed to decide; to wire, the
//! slices are searched for the profile's variable names ([`EnvLists::render_exactly`]). When none defines one,
//! the Pod is rendered with empty `env` lists, and since rendering then inserts its variables at the front, the
//! patch (`add` at `/env/0`, `/env/1`, ...) is the same as for the full lists. A Pod whose `env` defines one of
//! them (a user's own definition, or a Pod injected before) is wired from the whole Pod instead.
//!
//! A Pod built from a [`LitePod`] renders and diffs exactly like the whole Pod as long as the patch holds
//! only `add` operations: then every value in it is either something rendering created or one of these
//! sections. The webhook checks that and falls back to the whole Pod otherwise (`admission::review`); a
//! property test checks both paths give byte-identical answers.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, Volume, VolumeMount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::names::{ANNOTATION_MIRROR, ANNOTATION_SAFE_TO_EVICT_LOCAL_VOLUMES, PREFIX};

/// A Pod with only what deciding and rendering read.
#[derive(Debug, Default, Deserialize)]
pub struct LitePod<'a> {
    #[serde(default)]
    metadata: LiteMeta,
    #[serde(borrow, default)]
    spec: Option<LiteSpec<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct LiteMeta {
    #[serde(default)]
    annotations: Option<Relevant<AnnotationKeys>>,
    #[serde(default)]
    labels: Option<Relevant<LabelKeys>>,
}

/// Which keys of a string map deciding and rendering read.
trait Keys {
    fn relevant(key: &str) -> bool;
}

/// Annotations: ours, the mirror-Pod marker and the autoscaler's list of local volumes that rendering extends.
#[derive(Debug, Default)]
struct AnnotationKeys;
impl Keys for AnnotationKeys {
    fn relevant(key: &str) -> bool {
        key.starts_with(PREFIX)
            || key == ANNOTATION_MIRROR
            || key == ANNOTATION_SAFE_TO_EVICT_LOCAL_VOLUMES
    }
}

/// Labels: ours.
#[derive(Debug, Default)]
struct LabelKeys;
impl Keys for LabelKeys {
    fn relevant(key: &str) -> bool {
        key.starts_with(PREFIX)
    }
}

/// A string map with only its relevant entries; the others are skipped without allocating. (A Pod's labels and
/// annotations can be large, and only a few keys matter.) Present-but-empty stays distinct from absent, so a
/// patch adds keys to an existing map rather than creating it.
#[derive(Debug, Default)]
struct Relevant<K>(BTreeMap<String, String>, std::marker::PhantomData<K>);

impl<'de, K: Keys> Deserialize<'de> for Relevant<K> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor<K>(std::marker::PhantomData<K>);
        impl<'de, K: Keys> serde::de::Visitor<'de> for MapVisitor<K> {
            type Value = Relevant<K>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map of strings")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut map: M,
            ) -> Result<Self::Value, M::Error> {
                let mut out = BTreeMap::new();
                while let Some(key) = map.next_key::<Str<'de>>()? {
                    if K::relevant(&key.0) {
                        out.insert(key.0.into_owned(), map.next_value::<String>()?);
                    } else {
                        // Still a string, as for the whole Pod.
                        map.next_value::<Str<'de>>()?;
                    }
                }
                Ok(Relevant(out, std::marker::PhantomData))
            }
        }
        deserializer.deserialize_map(MapVisitor(std::marker::PhantomData))
    }
}

/// A string borrowed from the body when it has no escapes.
struct Str<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Str<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct StrVisitor;
        impl<'de> serde::de::Visitor<'de> for StrVisitor {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
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

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LiteSpec<'a> {
    #[serde(borrow, default)]
    containers: Vec<LiteContainer<'a>>,
    #[serde(default)]
    init_containers: Option<Vec<NameOnly>>,
    #[serde(default)]
    volumes: Option<Vec<Volume>>,
    #[serde(default)]
    host_network: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LiteContainer<'a> {
    #[serde(default)]
    name: String,
    /// Read only when the Pod is to be wired (deciding reads no `env`).
    #[serde(borrow, default)]
    env: Option<&'a RawValue>,
    #[serde(default)]
    volume_mounts: Option<Vec<VolumeMount>>,
}

#[derive(Debug, Default, Deserialize)]
struct NameOnly {
    #[serde(default)]
    name: String,
}

/// An environment variable's name, borrowed from the body when it has no escapes; the value is skipped.
#[derive(Debug, Default, Deserialize)]
struct LiteEnv<'a> {
    #[serde(borrow, default)]
    name: Cow<'a, str>,
}

impl<'a> LitePod<'a> {
    /// A typed Pod holding exactly the parsed sections (every other field at its default; an `env` list as
    /// empty): it decides exactly like the whole Pod. [`EnvLists::render_exactly`] tells whether it also
    /// renders like it.
    pub fn into_pod(self) -> (Pod, EnvLists<'a>) {
        let mut envs = Vec::new();
        let spec = match self.spec {
            None => None,
            Some(s) => Some(PodSpec {
                containers: s
                    .containers
                    .into_iter()
                    .map(|c| {
                        let env = c.env.map(|vars| {
                            envs.push(vars);
                            Vec::new()
                        });
                        Container {
                            name: c.name,
                            env,
                            volume_mounts: c.volume_mounts,
                            ..Default::default()
                        }
                    })
                    .collect(),
                init_containers: s.init_containers.map(|v| {
                    v.into_iter()
                        .map(|c| Container {
                            name: c.name,
                            ..Default::default()
                        })
                        .collect()
                }),
                volumes: s.volumes,
                host_network: s.host_network,
                ..Default::default()
            }),
        };
        let pod = Pod {
            metadata: ObjectMeta {
                annotations: self.metadata.annotations.map(|m| m.0),
                labels: self.metadata.labels.map(|m| m.0),
                ..Default::default()
            },
            spec,
            status: None,
        };
        (pod, EnvLists(envs))
    }
}

/// The containers' `env` lists, as they are in the body.
#[derive(Debug)]
pub struct EnvLists<'a>(Vec<&'a RawValue>);

impl EnvLists<'_> {
    /// True when no container defines one of the variables rendering injects (`names`), so that rendering
    /// onto empty `env` lists inserts at the same positions as onto the full ones. False as well when a list
    /// is not a list of named variables (the whole Pod then says what is wrong).
    ///
    /// A JSON string without backslashes is written literally, so a list without any `\` whose text does not
    /// contain `"NAME"` cannot define `NAME`: that is a substring search, much cheaper than parsing hundreds of
    /// variables. A list with escapes anywhere is parsed.
    pub fn render_exactly(&self, names: &[&str]) -> bool {
        let quoted: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
        self.0.iter().all(|raw| {
            let text = raw.get();
            if !text.contains('\\') {
                return text.starts_with('[') && !quoted.iter().any(|q| text.contains(q.as_str()));
            }
            serde_json::from_str::<Vec<LiteEnv<'_>>>(text)
                .is_ok_and(|vars| !vars.iter().any(|v| names.contains(&v.name.as_ref())))
        })
    }
}

/// True when a patch computed from a [`LitePod`] equals the one from the whole Pod: only `add` operations. The
/// section diff emits `replace` or `remove` only for changes rendering never makes, and those would carry
/// values with the skipped fields missing.
pub fn lite_patch_is_exact(patch: &json_patch::Patch) -> bool {
    patch
        .0
        .iter()
        .all(|op| matches!(op, json_patch::PatchOperation::Add(_)))
}
