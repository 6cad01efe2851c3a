//! A layer of uncommitted changes of one store, by key.
//!
//! Nearly every processor reads and writes its state by key, never in key
//! order: a sessionizer's user, a joiner's order id. For those a layer is a
//! hash map, and a record's read-modify-write costs a hash, not a search
//! among the thousands of keys changed since the last commit (a sorted
//! map's comparisons were a fifth of the sessionizer's processing thread).
//! A store that is scanned (a map state's entries of one key) needs its
//! changes in key order, to merge them with RocksDB's: its first scan sorts
//! the layer, and it stays sorted from then on.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

pub(crate) enum Layer<V> {
    Hashed(FxHashMap<Vec<u8>, V>),
    Sorted(BTreeMap<Vec<u8>, V>),
}

impl<V> Default for Layer<V> {
    fn default() -> Self {
        Layer::Hashed(FxHashMap::default())
    }
}

impl<V> Layer<V> {
    pub fn get(&self, key: &[u8]) -> Option<&V> {
        match self {
            Layer::Hashed(map) => map.get(key),
            Layer::Sorted(map) => map.get(key),
        }
    }

    pub fn get_mut(&mut self, key: &[u8]) -> Option<&mut V> {
        match self {
            Layer::Hashed(map) => map.get_mut(key),
            Layer::Sorted(map) => map.get_mut(key),
        }
    }

    pub fn insert(&mut self, key: Vec<u8>, value: V) {
        match self {
            Layer::Hashed(map) => map.insert(key, value),
            Layer::Sorted(map) => map.insert(key, value),
        };
    }

    pub fn is_empty(&self) -> bool {
        match self {
            Layer::Hashed(map) => map.is_empty(),
            Layer::Sorted(map) => map.is_empty(),
        }
    }

    /// Empties the layer; a hashed one keeps its capacity for the next
    /// commit's changes.
    pub fn clear(&mut self) {
        match self {
            Layer::Hashed(map) => map.clear(),
            Layer::Sorted(map) => map.clear(),
        }
    }

    /// Keeps only the entries `keep` says to keep, which may change them.
    pub fn retain(&mut self, mut keep: impl FnMut(&[u8], &mut V) -> bool) {
        match self {
            Layer::Hashed(map) => map.retain(|key, value| keep(key, value)),
            Layer::Sorted(map) => map.retain(|key, value| keep(key, value)),
        }
    }

    /// Keeps the layer in key order from now on.
    pub fn sort(&mut self) {
        if let Layer::Hashed(map) = self {
            *self = Layer::Sorted(std::mem::take(map).into_iter().collect());
        }
    }

    /// The entries whose key starts with `prefix`, in key order. Only a
    /// sorted layer has an order: sort it first.
    pub fn prefixed<'a>(&'a self, prefix: &'a [u8]) -> impl Iterator<Item = (&'a Vec<u8>, &'a V)> {
        let Layer::Sorted(map) = self else {
            panic!("a layer scanned in key order must be sorted first");
        };
        map.range(prefix.to_vec()..)
            .take_while(move |(key, _)| key.starts_with(prefix))
    }

    /// Every entry, in key order if the layer is sorted.
    pub fn iter(&self) -> impl Iterator<Item = (&Vec<u8>, &V)> {
        match self {
            Layer::Hashed(map) => one_of(Some(map.iter()), None),
            Layer::Sorted(map) => one_of(None, Some(map.iter())),
        }
    }

    /// Every entry in key order; a hashed layer's are sorted for the
    /// occasion.
    pub fn in_key_order(&self) -> Vec<(&Vec<u8>, &V)> {
        let mut entries: Vec<_> = self.iter().collect();
        if let Layer::Hashed(_) = self {
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
        }
        entries
    }

    /// Takes every entry out, leaving the layer empty (a hashed one with
    /// its capacity).
    pub fn drain(&mut self) -> impl Iterator<Item = (Vec<u8>, V)> + '_ {
        match self {
            Layer::Hashed(map) => one_of(Some(map.drain()), None),
            Layer::Sorted(map) => one_of(None, Some(std::mem::take(map).into_iter())),
        }
    }
}

/// Whichever of a hashed and a sorted map's iterators is there, as one
/// iterator type.
fn one_of<T>(
    hashed: Option<impl Iterator<Item = T>>,
    sorted: Option<impl Iterator<Item = T>>,
) -> impl Iterator<Item = T> {
    hashed
        .into_iter()
        .flatten()
        .chain(sorted.into_iter().flatten())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sorted_layer_keeps_its_entries_and_scans_a_prefix_in_key_order() {
        let mut layer = Layer::default();
        for key in ["b2", "a1", "b1", "c1", "b3"] {
            layer.insert(key.as_bytes().to_vec(), key.len());
        }
        layer.insert(b"b3".to_vec(), 0);
        assert!(matches!(layer, Layer::Hashed(_)));
        let ordered: Vec<&[u8]> = layer
            .in_key_order()
            .iter()
            .map(|(key, _)| key.as_slice())
            .collect();
        assert_eq!(ordered, [&b"a1"[..], b"b1", b"b2", b"b3", b"c1"]);
        layer.sort();
        assert!(matches!(layer, Layer::Sorted(_)));
        let scanned: Vec<(&[u8], usize)> = layer
            .prefixed(b"b")
            .map(|(key, value)| (key.as_slice(), *value))
            .collect();
        assert_eq!(scanned, [(&b"b1"[..], 2), (b"b2", 2), (b"b3", 0)]);
        assert_eq!(layer.get(b"a1"), Some(&2));
        layer.insert(b"b0".to_vec(), 9);
        assert_eq!(layer.prefixed(b"b").next(), Some((&b"b0".to_vec(), &9)));
        assert_eq!(layer.drain().count(), 6);
        assert!(layer.is_empty() && matches!(layer, Layer::Sorted(_)));
    }
}
