//! The host's registry of event types: event id (the `u16` a kernel writes in
//! each record) → a name and, optionally, a category, a description and the
//! name of its payload, so that traces say "load" and "mma", not "3".
//!
//! Every record carries a 32-bit payload (`docs/format.md`), but only some
//! event types put something in it (a k-tile index, a stage, a byte count).
//! A type whose payload means something declares it, with the name outputs
//! show it under ([`EventRegistry::with_payload`]); the Perfetto writer
//! writes the payload argument only for those types, so a slice costs no
//! bytes for a payload that is always 0.
//!
//! Names are interned: every id registered with the same name shares one
//! `Arc<str>`, so outputs that intern strings (Perfetto) can key on it cheaply.
//! The registry also keeps a 65 536-bit membership set, so the decoder's
//! "is this id known?" check ([`EventRegistry::contains`]) is one load and a mask
//! per record.
//!
//! ```
//! use tracing_gpu::registry::EventRegistry;
//! let mut reg = EventRegistry::new();
//! reg.register(1, "load").unwrap();
//! reg.register(2, "mma").unwrap();
//! assert_eq!(reg.name(2), Some("mma"));
//! assert_eq!(reg.display_name(9), "event 9");
//! assert!(reg.register(2, "epilogue").is_err()); // same id, other name
//!
//! // Builder style, with declared payloads: the k-tile index of each load and mma.
//! let reg = EventRegistry::from_pairs([(1, "load"), (2, "mma"), (3, "epilogue")])?
//!     .with_payload(1, "k_tile")?
//!     .with_payload(2, "k_tile")?;
//! assert_eq!(reg.payload_name(1), Some("k_tile"));
//! assert_eq!(reg.payload_name(3), None); // epilogue's payload is not shown
//! # Ok::<(), tracing_gpu::registry::RegistryError>(())
//! ```

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::Arc;

/// What the registry knows of one event type.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EventInfo {
    /// The name traces show ("load", "mma").
    pub name: Arc<str>,
    /// An optional category (Perfetto category, OTLP attribute), such as "gemm".
    pub category: Option<Arc<str>>,
    /// An optional human description.
    pub description: Option<Arc<str>>,
    /// The name of the payload, if this type declares one
    /// ([`EventRegistry::with_payload`]): what outputs call the record's
    /// 32-bit payload ("k_tile", "stage", "bytes"). `None`: the payload means
    /// nothing for this type, and the Perfetto writer leaves it out.
    pub payload: Option<Arc<str>>,
}

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// The id is already registered with a different name, category or description.
    #[error("event id {id} is already registered as {existing:?}, cannot register it as {new:?}")]
    Conflict {
        /// The id.
        id: u16,
        /// The name it already has.
        existing: Arc<str>,
        /// The name that was asked for.
        new: Arc<str>,
    },
    /// The id already declares a payload under another name.
    #[error(
        "event id {id} already declares its payload as {existing:?}, cannot declare it as {new:?}"
    )]
    PayloadConflict {
        /// The id.
        id: u16,
        /// The payload name it already has.
        existing: Arc<str>,
        /// The payload name that was asked for.
        new: Arc<str>,
    },
    /// A payload was declared for an id that is not registered.
    #[error("event id {id} is not registered: register it before declaring its payload")]
    NotRegistered {
        /// The id.
        id: u16,
    },
}

const WORDS: usize = (u16::MAX as usize + 1) / 64;

/// Event id → [`EventInfo`]. Cheap to clone for small registries (one 8 KiB set
/// plus the entries); `Send + Sync`; share it behind an `Arc` across threads.
#[derive(Clone)]
pub struct EventRegistry {
    entries: BTreeMap<u16, EventInfo>,
    // One bit per possible id: the decoder checks every record against it.
    known: Box<[u64; WORDS]>,
    /// Every string the entries hold, once: what `intern` shares. A capture
    /// can declare tens of thousands of names; a search of the entries per
    /// name was quadratic (26 s to read 65,536 names).
    strings: HashSet<Arc<str>>,
}

/// Two registries are equal when their entries are (the interning set
/// follows from them).
impl PartialEq for EventRegistry {
    fn eq(&self, other: &Self) -> bool {
        self.entries == other.entries
    }
}

impl Eq for EventRegistry {}

impl Default for EventRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for EventRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.entries.iter().map(|(id, e)| (id, &e.name)))
            .finish()
    }
}

impl EventRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        EventRegistry {
            entries: BTreeMap::new(),
            known: Box::new([0; WORDS]),
            strings: HashSet::new(),
        }
    }

    /// Builds a registry from `(id, name)` pairs; fails on the first conflict.
    pub fn from_pairs<'s>(
        pairs: impl IntoIterator<Item = (u16, &'s str)>,
    ) -> Result<Self, RegistryError> {
        let mut reg = Self::new();
        for (id, name) in pairs {
            reg.register(id, name)?;
        }
        Ok(reg)
    }

    /// Registers `id` as `name`. Registering the same id with the same name again
    /// is a no-op; with another name it is a [`RegistryError::Conflict`].
    pub fn register(&mut self, id: u16, name: &str) -> Result<(), RegistryError> {
        self.register_with(id, name, None, None)
    }

    /// Registers `id` with a name, a category and a description. An id already
    /// present must have exactly the same three, or this is a conflict (so two
    /// parts of a program cannot silently disagree on what an id means). A
    /// payload declared for it before stays declared.
    pub fn register_with(
        &mut self,
        id: u16,
        name: &str,
        category: Option<&str>,
        description: Option<&str>,
    ) -> Result<(), RegistryError> {
        if let Some(existing) = self.entries.get(&id) {
            let same = &*existing.name == name
                && existing.category.as_deref() == category
                && existing.description.as_deref() == description;
            return if same {
                Ok(())
            } else {
                Err(RegistryError::Conflict {
                    id,
                    existing: existing.name.clone(),
                    new: Arc::from(name),
                })
            };
        }
        let info = EventInfo {
            name: self.intern(name),
            category: category.map(|c| self.intern(c)),
            description: description.map(Arc::from),
            payload: None,
        };
        self.entries.insert(id, info);
        self.known[id as usize / 64] |= 1 << (id % 64);
        Ok(())
    }

    /// Declares that events of type `id` carry a payload, shown as `name`
    /// (Perfetto: the slice's argument `name`; OTLP and plain spans: the
    /// `gpu.payload.name` attribute beside `gpu.payload`). Declaring the same
    /// name again is a no-op; another name is a [`RegistryError::PayloadConflict`],
    /// and an id not registered yet a [`RegistryError::NotRegistered`].
    pub fn declare_payload(&mut self, id: u16, name: &str) -> Result<(), RegistryError> {
        let interned = self.intern(name);
        let Some(e) = self.entries.get_mut(&id) else {
            return Err(RegistryError::NotRegistered { id });
        };
        match &e.payload {
            Some(existing) if **existing == *name => Ok(()),
            Some(existing) => Err(RegistryError::PayloadConflict {
                id,
                existing: existing.clone(),
                new: interned,
            }),
            None => {
                e.payload = Some(interned);
                Ok(())
            }
        }
    }

    /// [`EventRegistry::declare_payload`], builder style:
    /// `EventRegistry::from_pairs([(1, "load")])?.with_payload(1, "k_tile")?`.
    pub fn with_payload(mut self, id: u16, name: &str) -> Result<Self, RegistryError> {
        self.declare_payload(id, name)?;
        Ok(self)
    }

    /// Adds every entry of `other`, with its payload declaration; fails
    /// (leaving `self` unchanged) on the first conflict.
    pub fn merge(&mut self, other: &EventRegistry) -> Result<(), RegistryError> {
        let mut merged = self.clone();
        for (id, e) in other.iter() {
            merged.register_with(id, &e.name, e.category.as_deref(), e.description.as_deref())?;
            if let Some(p) = &e.payload {
                merged.declare_payload(id, p)?;
            }
        }
        *self = merged;
        Ok(())
    }

    fn intern(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.strings.get(s) {
            return a.clone();
        }
        let a: Arc<str> = Arc::from(s);
        self.strings.insert(a.clone());
        a
    }

    /// Whether `id` is registered. Constant time: the decoder calls it per record.
    #[inline]
    pub fn contains(&self, id: u16) -> bool {
        self.known[id as usize / 64] & (1 << (id % 64)) != 0
    }

    /// The name of `id`, if registered.
    pub fn name(&self, id: u16) -> Option<&str> {
        self.entries.get(&id).map(|e| &*e.name)
    }

    /// The declared payload name of `id` ([`EventRegistry::with_payload`]), if any.
    pub fn payload_name(&self, id: u16) -> Option<&str> {
        self.entries.get(&id).and_then(|e| e.payload.as_deref())
    }

    /// Everything known of `id`.
    pub fn info(&self, id: u16) -> Option<&EventInfo> {
        self.entries.get(&id)
    }

    /// The name outputs show: the registered name, or `"event <id>"` for an id
    /// the registry does not know (traces decoded without a registry still read well).
    pub fn display_name(&self, id: u16) -> Cow<'_, str> {
        match self.name(id) {
            Some(n) => Cow::Borrowed(n),
            None => Cow::Owned(unknown_event_name(id)),
        }
    }

    /// The entries in increasing id order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (u16, &EventInfo)> + '_ {
        self.entries.iter().map(|(id, e)| (*id, e))
    }

    /// Number of registered ids.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no id is registered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The name used for an event id that no registry names: `"event 3"`.
pub(crate) fn unknown_event_name(id: u16) -> String {
    format!("event {id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_and_look_up() {
        let mut r = EventRegistry::new();
        assert!(r.is_empty());
        r.register(3, "load").unwrap();
        r.register_with(65535, "mma", Some("gemm"), Some("tensor core"))
            .unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r.name(3), Some("load"));
        assert_eq!(r.info(65535).unwrap().category.as_deref(), Some("gemm"));
        assert!(r.contains(3) && r.contains(65535));
        assert!(!r.contains(0) && !r.contains(4) && !r.contains(65534));
        assert_eq!(r.display_name(3), "load");
        assert_eq!(r.display_name(4), "event 4");
        let ids: Vec<u16> = r.iter().map(|(id, _)| id).collect();
        assert_eq!(ids, [3, 65535]);
    }

    #[test]
    fn duplicates() {
        let mut r = EventRegistry::from_pairs([(1, "a"), (2, "b")]).unwrap();
        r.register(1, "a").unwrap();
        let err = r.register(1, "c").unwrap_err();
        assert_eq!(
            err.to_string(),
            "event id 1 is already registered as \"a\", cannot register it as \"c\""
        );
        assert!(r.register_with(1, "a", Some("x"), None).is_err());
        assert_eq!(r.name(1), Some("a"));
    }

    #[test]
    fn many_distinct_names_register_in_linear_time() {
        // Every possible id, each with its own name: what a hostile capture can
        // declare. Quadratic interning took tens of seconds here.
        let t = std::time::Instant::now();
        let mut r = EventRegistry::new();
        for id in 0..=u16::MAX {
            r.register(id, &format!("event name {id}")).unwrap();
        }
        assert_eq!(r.len(), 1 << 16);
        assert!(
            t.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn names_are_interned() {
        let r = EventRegistry::from_pairs([(1, "same"), (2, "same")]).unwrap();
        let (a, b) = (r.info(1).unwrap(), r.info(2).unwrap());
        assert!(Arc::ptr_eq(&a.name, &b.name));
    }

    #[test]
    fn payloads_are_declared_per_type() {
        let r = EventRegistry::from_pairs([(1, "load"), (2, "mma"), (3, "epilogue")])
            .unwrap()
            .with_payload(1, "k_tile")
            .unwrap()
            .with_payload(2, "k_tile")
            .unwrap()
            .with_payload(2, "k_tile")
            .unwrap();
        assert_eq!(r.payload_name(1), Some("k_tile"));
        assert_eq!(r.payload_name(3), None);
        assert_eq!(r.payload_name(9), None);
        assert!(Arc::ptr_eq(
            r.info(1).unwrap().payload.as_ref().unwrap(),
            r.info(2).unwrap().payload.as_ref().unwrap()
        ));
        let mut r2 = r.clone();
        assert_eq!(
            r2.declare_payload(1, "stage").unwrap_err().to_string(),
            "event id 1 already declares its payload as \"k_tile\", cannot declare it as \"stage\""
        );
        assert_eq!(
            r2.declare_payload(4, "bytes").unwrap_err(),
            RegistryError::NotRegistered { id: 4 }
        );
        // Registering again keeps the declaration.
        r2.register(1, "load").unwrap();
        assert_eq!(r2, r);
        // Merging carries declarations, and refuses a different one.
        let mut plain = EventRegistry::from_pairs([(1, "load")]).unwrap();
        plain.merge(&r).unwrap();
        assert_eq!(plain, r);
        let other = EventRegistry::from_pairs([(1, "load")])
            .unwrap()
            .with_payload(1, "stage")
            .unwrap();
        assert!(plain.merge(&other).is_err());
        assert_eq!(plain, r);
    }

    #[test]
    fn merge_is_all_or_nothing() {
        let mut a = EventRegistry::from_pairs([(1, "a")]).unwrap();
        let b = EventRegistry::from_pairs([(2, "b"), (1, "z")]).unwrap();
        assert!(a.merge(&b).is_err());
        assert_eq!(a.len(), 1);
        let c = EventRegistry::from_pairs([(2, "b"), (1, "a")]).unwrap();
        a.merge(&c).unwrap();
        assert_eq!(a.len(), 2);
    }

    #[test]
    fn send_sync() {
        fn check<T: Send + Sync + Clone + Default>() {}
        check::<EventRegistry>();
    }
}
