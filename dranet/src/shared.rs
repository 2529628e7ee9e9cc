//! [`Shared`]: a value that several long-lived copies hold together: a checkpoint record (the
//! engine's checkpoint and the writer's copy of what is on disk), a device's attributes (the
//! inventory, the last published list and the kept attributes of devices in pods). Reading it is
//! free; the first write through it clones the value (copy on write), so the copies part exactly
//! where one changed. Equality starts with identity: a save compares two unchanged records by
//! pointer, not field by field, so a save of one changed record in a checkpoint of 500 looks at
//! 500 pointers, not at 4 MiB of snapshots. And a long-lived value is allocated once, not again
//! by every rebuild that finds it unchanged (see `inventory::HeldAttributes::apply`).

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A value shared between copies until one of them writes to it.
pub struct Shared<T>(Arc<T>);

impl<T> Shared<T> {
    #[must_use]
    pub fn new(value: T) -> Self {
        Self(Arc::new(value))
    }

    /// Whether both are the same record, not only equal ones.
    #[must_use]
    pub fn same(a: &Self, b: &Self) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }
}

impl<T> From<T> for Shared<T> {
    fn from(value: T) -> Self {
        Self::new(value)
    }
}

impl<A, T: FromIterator<A>> FromIterator<A> for Shared<T> {
    fn from_iter<I: IntoIterator<Item = A>>(iter: I) -> Self {
        Self::new(iter.into_iter().collect())
    }
}

impl<T> Clone for Shared<T> {
    /// Another handle on the same record: no copy of it.
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<T> std::borrow::Borrow<T> for Shared<T> {
    fn borrow(&self) -> &T {
        &self.0
    }
}

impl<T> Deref for Shared<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Clone> DerefMut for Shared<T> {
    /// The first write parts this copy from the others.
    fn deref_mut(&mut self) -> &mut T {
        Arc::make_mut(&mut self.0)
    }
}

impl<T: PartialEq> PartialEq for Shared<T> {
    fn eq(&self, other: &Self) -> bool {
        Self::same(self, other) || *self.0 == *other.0
    }
}

impl<T: Eq> Eq for Shared<T> {}

impl<T: fmt::Debug> fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<T: Default> Default for Shared<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T: Serialize> Serialize for Shared<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Shared<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::deserialize(d).map(Self::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_parts_one_copy_and_leaves_the_other_as_it_was() {
        let a = Shared::new(vec![1, 2]);
        let mut b = a.clone();
        assert!(Shared::same(&a, &b));
        b.push(3);
        assert!(!Shared::same(&a, &b));
        assert_eq!(*a, vec![1, 2]);
        assert_eq!(*b, vec![1, 2, 3]);
        assert_ne!(a, b);
        // Equal but not the same record: still equal.
        assert_eq!(a, Shared::new(vec![1, 2]));
    }

    #[test]
    fn it_is_the_record_on_the_wire() {
        let a = Shared::new(vec![1, 2]);
        let json = serde_json::to_string(&a).unwrap_or_default();
        assert_eq!(json, "[1,2]");
        let back: Shared<Vec<i32>> = serde_json::from_str(&json).unwrap_or_default();
        assert_eq!(back, a);
    }
}
