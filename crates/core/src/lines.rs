//! Lines cut from consecutive blocks of a file, as every reader of line
//! files here cuts them: a line ends after its `\n` (the file's last line
//! may have none), and at the start of a file a UTF-8 byte-order mark is
//! not part of the first line. The caller reads the blocks, in a thread of
//! its own or as it goes, and decides what each line is for; a line that
//! lies whole in its block is handed over in place, not copied.

/// The UTF-8 byte-order mark.
pub const BOM: &[u8] = b"\xef\xbb\xbf";

/// One line of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Line<'a> {
    /// The offset of its first byte in the file.
    pub start: u64,
    /// The offset of its text: `start`, or past a byte-order mark.
    pub text_at: u64,
    /// Its bytes without the `\n` that ends it and without a byte-order
    /// mark (a `\r` before the `\n` is kept).
    pub text: &'a [u8],
    /// Whether a `\n` ends it (the file's last line may have none).
    pub ended: bool,
    /// Where it begins in the block just fed, when all of it and its `\n`
    /// lie in that block.
    pub in_block: Option<usize>,
}

impl Line<'_> {
    /// Whether `text` is the line's bytes as they lie in its block (no
    /// mark cut from it), so that the block's bytes from `in_block` to
    /// `in_block + text.len() + 1` are the line and its `\n`.
    pub fn whole_in_block(&self) -> bool {
        self.in_block.is_some() && self.text_at == self.start
    }
}

/// Cuts a file's consecutive blocks into lines: [`feed`](Self::feed) each
/// block, then [`finish`](Self::finish) at the end of the file.
#[derive(Debug, Default)]
pub struct LineCutter {
    /// The start of a line that the next block goes on with.
    carry: Vec<u8>,
    /// The file offset of `carry`'s first byte.
    carry_at: u64,
}

impl LineCutter {
    /// A cutter at the start of a file, or of a range of it (whose first
    /// line is then whatever lies before the range's first `\n`).
    pub fn new() -> Self {
        Self::default()
    }

    /// Visits, in order, the lines that end in `block` (the file's bytes
    /// from offset `at`, directly after the bytes fed before), while
    /// `visit` returns true. Returns false when `visit` stopped it (the
    /// cutter is then done with this file); the bytes after the block's
    /// last `\n` wait for the next block.
    pub fn feed<E>(
        &mut self,
        at: u64,
        block: &[u8],
        mut visit: impl FnMut(Line<'_>) -> Result<bool, E>,
    ) -> Result<bool, E> {
        let mut start = 0;
        if !self.carry.is_empty() {
            // The line that began in an earlier block.
            let Some(nl) = memchr::memchr(b'\n', block) else {
                self.carry.extend_from_slice(block);
                return Ok(true);
            };
            let mut line = std::mem::take(&mut self.carry);
            line.extend_from_slice(&block[..nl]);
            let go = visit(cut(self.carry_at, &line, true, None))?;
            line.clear();
            self.carry = line;
            if !go {
                return Ok(false);
            }
            start = nl + 1;
        }
        let from = start;
        for nl in memchr::memchr_iter(b'\n', &block[from..]) {
            let end = from + nl;
            if !visit(cut(
                at + start as u64,
                &block[start..end],
                true,
                Some(start),
            ))? {
                return Ok(false);
            }
            start = end + 1;
        }
        self.carry_at = at + start as u64;
        self.carry.extend_from_slice(&block[start..]);
        Ok(true)
    }

    /// Visits the file's last line if it has no `\n`; the cutter is then
    /// ready for another file. Returns what `visit` returned (true when
    /// there was no such line).
    pub fn finish<E>(
        &mut self,
        visit: impl FnOnce(Line<'_>) -> Result<bool, E>,
    ) -> Result<bool, E> {
        let go = if self.carry.is_empty() {
            true
        } else {
            visit(cut(self.carry_at, &self.carry, false, None))?
        };
        self.carry.clear();
        self.carry_at = 0;
        Ok(go)
    }
}

/// The line of bytes `raw` (its `\n` cut off) beginning at file offset
/// `start`.
fn cut(start: u64, raw: &[u8], ended: bool, in_block: Option<usize>) -> Line<'_> {
    let (text, text_at) = match raw.strip_prefix(BOM) {
        Some(rest) if start == 0 => (rest, BOM.len() as u64),
        _ => (raw, start),
    };
    Line {
        start,
        text_at,
        text,
        ended,
        in_block,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The lines of a whole file, cut by a direct reading of the rule.
    fn oracle(file: &[u8], from: u64) -> Vec<(u64, u64, Vec<u8>, bool)> {
        let mut out = Vec::new();
        let mut start = 0usize;
        while start < file.len() {
            let (end, ended) = match file[start..].iter().position(|&b| b == b'\n') {
                Some(i) => (start + i, true),
                None => (file.len(), false),
            };
            let at = from + start as u64;
            let raw = &file[start..end];
            let (text, text_at) = if at == 0 && raw.starts_with(BOM) {
                (&raw[3..], 3)
            } else {
                (raw, at)
            };
            out.push((at, text_at, text.to_vec(), ended));
            start = end + 1;
        }
        out
    }

    fn bytes() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            Just(b"\n".to_vec()),
            Just(b"\r\n".to_vec()),
            Just(BOM.to_vec()),
            Just(b" \t".to_vec()),
            Just("caf\u{e9} \u{4e2d}".as_bytes().to_vec()),
            proptest::collection::vec(b'a'..=b'e', 0..12),
        ];
        proptest::collection::vec(piece, 0..24).prop_map(|v| v.concat())
    }

    proptest! {
        /// However the file is cut into blocks, and from whatever offset it
        /// is read, the lines are the oracle's, and a line handed over in
        /// place is the block's own bytes.
        #[test]
        fn cuts_lines_as_the_rule_says(
            file in bytes(),
            cuts in proptest::collection::vec(0usize..40, 0..8),
            from in prop_oneof![Just(0u64), 1u64..100],
        ) {
            let mut bounds: Vec<usize> = cuts.into_iter().map(|c| c.min(file.len())).collect();
            bounds.push(0);
            bounds.push(file.len());
            bounds.sort_unstable();
            let mut got = Vec::new();
            let mut cutter = LineCutter::new();
            for w in bounds.windows(2) {
                let block = &file[w[0]..w[1]];
                let go = cutter.feed(from + w[0] as u64, block, |l| {
                    if let Some(s) = l.in_block {
                        let raw: &[u8] = &block[s..s + l.text.len() + 3 * usize::from(!l.whole_in_block()) + 1];
                        prop_assert_eq!(raw.last(), Some(&b'\n'));
                        if l.whole_in_block() {
                            prop_assert_eq!(&raw[..raw.len() - 1], l.text);
                        }
                    }
                    got.push((l.start, l.text_at, l.text.to_vec(), l.ended));
                    Ok(true)
                })?;
                prop_assert!(go);
            }
            cutter.finish(|l| {
                got.push((l.start, l.text_at, l.text.to_vec(), l.ended));
                Ok::<_, TestCaseError>(true)
            })?;
            prop_assert_eq!(got, oracle(&file, from));
        }

        /// A visit that says stop gets no further line.
        #[test]
        fn stops_when_asked(file in bytes(), block in 1usize..16, after in 0usize..6) {
            let mut cutter = LineCutter::new();
            let mut seen = 0usize;
            let mut stopped = false;
            for (i, chunk) in file.chunks(block).enumerate() {
                let go = cutter.feed((i * block) as u64, chunk, |_| {
                    seen += 1;
                    Ok::<_, ()>(seen <= after)
                }).unwrap();
                if !go {
                    stopped = true;
                    break;
                }
            }
            let ended = file.iter().filter(|&&b| b == b'\n').count();
            prop_assert_eq!(stopped, ended > after);
            prop_assert!(seen <= after + 1);
        }
    }
}
