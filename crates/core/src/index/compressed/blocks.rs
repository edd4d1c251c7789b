//! What both codings share: blocks grouped under 64-bit bases, the parts of a
//! table an index file stores, and the matching of a run of keys against a
//! batch's queries.

use super::super::bits::Bits;
use super::super::design::Table;

/// Blocks per group: a group's offsets fit in 32 bits, each group has a 64-bit base.
pub(super) const GROUP_SHIFT: u32 = 10;

/// Most keys per block: with the longest code and a 128-bit key, a group of
/// blocks stays under 4 GiB.
pub(super) const MAX_BLOCK_KEYS: usize = 16_384;

/// What an index file stores of one compressed table, in either coding.
pub(super) struct TableParts<'a> {
    pub(super) heads: &'a [u8],
    pub(super) bases: &'a [u64],
    pub(super) block_dir: &'a [u32],
    pub(super) data: &'a [u8],
    pub(super) dir_bits: u32,
    pub(super) blocks: usize,
    pub(super) block_keys: usize,
    /// The Huffman code's length per symbol (none for Elias–Fano codes).
    pub(super) code_lengths: Vec<u8>,
}

/// For a walk: each of `queries` (permuted keys with their query numbers)
/// against the `run` of keys sharing their prefix, appending (query,
/// fingerprint, distance) for those within `k`.
#[inline]
pub(super) fn match_run<B: Bits>(
    table: &Table,
    run: &[B],
    queries: &[(B, u32)],
    k: u32,
    out: &mut Vec<(u32, B, u32)>,
) {
    for &(key, q) in queries {
        for &cur in run {
            let d = cur.distance(key);
            if d <= k {
                out.push((q, table.unpermute(cur), d));
            }
        }
    }
}
