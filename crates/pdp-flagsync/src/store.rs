//! The flag sets a source has seen, as immutable snapshots: each change makes a new one, with the next
//! generation, and wakes every stream.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use tokio::sync::watch;

use crate::select::Selection;
use crate::set::{FlagSet, Origin, SetId};

/// The flag sets at one generation. Streams with the same selection share one rendered configuration.
#[derive(Debug)]
pub struct Snapshot {
    /// Counts changes since start; a node front serving an older one than its source is behind.
    pub generation: u64,
    /// When this generation was made: the start of a subscriber's update lag.
    pub made: Instant,
    /// True once every source has listed its objects once: before that a stream waits instead of sending a
    /// configuration that is merely incomplete.
    pub ready: bool,
    sets: BTreeMap<SetId, Arc<FlagSet>>,
    rendered: Mutex<HashMap<Selection, Arc<str>>>,
    each: OnceLock<Arc<Vec<(SetId, String)>>>,
}

impl Snapshot {
    /// Every set with its flagd JSON, rendered once per snapshot (what relays receive).
    pub fn each_json(&self) -> Arc<Vec<(SetId, String)>> {
        self.each
            .get_or_init(|| {
                Arc::new(
                    self.sets
                        .iter()
                        .map(|(id, s)| (id.clone(), s.to_json()))
                        .collect(),
                )
            })
            .clone()
    }

    fn next(&self, sets: BTreeMap<SetId, Arc<FlagSet>>, ready: bool) -> Snapshot {
        Snapshot {
            generation: self.generation + 1,
            made: Instant::now(),
            ready,
            sets,
            rendered: Mutex::default(),
            each: OnceLock::new(),
        }
    }

    /// The ids of the sets, in order.
    pub fn ids(&self) -> impl Iterator<Item = &SetId> + Clone {
        self.sets.keys()
    }

    /// One set, by id.
    pub fn get(&self, id: &SetId) -> Option<FlagSet> {
        self.sets.get(id).map(|s| FlagSet::clone(s))
    }

    /// How many sets there are.
    pub fn len(&self) -> usize {
        self.sets.len()
    }

    /// True when there is no set.
    pub fn is_empty(&self) -> bool {
        self.sets.is_empty()
    }

    /// flagd's JSON document of the sets `selection` takes, merged in its order.
    pub fn render(&self, selection: &Selection) -> Arc<str> {
        let mut memo = self.rendered.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(text) = memo.get(selection) {
            return text.clone();
        }
        let mut merged = FlagSet::default();
        for id in selection.pick(self.ids()) {
            merged.merge(&self.sets[id]);
        }
        let text: Arc<str> = merged.to_json().into();
        memo.insert(selection.clone(), text.clone());
        text
    }
}

/// The one writer of snapshots; sources call it, streams subscribe.
#[derive(Debug)]
pub struct Store {
    tx: watch::Sender<Arc<Snapshot>>,
    pending: Mutex<BTreeSet<Origin>>,
}

impl Store {
    /// An empty store that is ready once each of `sources` has called [`Store::replace_origin`].
    pub fn new(sources: &[Origin]) -> Store {
        let pending: BTreeSet<Origin> = sources.iter().copied().collect();
        let first = Snapshot {
            generation: 0,
            made: Instant::now(),
            ready: pending.is_empty(),
            sets: BTreeMap::new(),
            rendered: Mutex::default(),
            each: OnceLock::new(),
        };
        Store {
            tx: watch::channel(Arc::new(first)).0,
            pending: Mutex::new(pending),
        }
    }

    /// The newest snapshot.
    pub fn current(&self) -> Arc<Snapshot> {
        self.tx.borrow().clone()
    }

    /// A receiver that sees every new snapshot (the newest, when several came between two looks).
    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.tx.subscribe()
    }

    /// Sets or replaces one set; no new generation when it is unchanged.
    pub fn put(&self, id: SetId, set: FlagSet) {
        self.change(|sets| match sets.get(&id) {
            Some(old) if **old == set => false,
            _ => {
                sets.insert(id, Arc::new(set));
                true
            }
        });
    }

    /// Removes one set.
    pub fn remove(&self, id: &SetId) {
        self.change(|sets| sets.remove(id).is_some());
    }

    /// Replaces every set of `origin` with `sets` (a source's full listing), and counts that source as listed.
    pub fn replace_origin(&self, origin: Origin, mut sets: BTreeMap<SetId, FlagSet>) {
        let newly_ready = {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            pending.remove(&origin) && pending.is_empty()
        };
        self.change(|current| {
            let mut changed = newly_ready;
            current.retain(|id, old| {
                if id.origin != origin {
                    return true;
                }
                match sets.remove(id) {
                    Some(new) if new == **old => true,
                    Some(new) => {
                        *old = Arc::new(new);
                        changed = true;
                        true
                    }
                    None => {
                        changed = true;
                        false
                    }
                }
            });
            for (id, set) in std::mem::take(&mut sets) {
                current.insert(id, Arc::new(set));
                changed = true;
            }
            changed
        });
    }

    /// Replaces every set (a relay's copy of its source's state), and counts every source as listed.
    pub fn replace_all(&self, sets: BTreeMap<SetId, FlagSet>) {
        let newly_ready = {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            let was = !pending.is_empty();
            pending.clear();
            was
        };
        self.change(|current| {
            let same = current.len() == sets.len()
                && sets
                    .iter()
                    .all(|(id, s)| current.get(id).is_some_and(|c| **c == *s));
            if same {
                return newly_ready;
            }
            *current = sets.into_iter().map(|(id, s)| (id, Arc::new(s))).collect();
            true
        });
    }

    fn change(&self, edit: impl FnOnce(&mut BTreeMap<SetId, Arc<FlagSet>>) -> bool) {
        let ready = self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty();
        self.tx.send_if_modified(|snapshot| {
            let mut sets = snapshot.sets.clone();
            if !edit(&mut sets) {
                return false;
            }
            *snapshot = Arc::new(snapshot.next(sets, ready));
            true
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::select::Caller;

    fn flag(variant: &str) -> FlagSet {
        FlagSet::from_json(&format!(
            r#"{{"flags":{{"f":{{"state":"ENABLED","variants":{{"{variant}":true}},"defaultVariant":"{variant}"}}}}}}"#
        ))
        .unwrap()
    }

    fn id(ns: &str, name: &str) -> SetId {
        SetId {
            origin: Origin::File,
            namespace: ns.into(),
            name: name.into(),
        }
    }

    #[test]
    fn a_change_is_a_new_generation_and_the_same_set_is_none() {
        let store = Store::new(&[Origin::File]);
        let mut rx = store.subscribe();
        assert!(!store.current().ready);
        store.replace_origin(Origin::File, BTreeMap::from([(id("a", "x"), flag("on"))]));
        assert!(rx.has_changed().unwrap());
        let first = rx.borrow_and_update().clone();
        assert!(first.ready);
        assert_eq!(first.generation, 1);
        store.put(id("a", "x"), flag("on"));
        assert!(
            !rx.has_changed().unwrap(),
            "an unchanged set makes no generation"
        );
        store.put(id("a", "x"), flag("off"));
        assert_eq!(rx.borrow_and_update().generation, 2);
        store.remove(&id("a", "x"));
        assert!(store.current().is_empty());
    }

    #[test]
    fn replace_origin_drops_what_the_listing_lacks_and_renders_per_selection() {
        let store = Store::new(&[]);
        store.put(id("a", "x"), flag("on"));
        store.put(id("a", "y"), flag("off"));
        store.put(
            SetId {
                origin: Origin::ConfigMap,
                namespace: "a".into(),
                name: "z".into(),
            },
            flag("cm"),
        );
        store.replace_origin(Origin::File, BTreeMap::from([(id("a", "y"), flag("new"))]));
        let snap = store.current();
        let names: Vec<String> = snap.ids().map(|i| i.to_string()).collect();
        assert_eq!(names, ["configmap/a/z", "file/a/y"]);
        let caller = Caller {
            namespace: "a".into(),
        };
        let sel = Selection::resolve("file/a/y", &caller, "shared").unwrap();
        let text = snap.render(&sel);
        assert!(text.contains("\"new\""), "{text}");
        assert!(
            Arc::ptr_eq(&text, &snap.render(&sel)),
            "one rendering per selection and generation"
        );
    }
}
