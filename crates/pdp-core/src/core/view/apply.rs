//! A view over the patch so far: a borrowed overlay of the Pod and what applying rendering's patch adds.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::{EnvVar, VolumeMount};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::lists::count_entries;
use super::{ContainerView, MetaView, PodView, SpecView, Str, StrMap};
use crate::core::patch::{JsonPatch, OpValue};
use crate::names::{ANNOTATION_DEFAULT_CONTAINER, ANNOTATION_SAFE_TO_EVICT_LOCAL_VOLUMES};

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

impl<'a> ContainerView<'a> {
    /// A container the view knows by name only: one an earlier profile added (render reads no more of it).
    fn named(name: String) -> ContainerView<'a> {
        ContainerView {
            name: Str(Cow::Owned(name)),
            ..Default::default()
        }
    }
}
