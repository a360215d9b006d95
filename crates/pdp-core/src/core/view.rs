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

use std::borrow::Cow;
use std::fmt;

use k8s_openapi::api::core::v1::{EnvVar, Pod, Volume, VolumeMount};
use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::core::patch::{JsonPatch, OpValue};
use crate::names::{
    ANNOTATION_DEFAULT_CONTAINER, ANNOTATION_MIRROR, ANNOTATION_SAFE_TO_EVICT_LOCAL_VOLUMES, PREFIX,
};

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

/// Parses one of the lists a view keeps unparsed (`None` stays `None`). `what` names the list in an error; it
/// is written only then (rendering parses lists of every container it wires).
pub fn parse_list<'a, T: Deserialize<'a>>(
    raw: Option<&'a RawValue>,
    what: impl FnOnce() -> String,
) -> Result<Option<Vec<T>>, String> {
    raw.map(|r| crate::json::from_str::<Option<Vec<T>>>(r.get()))
        .transpose()
        .map(Option::flatten)
        .map_err(|e| format!("{} is not a valid list: {e}", what()))
}

/// An entry of a list of which a check compares only the name (a variable, a mount, a volume).
#[derive(Debug, Default, Deserialize)]
#[serde(expecting = "an entry with a name")]
pub struct NameEntry<'a> {
    /// `name`.
    #[serde(borrow, default)]
    pub name: Str<'a>,
}

/// The first of `wanted` that no entry of a list names (`None` when each is named). The entries are parsed in
/// order, each as far as its name, and the parse stops once every wanted name has been seen: rendering puts
/// its variables first, so a wired Pod's `env` is read only as far as them, however long it is. Exact: only a
/// top-level `name` of an entry counts (a nested `configMapKeyRef.name` does not), and the rest of the list was
/// already checked to be JSON when the view was parsed. A list that is not one counts as empty, as does `None`.
pub fn first_unnamed<'w, W: AsRef<str>>(
    raw: Option<&RawValue>,
    wanted: &'w [W],
) -> Option<&'w str> {
    struct Names<'s, W> {
        wanted: &'s [W],
        // `wanted`'s indices in the order of their names: each entry is looked up in log time, since both the
        // list and the names (a status annotation's claims) are the Pod author's and can be long.
        sorted: &'s [usize],
        found: &'s mut [bool],
    }
    impl<'de, W: AsRef<str>> Visitor<'de> for Names<'_, W> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list of entries with names")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            let mut left = self.wanted.len();
            while left > 0 {
                let Some(entry) = seq.next_element::<NameEntry<'de>>()? else {
                    break;
                };
                let name = entry.name.as_str();
                let start = self
                    .sorted
                    .partition_point(|&i| self.wanted[i].as_ref() < name);
                for &i in self.sorted[start..]
                    .iter()
                    .take_while(|&&i| self.wanted[i].as_ref() == name)
                {
                    if !self.found[i] {
                        self.found[i] = true;
                        left -= 1;
                    }
                }
            }
            Ok(())
        }
    }
    let mut found = vec![false; wanted.len()];
    if let Some(raw) = raw
        && !wanted.is_empty()
    {
        let mut sorted: Vec<usize> = (0..wanted.len()).collect();
        sorted.sort_unstable_by(|&a, &b| wanted[a].as_ref().cmp(wanted[b].as_ref()));
        // Stopping early leaves the list unfinished, which both readers report as an error: `found` holds the
        // answer either way. The fast reader's answer stands when it found every name or read the whole list;
        // otherwise it may have declined an entry serde_json reads (crate::json), so serde_json reads again.
        let fast = crate::json::visit_seq(
            raw.get(),
            Names {
                wanted,
                sorted: &sorted,
                found: &mut found,
            },
        );
        if fast.is_err() && found.contains(&false) {
            found.fill(false);
            let mut de = serde_json::Deserializer::from_str(raw.get());
            let _ = de.deserialize_seq(Names {
                wanted,
                sorted: &sorted,
                found: &mut found,
            });
        }
    }
    wanted
        .iter()
        .zip(&found)
        .find(|(_, f)| !**f)
        .map(|(w, _)| w.as_ref())
}

/// Calls `f` with each entry of a list, in order, until it returns `true`: one read of the list, which keeps
/// nothing. A list that is not one counts as empty, as does `None`.
pub fn each_entry<'a>(raw: Option<&'a RawValue>, mut f: impl FnMut(&'a RawValue) -> bool) {
    struct Each<'f, F>(&'f mut F);
    impl<'de, F: FnMut(&'de RawValue) -> bool> Visitor<'de> for Each<'_, F> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            while let Some(entry) = seq.next_element::<&'de RawValue>()? {
                if (self.0)(entry) {
                    break;
                }
            }
            Ok(())
        }
    }
    if let Some(raw) = raw {
        let mut de = serde_json::Deserializer::from_str(raw.get());
        // Stopping early leaves the list unfinished, which the parser reports: what `f` saw stands either way.
        let _ = de.deserialize_seq(Each(&mut f));
    }
}

/// The volumes of a view, each with its name.
pub fn volume_entries<'a>(
    raw: Option<&'a RawValue>,
) -> Result<Option<Vec<VolumeEntry<'a>>>, String> {
    let Some(list) = parse_list::<&'a RawValue>(raw, || "spec.volumes".into())? else {
        return Ok(None);
    };
    list.into_iter()
        .map(|raw| {
            crate::json::from_str::<NameEntry<'a>>(raw.get())
                .map(|n| VolumeEntry {
                    name: n.name,
                    body: VolumeBody::Raw(raw),
                })
                .map_err(|e| format!("spec.volumes has an invalid volume: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// A list's entries, counted without keeping them (a bound check of an index that a patch writes at).
fn count_entries(raw: Option<&RawValue>) -> Result<usize, String> {
    struct Count;
    impl<'de> Visitor<'de> for Count {
        type Value = usize;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list")
        }
        fn visit_unit<E>(self) -> Result<usize, E> {
            Ok(0)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
            let mut n = 0;
            while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                n += 1;
            }
            Ok(n)
        }
    }
    let Some(raw) = raw else { return Ok(0) };
    let mut de = serde_json::Deserializer::from_str(raw.get());
    de.deserialize_any(Count).map_err(|e| e.to_string())
}

impl SpecView<'_> {
    /// The volumes with those an earlier profile of the same review added, each with its name; `None` when
    /// there is no list.
    pub fn volume_entries(&self) -> Result<Option<Vec<VolumeEntry<'_>>>, String> {
        let mut list = volume_entries(self.volumes)?;
        if !self.added_volumes.is_empty() {
            list.get_or_insert_with(Vec::new)
                .extend(self.added_volumes.iter().map(|v| VolumeEntry {
                    name: Str(Cow::Borrowed(&v.name)),
                    body: VolumeBody::Added(v),
                }));
        }
        Ok(list)
    }
}

impl<'a> ContainerView<'a> {
    /// Whether the container has an `env` list, its own or one an earlier profile added.
    pub fn has_env(&self) -> bool {
        self.env.is_some() || !self.added_env.is_empty()
    }

    /// The whole `env`, parsed, with the variables an earlier profile inserted at their places.
    pub fn env_entries(
        &self,
        what: impl FnOnce() -> String,
    ) -> Result<Option<Vec<EnvEntry<'_>>>, String> {
        let mut list = parse_list::<EnvEntry<'_>>(self.env, what)?;
        if !self.added_env.is_empty() {
            let list = list.get_or_insert_with(Vec::new);
            for (at, var) in &self.added_env {
                list.insert((*at).min(list.len()), EnvEntry::of(var));
            }
        }
        Ok(list)
    }

    /// The `volumeMounts`, parsed, with those an earlier profile appended.
    pub fn mount_entries(
        &self,
        what: impl FnOnce() -> String,
    ) -> Result<Option<Vec<MountEntry<'_>>>, String> {
        let mut list = parse_list::<MountEntry<'_>>(self.volume_mounts, what)?;
        if !self.added_mounts.is_empty() {
            list.get_or_insert_with(Vec::new)
                .extend(self.added_mounts.iter().map(|m| MountEntry {
                    name: Str(Cow::Borrowed(&m.name)),
                    mount_path: Str(Cow::Borrowed(&m.mount_path)),
                    read_only: m.read_only,
                }));
        }
        Ok(list)
    }

    /// A container the view knows by name only: one an earlier profile added (render reads no more of it).
    fn named(name: String) -> ContainerView<'a> {
        ContainerView {
            name: Str(Cow::Owned(name)),
            ..Default::default()
        }
    }
}

impl<'a> EnvEntry<'a> {
    /// The entry of a variable rendering made.
    fn of(var: &'a EnvVar) -> EnvEntry<'a> {
        EnvEntry {
            name: Str(Cow::Borrowed(&var.name)),
            value: var.value.as_deref().map(|v| Str(Cow::Borrowed(v))),
            value_from: var.value_from.as_ref().map(|v| ValueFromEntry {
                field_ref: v.field_ref.as_ref().map(|f| FieldRefEntry {
                    field_path: Str(Cow::Borrowed(&f.field_path)),
                }),
            }),
        }
    }
}

/// The annotations rendering reads besides the status, which the caller lends it ([`PodView::overlay`]).
const RENDER_READS: [&str; 2] = [
    ANNOTATION_SAFE_TO_EVICT_LOCAL_VOLUMES,
    ANNOTATION_DEFAULT_CONTAINER,
];

fn reborrow<'s>(s: &'s Str<'_>) -> Str<'s> {
    Str(Cow::Borrowed(s.as_str()))
}

fn reborrow_container<'s>(c: &'s ContainerView<'_>) -> ContainerView<'s> {
    ContainerView {
        name: reborrow(&c.name),
        command: c.command,
        env: c.env,
        volume_mounts: c.volume_mounts,
        added_env: c.added_env.clone(),
        added_mounts: c.added_mounts.clone(),
    }
}

impl<'a> PodView<'a> {
    /// A view of the same Pod to render further profiles over, each after [`apply`](Self::apply) of the patch
    /// so far: the spec's names and lists borrowed from this view (nothing of the Pod is copied), the
    /// annotations cut to those rendering reads besides the status, and no labels.
    pub fn overlay(&self) -> PodView<'_> {
        let borrow = reborrow;
        let container = reborrow_container;
        PodView {
            metadata: self.metadata.as_ref().map(|m| MetaView {
                annotations: m.annotations.as_ref().map(|a| {
                    StrMap(
                        a.0.iter()
                            .filter(|(k, _)| RENDER_READS.contains(&k.as_str()))
                            .map(|(k, v)| (borrow(k), borrow(v)))
                            .collect(),
                    )
                }),
                labels: None,
            }),
            spec: self.spec.as_ref().map(|s| SpecView {
                containers: s
                    .containers
                    .as_ref()
                    .map(|c| c.iter().map(container).collect()),
                init_containers: s
                    .init_containers
                    .as_ref()
                    .map(|c| c.iter().map(container).collect()),
                volumes: s.volumes,
                host_network: s.host_network,
                restart_policy: s.restart_policy.as_ref().map(borrow),
                share_process_namespace: s.share_process_namespace,
                priority_class_name: s.priority_class_name.as_ref().map(borrow),
                added_volumes: s.added_volumes.clone(),
            }),
        }
    }

    /// Records what `patch` (rendered against this view) adds, as applying it to the Pod would: annotations,
    /// containers, init containers, variables, mounts, volumes, `shareProcessNamespace`. The Pod's own lists
    /// stay unparsed. Fails on an operation rendering does not write.
    pub fn apply(&mut self, patch: &JsonPatch) -> Result<(), String> {
        for op in &patch.0 {
            let tokens: Vec<String> = op.path.tokens().map(|t| t.decoded().into_owned()).collect();
            let t: Vec<&str> = tokens.iter().map(|t| t.as_ref()).collect();
            self.apply_one(&t, &op.value)
                .map_err(|e| format!("cannot apply the patch at {}: {e}", op.path))?;
        }
        Ok(())
    }

    fn apply_one(&mut self, path: &[&str], value: &OpValue) -> Result<(), String> {
        let index = |t: &str, len: usize| match t.parse::<usize>() {
            Ok(i) if i <= len => Ok(i),
            _ if t == "-" => Ok(len),
            _ => Err(format!("index {t:?} of a list of {len}")),
        };
        // An index into a list of the Pod's entries and `added` more: counted only when past the added ones
        // (rendering prepends), and at the end when `append`.
        let within = |t: &str, raw: Option<&RawValue>, added: usize, append: bool| match t
            .parse::<usize>()
        {
            Ok(i) if i <= added && !append => Ok(i),
            _ => {
                let len = count_entries(raw)? + added;
                let i = index(t, len)?;
                if append && i != len {
                    return Err(format!("index {t:?} is not the end of a list of {len}"));
                }
                Ok(i)
            }
        };
        match path {
            ["metadata"] => {
                let meta: BTreeMapStrings = value.read()?;
                self.metadata = Some(MetaView::default());
                if let Some(a) = meta.annotations {
                    self.set_annotations(a);
                }
            }
            ["metadata", "annotations"] => self.set_annotations(value.read()?),
            ["metadata", "annotations", key] => {
                let v: String = value.read()?;
                let map = self
                    .metadata
                    .as_mut()
                    .and_then(|m| m.annotations.as_mut())
                    .ok_or("no annotations")?;
                map.0
                    .push((Str(Cow::Owned(key.to_string())), Str(Cow::Owned(v))));
            }
            ["spec", "shareProcessNamespace"] => {
                self.spec_mut()?.share_process_namespace = Some(value.read()?);
            }
            ["spec", list @ ("containers" | "initContainers")] => {
                let added: Vec<NameOnly> = value.read()?;
                let spec = self.spec_mut()?;
                let list = if *list == "containers" {
                    &mut spec.containers
                } else {
                    &mut spec.init_containers
                };
                if list.is_some() {
                    return Err("the list exists".into());
                }
                *list = Some(
                    added
                        .into_iter()
                        .map(|c| ContainerView::named(c.name))
                        .collect(),
                );
            }
            ["spec", list @ ("containers" | "initContainers"), at] => {
                let added: NameOnly = value.read()?;
                let spec = self.spec_mut()?;
                let list = if *list == "containers" {
                    &mut spec.containers
                } else {
                    &mut spec.init_containers
                };
                let list = list.as_mut().ok_or("no such list")?;
                let at = index(at, list.len())?;
                list.insert(at, ContainerView::named(added.name));
            }
            [
                "spec",
                "containers",
                i,
                field @ ("env" | "volumeMounts"),
                rest @ ..,
            ] => {
                let c = self
                    .spec_mut()?
                    .containers
                    .as_mut()
                    .and_then(|c| c.get_mut(i.parse::<usize>().ok()?))
                    .ok_or("no such container")?;
                let (raw, added) = if *field == "env" {
                    (c.env, c.added_env.len())
                } else {
                    (c.volume_mounts, c.added_mounts.len())
                };
                let raw = raw.filter(|r| r.get().trim() != "null");
                if rest.is_empty() && (raw.is_some() || added > 0) {
                    return Err("the list exists".into());
                }
                match (*field, rest) {
                    ("env", []) => {
                        let vars: Vec<EnvVar> = value.read()?;
                        c.added_env.extend(vars.into_iter().enumerate());
                    }
                    ("env", [at]) => {
                        let at = within(at, raw, added, false)?;
                        c.added_env.push((at, value.read()?));
                    }
                    ("volumeMounts", []) => {
                        c.added_mounts.extend(value.read::<Vec<VolumeMount>>()?)
                    }
                    ("volumeMounts", [at]) => {
                        within(at, raw, added, true)?;
                        c.added_mounts.push(value.read()?);
                    }
                    _ => return Err("not a place rendering writes".into()),
                }
            }
            ["spec", "volumes", rest @ ..] => {
                let spec = self.spec_mut()?;
                let raw = spec.volumes.filter(|r| r.get().trim() != "null");
                let added = spec.added_volumes.len();
                match rest {
                    [] if raw.is_none() && added == 0 => spec.added_volumes = value.read()?,
                    [at] if raw.is_some() || added > 0 => {
                        within(at, raw, added, true)?;
                        spec.added_volumes.push(value.read()?);
                    }
                    _ => return Err("not a place rendering writes".into()),
                }
            }
            _ => return Err("not a place rendering writes".into()),
        }
        Ok(())
    }

    fn spec_mut(&mut self) -> Result<&mut SpecView<'a>, String> {
        self.spec.as_mut().ok_or_else(|| "no spec".to_string())
    }

    fn set_annotations(&mut self, map: std::collections::BTreeMap<String, String>) {
        let entries = map
            .into_iter()
            .map(|(k, v)| (Str(Cow::Owned(k)), Str(Cow::Owned(v))))
            .collect();
        self.metadata
            .get_or_insert_with(Default::default)
            .annotations = Some(StrMap(entries));
    }
}

/// The metadata a patch adds whole.
#[derive(Deserialize)]
struct BTreeMapStrings {
    annotations: Option<std::collections::BTreeMap<String, String>>,
}

/// A container as a patch adds it: the view keeps its name.
#[derive(Deserialize)]
struct NameOnly {
    name: String,
}

/// The JSON of a typed Pod, for callers that hold one (the offline command, tests): the view is then parsed from
/// it, so they take exactly the webhook's path.
pub fn pod_json(pod: &Pod) -> String {
    serde_json::to_string(pod).expect("a typed Pod serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(json: &str) -> Box<RawValue> {
        RawValue::from_string(json.to_string()).expect("test JSON")
    }

    #[test]
    fn the_view_reads_as_serde_json_reads_it() {
        // `parse` goes through crate::json's fast path; it must read what serde_json reads, keys given twice,
        // escapes and skipped values included (crate::json's tests compare the two on broken texts).
        let pod = r#"{"metadata":{"labels":{"pdp-injector.io/inject":"a","pdp-injector.io/inject":"b\u0021",
            "other":"x"},"annotations":{"pdp-injector.io/profile":"cerbos","x":"{\"k\":[1,2]}"}},
            "spec":{"containers":[{"name":"app","env":[{"name":"A"}],"volumeMounts":null,"image":"i"},
            {"name":"c\u00e9","resources":{"limits":{"cpu":1.5}}}],"initContainers":[{"name":"i"}],
            "volumes":[{"name":"v","emptyDir":{}}],"hostNetwork":true,"restartPolicy":"Never",
            "shareProcessNamespace":false,"tolerations":[{"key":"k","tolerationSeconds":-3}]}}"#;
        let fast = crate::json::read::<PodView<'_>>(pod).expect("the fast path reads it");
        let slow: PodView<'_> = serde_json::from_str(pod).unwrap();
        assert_eq!(format!("{fast:?}"), format!("{slow:?}"));
        assert_eq!(fast.label("pdp-injector.io/inject"), Some("b!"));
        assert_eq!(fast.containers()[1].name.as_str(), "c\u{e9}");
    }

    #[test]
    fn first_unnamed_counts_only_the_entries_own_names() {
        // A nested `name` (a configMapKeyRef) must not pass for the variable: the forged-status threat.
        let list = raw(
            r#"[{"name":"OTHER","valueFrom":{"configMapKeyRef":{"name":"CERBOS_PDP_ADDR","key":"k"}}},
                {"name":"CERBOS_PDP_HOST","value":"x"}]"#,
        );
        let wanted = ["CERBOS_PDP_HOST", "CERBOS_PDP_ADDR"];
        assert_eq!(first_unnamed(Some(&list), &wanted), Some("CERBOS_PDP_ADDR"));
        let list = raw(
            r#"[{"name":"CERBOS_PDP_ADDR"},{"value":"CERBOS_PDP_HOST"},{"name":"CERBOS_PDP_HOST"}]"#,
        );
        assert_eq!(first_unnamed(Some(&list), &wanted), None);
    }

    #[test]
    fn first_unnamed_reads_escaped_names_and_reports_in_the_order_wanted() {
        let list = raw(r#"[{"name":"A\u0042"},{"name":"C"}]"#);
        assert_eq!(first_unnamed(Some(&list), &["AB", "C"]), None);
        assert_eq!(first_unnamed(Some(&list), &["D", "AB", "E"]), Some("D"));
        assert_eq!(first_unnamed(Some(&list), &["AB", "E", "D"]), Some("E"));
        // A name wanted twice is found by one entry.
        assert_eq!(first_unnamed(Some(&list), &["C", "AB", "C"]), None);
        assert_eq!(first_unnamed(Some(&list), &["C", "X", "C"]), Some("X"));
        let none: [&str; 0] = [];
        assert_eq!(first_unnamed(Some(&list), &none), None);
    }

    #[test]
    fn first_unnamed_counts_a_missing_null_or_broken_list_as_empty() {
        assert_eq!(first_unnamed(None, &["A"]), Some("A"));
        assert_eq!(first_unnamed(Some(&raw("null")), &["A"]), Some("A"));
        assert_eq!(
            first_unnamed(Some(&raw(r#"{"name":"A"}"#)), &["A"]),
            Some("A")
        );
        // What the fast reader declines (an entry written as a list, which serde_json reads as a struct) is read
        // again by serde_json: the answer is serde_json's.
        assert_eq!(
            first_unnamed(Some(&raw(r#"[["A"],{"name":"B"}]"#)), &["A", "B"]),
            None
        );
        // Entries are read up to the last name wanted: a broken entry before it hides what follows, after it
        // changes nothing.
        let list = raw(r#"[{"name":"A"},5,{"name":"B"}]"#);
        assert_eq!(first_unnamed(Some(&list), &["A"]), None);
        assert_eq!(first_unnamed(Some(&list), &["A", "B"]), Some("B"));
    }
}
