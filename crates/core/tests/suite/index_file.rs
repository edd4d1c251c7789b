//! The index file: round trips, damage of every kind, and the committed fixture
//! of format versions 1 (plain tables) and 2 (compressed tables).

use std::sync::Arc;

use neardup_core::Error;
use neardup_core::index::{
    Bits, Coding, CompressedIndex, Index, IndexFile, Match, SharedBytes, TableDesign,
};
use neardup_core::rng::SplitMix64;
use proptest::prelude::*;

fn shared(bytes: Vec<u8>) -> SharedBytes {
    Arc::new(bytes)
}

fn build<B: Bits>(fps: &[B], k: u32) -> Index<B> {
    let design = TableDesign::new(B::BITS, k, &[k + 2]).unwrap();
    Index::build(
        design,
        fps.iter().enumerate().map(|(i, &f)| (i as u64 * 3, f)),
    )
    .unwrap()
}

fn write<B: Bits>(index: &Index<B>) -> Vec<u8> {
    let mut bytes = Vec::new();
    index
        .write_to(
            &serde_json::json!({"note": "test"}),
            &[("extra", b"hello")],
            &mut bytes,
        )
        .unwrap();
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(60))]
    #[test]
    fn round_trip_answers_the_same(fps in prop::collection::vec(any::<u64>(), 1..300), flips in prop::collection::vec(0u32..64, 1..4), wide: bool) {
        if wide {
            let fps: Vec<u128> = fps.iter().map(|&f| (f as u128) << 64 | f.rotate_left(7) as u128).collect();
            let index = build(&fps, 4);
            let file = IndexFile::open(shared(write(&index))).unwrap();
            file.verify().unwrap();
            let loaded = file.index::<u128>().unwrap();
            for &q in fps.iter().take(20) {
                let q = flips.iter().fold(q, |q, &b| q ^ (1u128 << (b * 2)));
                prop_assert_eq!(loaded.query(q, 4).unwrap(), index.query(q, 4).unwrap());
            }
        } else {
            let mut index = build(&fps, 3);
            // Deleted and pending entries: the file holds the live ones.
            index.delete(|id| id % 2 == 1);
            index.add(1_000_001, fps[0] ^ 1).unwrap();
            let file = IndexFile::open(shared(write(&index))).unwrap();
            file.verify().unwrap();
            prop_assert_eq!(file.section("extra"), Some(&b"hello"[..]));
            prop_assert_eq!(&file.extra()["note"], "test");
            let loaded = file.index::<u64>().unwrap();
            prop_assert_eq!(loaded.len(), index.len());
            for &q in fps.iter().take(20) {
                let q = flips.iter().fold(q, |q, &b| q ^ (1u64 << b));
                prop_assert_eq!(loaded.query(q, 3).unwrap(), index.query(q, 3).unwrap());
            }
            prop_assert_eq!(loaded.self_join(3).unwrap(), index.self_join(3).unwrap());
        }
    }
}

fn sample_bytes() -> Vec<u8> {
    let fps: Vec<u64> = (0..1000u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    write(&build(&fps, 3))
}

#[test]
fn truncated_files_are_refused_at_every_length() {
    let bytes = sample_bytes();
    for len in (0..bytes.len()).step_by(97).chain([bytes.len() - 1]) {
        let err = IndexFile::open(shared(bytes[..len].to_vec())).unwrap_err();
        assert!(matches!(err, Error::CorruptIndex(_)), "length {len}: {err}");
    }
}

#[test]
fn damage_is_found_by_open_or_verify_and_never_panics() {
    let bytes = sample_bytes();
    // Flip one bit at many places: open refuses, or verify does; queries on what
    // opens never panic.
    for at in (0..bytes.len()).step_by(13) {
        let mut b = bytes.clone();
        b[at] ^= 0x10;
        match IndexFile::open(shared(b)) {
            Err(_) => {}
            Ok(file) => {
                assert!(file.verify().is_err(), "damage at byte {at} went unnoticed");
                if let Ok(index) = file.index::<u64>() {
                    let _ = index.query(12345, 3);
                }
            }
        }
    }
}

#[test]
fn wrong_version_and_wrong_magic_say_so() {
    let mut b = sample_bytes();
    b[8] = 9;
    let err = IndexFile::open(shared(b)).unwrap_err().to_string();
    assert!(
        err.contains("version 9") && err.contains("rebuild"),
        "{err}"
    );
    let mut b = sample_bytes();
    b[0] = b'X';
    let err = IndexFile::open(shared(b)).unwrap_err().to_string();
    assert!(err.contains("not a neardup index"), "{err}");
}

#[test]
fn width_mismatch_is_an_error() {
    let file = IndexFile::open(shared(sample_bytes())).unwrap();
    assert!(matches!(
        file.index::<u128>(),
        Err(Error::WidthMismatch { .. })
    ));
}

/// A file written by format version 1, committed, must stay readable.
#[test]
fn version_1_fixture_still_opens_and_answers() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/index_v1.ndx");
    if std::env::var_os("NEARDUP_WRITE_FIXTURE").is_some() {
        std::fs::write(&path, sample_bytes()).unwrap();
    }
    let file =
        IndexFile::open(shared(std::fs::read(&path).expect("fixture is committed"))).unwrap();
    file.verify().unwrap();
    assert_eq!(file.entries(), 1000);
    let index = file.index::<u64>().unwrap();
    // Entry i has id 3i and fingerprint i * golden ratio constant.
    let q = 7u64.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0b101;
    let m = index.query(q, 3).unwrap();
    assert_eq!(m.len(), 1);
    assert_eq!((m[0].id, m[0].distance), (21, 2));
}

// Format version 2: compressed tables.

fn write_compressed<B: Bits>(c: &CompressedIndex<B>) -> Vec<u8> {
    let mut bytes = Vec::new();
    c.write_to(
        &serde_json::json!({"note": "compressed"}),
        &[("extra", b"hello")],
        &mut bytes,
    )
    .unwrap();
    bytes
}

fn build_compressed<B: Bits>(
    fps: &[B],
    k: u32,
    block: usize,
    coding: Coding,
) -> CompressedIndex<B> {
    let design = TableDesign::new(B::BITS, k, &[k + 2]).unwrap();
    CompressedIndex::build(
        design,
        fps.iter().enumerate().map(|(i, &f)| (i as u64 * 3, f)),
        block,
        coding,
    )
    .unwrap()
}

fn brute<B: Bits>(fps: &[B], q: B, k: u32) -> Vec<Match> {
    let mut m: Vec<Match> = fps
        .iter()
        .enumerate()
        .filter(|(_, f)| f.distance(q) <= k)
        .map(|(i, f)| Match {
            distance: f.distance(q),
            id: i as u64 * 3,
        })
        .collect();
    m.sort_unstable();
    m
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(60))]
    /// Written, opened in place and queried (one by one and in a batch), a
    /// compressed index answers exactly as brute force does.
    #[test]
    fn compressed_round_trip_is_exact(base in prop::collection::vec(any::<u64>(), 1..200), copies in 0usize..300, block in prop::sample::select(vec![1usize, 16, 64, 1024]), ef: bool, wide: bool, seed: u64) {
        let coding = if ef { Coding::EliasFano } else { Coding::Gaps };
        let mut rng = SplitMix64(seed);
        // Near copies, and exact duplicates (several ids per fingerprint).
        let mut fps = base.clone();
        for _ in 0..copies {
            let f = fps[(rng.next() % fps.len() as u64) as usize];
            fps.push(if rng.next().is_multiple_of(3) { f } else { f ^ (1 << (rng.next() % 64)) });
        }
        let queries: Vec<u64> = (0..5000).map(|i| if i % 2 == 0 { rng.next() } else { fps[i % fps.len()] ^ (1 << (rng.next() % 64)) }).collect();
        if wide {
            let fps: Vec<u128> = fps.iter().map(|&f| (f as u128) << 64 | f.rotate_left(7) as u128).collect();
            let queries: Vec<u128> = queries.iter().map(|&f| (f as u128) << 64 | f.rotate_left(7) as u128).collect();
            let file = IndexFile::open(shared(write_compressed(&build_compressed(&fps, 4, block, coding)))).unwrap();
            file.verify().unwrap();
            prop_assert!(file.is_compressed());
            let c = file.compressed_index::<u128>().unwrap();
            for &q in queries.iter().take(30) {
                prop_assert_eq!(c.query(q, 4).unwrap(), brute(&fps, q, 4));
            }
        } else {
            let file = IndexFile::open(shared(write_compressed(&build_compressed(&fps, 3, block, coding)))).unwrap();
            file.verify().unwrap();
            prop_assert_eq!(file.section("extra"), Some(&b"hello"[..]));
            prop_assert_eq!(&file.extra()["note"], "compressed");
            prop_assert_eq!(file.entries(), fps.len() as u64);
            let c = file.compressed_index::<u64>().unwrap();
            for &q in queries.iter().take(30) {
                prop_assert_eq!(c.query(q, 3).unwrap(), brute(&fps, q, 3));
            }
            let batch = c.query_batch(&queries, 3).unwrap();
            for (&q, got) in queries.iter().zip(&batch) {
                prop_assert_eq!(got, &brute(&fps, q, 3));
            }
        }
    }
}

fn compressed_sample_fps() -> Vec<u64> {
    (0..1000u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect()
}

fn compressed_sample_bytes(coding: Coding) -> Vec<u8> {
    write_compressed(&build_compressed(&compressed_sample_fps(), 3, 64, coding))
}

#[test]
fn compressed_files_refuse_truncation_and_survive_damage() {
    for coding in [Coding::Gaps, Coding::EliasFano] {
        refuses_truncation_and_survives_damage(coding);
    }
}

fn refuses_truncation_and_survives_damage(coding: Coding) {
    let bytes = compressed_sample_bytes(coding);
    for len in (0..bytes.len()).step_by(61).chain([bytes.len() - 1]) {
        let err = IndexFile::open(shared(bytes[..len].to_vec())).unwrap_err();
        assert!(matches!(err, Error::CorruptIndex(_)), "length {len}: {err}");
    }
    // Flip one bit at many places: open refuses, or verify does; queries on what
    // opens (one by one, and a batch large enough to walk the tables) never panic.
    let fps = compressed_sample_fps();
    let batch: Vec<u64> = (0..4096).map(|i| fps[i % fps.len()] ^ (i as u64)).collect();
    for (n, at) in (0..bytes.len()).step_by(23).enumerate() {
        let mut b = bytes.clone();
        b[at] ^= 0x10;
        if let Ok(file) = IndexFile::open(shared(b)) {
            assert!(file.verify().is_err(), "damage at byte {at} went unnoticed");
            if let Ok(c) = file.compressed_index::<u64>() {
                for &q in fps.iter().step_by(100) {
                    let _ = c.query(q ^ 1, 3);
                }
                if n % 8 == 0 {
                    let _ = c.query_batch(&batch, 3);
                }
            }
        }
    }
}

#[test]
fn plain_and_compressed_files_are_not_mixed_up() {
    let compressed = IndexFile::open(shared(compressed_sample_bytes(Coding::Gaps))).unwrap();
    let err = compressed.index::<u64>().unwrap_err().to_string();
    assert!(
        err.contains("compressed") && err.contains("read-only"),
        "{err}"
    );
    let plain = IndexFile::open(shared(sample_bytes())).unwrap();
    assert!(!plain.is_compressed());
    assert!(plain.compressed_index::<u64>().is_err());
    assert!(matches!(
        compressed.compressed_index::<u128>(),
        Err(Error::WidthMismatch { .. })
    ));
}

/// Committed files written by format versions 2 (compressed tables in the
/// paper's codes) and 3 (Elias–Fano codes) must stay readable.
#[test]
fn compressed_fixtures_still_open_and_answer() {
    for (name, version, coding) in [
        ("index_v2_compressed.ndx", 2, Coding::Gaps),
        ("index_v3_ef.ndx", 3, Coding::EliasFano),
    ] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(name);
        if std::env::var_os("NEARDUP_WRITE_FIXTURE").is_some() {
            std::fs::write(&path, compressed_sample_bytes(coding)).unwrap();
        }
        let bytes = std::fs::read(&path).expect("fixture is committed");
        assert_eq!(
            u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
            version
        );
        let file = IndexFile::open(shared(bytes)).unwrap();
        file.verify().unwrap();
        assert!(file.is_compressed());
        assert_eq!(file.entries(), 1000);
        let c = file.compressed_index::<u64>().unwrap();
        assert_eq!(c.coding(), coding);
        // Entry i has id 3i and fingerprint i * golden ratio constant.
        let fps = compressed_sample_fps();
        let q = fps[7] ^ 0b101;
        let m = c.query(q, 3).unwrap();
        assert_eq!(m.len(), 1);
        assert_eq!((m[0].id, m[0].distance), (21, 2));
        for &q in fps.iter().step_by(37) {
            assert_eq!(c.query(q ^ 0b11, 3).unwrap(), brute(&fps, q ^ 0b11, 3));
        }
    }
}

/// Compressed indexes of no entry, and of one fingerprint held by many ids,
/// in either coding, write, open, verify and answer.
#[test]
fn tiny_compressed_indexes_round_trip() {
    for coding in [Coding::Gaps, Coding::EliasFano] {
        let empty = build_compressed::<u64>(&[], 3, 1024, coding);
        let file = IndexFile::open(shared(write_compressed(&empty))).unwrap();
        file.verify().unwrap();
        let c = file.compressed_index::<u64>().unwrap();
        assert_eq!(c.query(7, 3).unwrap(), Vec::new(), "{coding:?}");
        assert_eq!(
            c.query_batch(&[0; 5000], 3).unwrap(),
            vec![Vec::new(); 5000]
        );

        let same = vec![0xdead_beef_u64; 40];
        let file = IndexFile::open(shared(write_compressed(&build_compressed(
            &same, 3, 16, coding,
        ))))
        .unwrap();
        file.verify().unwrap();
        let c = file.compressed_index::<u64>().unwrap();
        assert_eq!(c.coding(), coding);
        assert_eq!(
            c.query(0xdead_beef ^ 0b111, 3).unwrap(),
            brute(&same, 0xdead_beef ^ 0b111, 3)
        );
        assert_eq!(c.query(0xdead_beef ^ 0b1111, 3).unwrap(), Vec::new());
    }
}

// The bundle: every edge's one way to open an index file.

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Plain and compressed files of the same entries, written with ids and a
    /// configuration and opened from disk (memory-mapped) as bundles, answer
    /// queries and the self-join as brute force does; the compressed one
    /// refuses changes with a read-only error, the plain one takes them and
    /// saves them atomically.
    #[test]
    fn bundles_open_either_kind_from_disk(base in prop::collection::vec(any::<u64>(), 1..120), copies in 0usize..120, wide: bool, seed: u64) {
        use neardup_core::index::{AnyIndex, Bundle, IdTable, bundle};
        use neardup_core::{Fingerprint, FingerprintConfig, Width};
        let mut rng = SplitMix64(seed);
        let mut words = base.clone();
        for _ in 0..copies {
            let f = words[(rng.next() % words.len() as u64) as usize];
            words.push(if rng.next().is_multiple_of(3) { f } else { f ^ (1 << (rng.next() % 64)) });
        }
        let width = if wide { Width::W128 } else { Width::W64 };
        let fp = |w: u64| match width {
            Width::W64 => Fingerprint::from_u64(w),
            Width::W128 => Fingerprint::new((w as u128) << 64 | w.rotate_left(7) as u128, width),
        };
        let fps: Vec<Fingerprint> = words.iter().map(|&w| fp(w)).collect();
        let k = 3;
        let design = TableDesign::new(width.bits(), k, &[k + 2]).unwrap();
        let mut ids = IdTable::default();
        (0..fps.len()).for_each(|i| ids.push_int(i as i64 * 3));
        let config = FingerprintConfig::default();
        let dir = tempfile::tempdir().unwrap();
        let (plain_path, compressed_path) = (dir.path().join("p.ndx"), dir.path().join("c.ndx"));
        let entries = || fps.iter().enumerate().map(|(i, &f)| (i as u64, f));
        let plain = AnyIndex::build(design.clone(), entries()).unwrap();
        bundle::write_bundle(&plain, &ids, Some(&config), std::fs::File::create(&plain_path).unwrap()).unwrap();
        let out = std::fs::File::create(&compressed_path).unwrap();
        match width {
            Width::W64 => {
                let c = CompressedIndex::build(design.clone(), words.iter().enumerate().map(|(i, &w)| (i as u64, w)), 64, Coding::EliasFano).unwrap();
                bundle::write_with(&ids, Some(&config), |e, s| c.write_to(e, s, out)).unwrap();
            }
            Width::W128 => {
                let c = CompressedIndex::build(design.clone(), fps.iter().enumerate().map(|(i, f)| (i as u64, f.value())), 64, Coding::EliasFano).unwrap();
                bundle::write_with(&ids, Some(&config), |e, s| c.write_to(e, s, out)).unwrap();
            }
        }
        let brute = |q: Fingerprint| -> Vec<Match> {
            let mut m: Vec<Match> = fps.iter().enumerate()
                .filter(|(_, f)| f.distance(q).unwrap() <= k)
                .map(|(i, f)| Match { distance: f.distance(q).unwrap(), id: i as u64 })
                .collect();
            m.sort_unstable();
            m
        };
        let mut pairs = Vec::new();
        for i in 0..fps.len() {
            for j in i + 1..fps.len() {
                let d = fps[i].distance(fps[j]).unwrap();
                if d <= k { pairs.push((i as u64, j as u64, d)); }
            }
        }
        let queries: Vec<Fingerprint> = (0..20).map(|i| fp(words[i % words.len()] ^ (1 << (rng.next() % 64)))).collect();
        for (path, compressed) in [(&plain_path, false), (&compressed_path, true)] {
            let b = Bundle::open(path).unwrap();
            prop_assert_eq!(b.index.is_compressed(), compressed);
            prop_assert_eq!(b.index.width(), width);
            prop_assert_eq!(b.index.len(), fps.len());
            prop_assert_eq!(b.config.as_ref(), Some(&config));
            prop_assert_eq!(b.ids.len(), fps.len());
            for &q in &queries {
                prop_assert_eq!(b.index.query(q, k).unwrap(), brute(q));
            }
            let batch = b.index.query_batch(&queries, k).unwrap();
            for (&q, got) in queries.iter().zip(&batch) {
                prop_assert_eq!(got, &brute(q));
            }
            let mut joined = b.index.self_join(k).unwrap();
            joined.iter_mut().for_each(|p| *p = (p.0.min(p.1), p.0.max(p.1), p.2));
            joined.sort_unstable();
            prop_assert_eq!(&joined, &pairs);
            let too_far = matches!(b.index.query(fp(0), k + 1), Err(Error::KTooLarge { .. }));
            prop_assert!(too_far);
            let other = match width { Width::W64 => Fingerprint::new(1, Width::W128), Width::W128 => Fingerprint::from_u64(1) };
            let mismatch = matches!(b.index.query(other, k), Err(Error::WidthMismatch { .. }));
            prop_assert!(mismatch);
        }
        // Changes: refused by compressed tables, kept by plain ones.
        let mut c = Bundle::open(&compressed_path).unwrap();
        prop_assert!(matches!(c.index.add(7, fp(1)), Err(Error::ReadOnly(_))));
        prop_assert!(matches!(c.index.delete(|_| true), Err(Error::ReadOnly(_))));
        let mut p = Bundle::open(&plain_path).unwrap();
        let fresh = fp(rng.next());
        p.index.add(fps.len() as u64, fresh).unwrap();
        p.ids.push_int(-1);
        prop_assert_eq!(p.index.delete(|id| id == 0).unwrap(), 1);
        p.save(&plain_path).unwrap();
        let again = Bundle::open(&plain_path).unwrap();
        prop_assert_eq!(again.index.len(), fps.len());
        prop_assert!(again.index.query(fresh, 0).unwrap().iter().any(|m| m.id == fps.len() as u64));
        prop_assert!(again.index.query(fps[0], 0).unwrap().iter().all(|m| m.id != 0));
    }
}

#[test]
fn bundle_open_names_the_path_of_a_missing_or_damaged_file() {
    use neardup_core::index::Bundle;
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.ndx");
    let e = Bundle::open(&missing).unwrap_err().to_string();
    assert!(e.contains("missing.ndx"), "{e}");
    let damaged = dir.path().join("damaged.ndx");
    std::fs::write(&damaged, b"not an index at all, just some bytes of text").unwrap();
    let e = Bundle::open(&damaged).unwrap_err();
    assert!(matches!(e, Error::CorruptIndex(_)), "{e}");
    assert!(e.to_string().contains("damaged.ndx"), "{e}");
}
