//! [`Slab`]: an array owned in memory or viewed in shared bytes (a memory map),
//! so an index opened from a file uses its tables in place, without copying.

use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;

use bytemuck::Pod;

/// Shared, immutable bytes: a memory map, a `Vec<u8>`, anything that derefs to bytes.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// An array of `T`, owned or viewed in [`SharedBytes`] (aligned and in bounds:
/// checked when the view is made).
#[derive(Clone)]
pub enum Slab<T: Pod> {
    /// Owned in memory.
    Owned(Vec<T>),
    /// A range of shared bytes.
    Mapped {
        /// The bytes.
        data: SharedBytes,
        /// The byte range holding the array.
        range: Range<usize>,
    },
}

impl<T: Pod> Slab<T> {
    /// A view of `range` in `data`; None if out of bounds, misaligned or not a
    /// whole number of elements.
    pub fn mapped(data: SharedBytes, range: Range<usize>) -> Option<Slab<T>> {
        let bytes = (*data).as_ref().get(range.clone())?;
        bytemuck::try_cast_slice::<u8, T>(bytes).ok()?;
        Some(Slab::Mapped { data, range })
    }

    /// The array, owned (copied out of shared bytes the first time).
    pub fn to_mut(&mut self) -> &mut Vec<T> {
        if let Slab::Mapped { .. } = self {
            *self = Slab::Owned(self.deref().to_vec());
        }
        match self {
            Slab::Owned(v) => v,
            Slab::Mapped { .. } => unreachable!("made owned above"),
        }
    }
}

impl<T: Pod> Deref for Slab<T> {
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        match self {
            Slab::Owned(v) => v,
            Slab::Mapped { data, range } => bytemuck::cast_slice(&(**data).as_ref()[range.clone()]),
        }
    }
}

impl<T: Pod> From<Vec<T>> for Slab<T> {
    fn from(v: Vec<T>) -> Self {
        Slab::Owned(v)
    }
}

impl<T: Pod> fmt::Debug for Slab<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Slab::Owned(v) => write!(f, "Slab::Owned({} elements)", v.len()),
            Slab::Mapped { range, .. } => write!(f, "Slab::Mapped({range:?})"),
        }
    }
}
