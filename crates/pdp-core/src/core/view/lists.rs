//! The lists a view keeps unparsed, read on demand: parsed whole, by name only, entry by entry or counted.

use std::borrow::Cow;
use std::fmt;

use k8s_openapi::api::core::v1::EnvVar;
use serde::Deserialize;
use serde::de::{Deserializer, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::{
    ContainerView, EnvEntry, FieldRefEntry, MountEntry, SpecView, Str, ValueFromEntry, VolumeBody,
    VolumeEntry,
};

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

/// Calls `f` with each entry of a list, in order, until it returns `true`. A list that is not one counts as
/// empty, as does `None`. The fast reader splits the list (crate::json); where it declines, serde_json does and
/// `f` sees the entries up to where serde_json stops.
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
    let Some(raw) = raw else {
        return;
    };
    match crate::json::read::<Vec<&'a RawValue>>(raw.get()) {
        Ok(entries) => {
            for entry in entries {
                if f(entry) {
                    break;
                }
            }
        }
        Err(crate::json::Fallback) => {
            let mut de = serde_json::Deserializer::from_str(raw.get());
            // Stopping early leaves the list unfinished, which the parser reports: what `f` saw stands.
            let _ = de.deserialize_seq(Each(&mut f));
        }
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
pub(super) fn count_entries(raw: Option<&RawValue>) -> Result<usize, String> {
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
