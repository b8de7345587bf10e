//! The key of this process's per-run maps (guards, live feeds, wake-ups): the owned
//! (tenant, run) pair, found by a borrowed one. Building an owned pair for a lookup
//! copied both ids, two allocations per lookup and several lookups per appended event
//! (docs/benchmarks-log.md, 2026-12-06).

/// A run's key: its tenant and its id.
pub type RunKey = (String, String);

/// A map keyed by [`RunKey`], looked up by [`RunRef`]; hashed with foldhash (hashbrown's
/// default, as the workspace's other per-event maps).
pub type RunMap<V> = hashbrown::HashMap<RunKey, V>;

/// A borrowed [`RunKey`], for lookups. It hashes exactly as the owned pair does (a
/// tuple hashes its fields in order, and a `String` as its `str`), which is what lets
/// it find one.
#[derive(Debug, Clone, Copy, Hash)]
pub struct RunRef<'a>(pub &'a str, pub &'a str);

impl hashbrown::Equivalent<RunKey> for RunRef<'_> {
    fn equivalent(&self, key: &RunKey) -> bool {
        self.0 == key.0 && self.1 == key.1
    }
}

impl RunRef<'_> {
    /// The owned key, for an insert.
    pub fn owned(&self) -> RunKey {
        (self.0.to_owned(), self.1.to_owned())
    }
}

/// The value of `key` in `map`, made by `make` and inserted under an owned copy of the
/// key only when absent: one lookup either way, and no copy of the ids when present.
pub fn get_or_insert_with<'m, V>(
    map: &'m mut RunMap<V>,
    key: RunRef<'_>,
    make: impl FnOnce() -> V,
) -> &'m mut V {
    map.raw_entry_mut().from_key(&key).or_insert_with(|| (key.owned(), make())).1
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn a_borrowed_key_hashes_and_finds_as_its_owned_pair() {
        let mut map: RunMap<u32> = RunMap::default();
        map.insert(("t1".into(), "run-a".into()), 1);
        map.insert(("t1".into(), "run-b".into()), 2);
        // The split between tenant and run matters: "t1r" + "un-a" is another key.
        map.insert(("t1r".into(), "un-a".into()), 3);
        let s = map.hasher();
        assert_eq!(s.hash_one(RunRef("t1", "run-a")), s.hash_one(&("t1".to_owned(), "run-a".to_owned())));
        assert_eq!(map.get(&RunRef("t1", "run-a")), Some(&1));
        assert_eq!(map.get(&RunRef("t1", "run-b")), Some(&2));
        assert_eq!(map.get(&RunRef("t1r", "un-a")), Some(&3));
        assert_eq!(map.get(&RunRef("t1", "run-c")), None);
        assert_eq!(map.remove(&RunRef("t1", "run-b")), Some(2));
        assert_eq!(map.len(), 2);
    }

    #[test]
    fn get_or_insert_with_makes_a_value_only_for_a_new_key() {
        let mut map: RunMap<u32> = RunMap::default();
        let mut made = 0;
        for _ in 0..3 {
            *get_or_insert_with(&mut map, RunRef("t1", "run-a"), || {
                made += 1;
                0
            }) += 1;
        }
        assert_eq!(made, 1);
        assert_eq!(map.get(&RunRef("t1", "run-a")), Some(&3));
        assert_eq!(map.len(), 1);
    }
}
