//! Measures the two embedded storage engines considered for `neardup serve`,
//! on its own workload: durable batched inserts of (id -> fingerprint + small
//! metadata), point reads, and a full scan at start-up.
//!
//! cargo run --release -- [N]   (default N = 1,000,000)

use std::time::Instant;

use fjall::{Database, KeyspaceCreateOptions, PersistMode};
use redb::{ReadableDatabase, ReadableTable, TableDefinition};

const DOCS: TableDefinition<&str, &[u8]> = TableDefinition::new("docs");

fn record(i: u64) -> (String, Vec<u8>) {
    let id = format!("https://example.com/page/{i}");
    let mut v = (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) as u128).to_le_bytes().to_vec();
    v.extend_from_slice(br#"{"title":"a page"}"#);
    (id, v)
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("N"))
        .unwrap_or(1_000_000);
    println!("workload: {n} documents, 16-byte fingerprint + 18-byte metadata, ids ~30 bytes");
    for batch in [1u64, 100, 1000] {
        let commits = if batch == 1 { 300 } else { (n / batch).min(2000) };
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("r.redb")).unwrap();
        let t = Instant::now();
        for c in 0..commits {
            let tx = db.begin_write().unwrap();
            {
                let mut table = tx.open_table(DOCS).unwrap();
                for i in c * batch..(c + 1) * batch {
                    let (k, v) = record(i);
                    table.insert(k.as_str(), v.as_slice()).unwrap();
                }
            }
            tx.commit().unwrap();
        }
        let redb_rate = (commits * batch) as f64 / t.elapsed().as_secs_f64();

        let dir = tempfile::tempdir().unwrap();
        let db = Database::builder(dir.path()).open().unwrap();
        let ks = db.keyspace("docs", KeyspaceCreateOptions::default).unwrap();
        let t = Instant::now();
        for c in 0..commits {
            let mut b = db.batch().durability(Some(PersistMode::SyncAll));
            for i in c * batch..(c + 1) * batch {
                let (k, v) = record(i);
                b.insert(&ks, k, v);
            }
            b.commit().unwrap();
        }
        let fjall_rate = (commits * batch) as f64 / t.elapsed().as_secs_f64();
        println!(
            "durable inserts, {batch:>4} per commit: redb {redb_rate:>9.0}/s   fjall {fjall_rate:>9.0}/s"
        );
    }

    // Load N, then time a full scan (the start-up path) and point reads.
    let dir = tempfile::tempdir().unwrap();
    let rdb = redb::Database::create(dir.path().join("r.redb")).unwrap();
    let t = Instant::now();
    for c in 0..n.div_ceil(100_000) {
        let tx = rdb.begin_write().unwrap();
        {
            let mut table = tx.open_table(DOCS).unwrap();
            for i in c * 100_000..((c + 1) * 100_000).min(n) {
                let (k, v) = record(i);
                table.insert(k.as_str(), v.as_slice()).unwrap();
            }
        }
        tx.commit().unwrap();
    }
    let redb_load = t.elapsed().as_secs_f64();
    let fdir = tempfile::tempdir().unwrap();
    let fdb = Database::builder(fdir.path()).open().unwrap();
    let ks = fdb.keyspace("docs", KeyspaceCreateOptions::default).unwrap();
    let t = Instant::now();
    for c in 0..n.div_ceil(100_000) {
        let mut b = fdb.batch();
        for i in c * 100_000..((c + 1) * 100_000).min(n) {
            let (k, v) = record(i);
            b.insert(&ks, k, v);
        }
        b.commit().unwrap();
    }
    fdb.persist(PersistMode::SyncAll).unwrap();
    let fjall_load = t.elapsed().as_secs_f64();
    println!("bulk load of {n}: redb {redb_load:.2} s   fjall {fjall_load:.2} s");

    let t = Instant::now();
    let tx = rdb.begin_read().unwrap();
    let table = tx.open_table(DOCS).unwrap();
    let mut sum = 0u64;
    for e in table.iter().unwrap() {
        let (_, v) = e.unwrap();
        sum = sum.wrapping_add(v.value()[0] as u64);
    }
    let redb_scan = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut sum2 = 0u64;
    for kv in ks.iter() {
        let v = kv.value().unwrap();
        sum2 = sum2.wrapping_add(v[0] as u64);
    }
    let fjall_scan = t.elapsed().as_secs_f64();
    assert_eq!(sum, sum2);
    println!("full scan of {n}: redb {redb_scan:.2} s   fjall {fjall_scan:.2} s");

    let t = Instant::now();
    for i in (0..n).step_by(7).take(200_000) {
        let (k, _) = record(i);
        assert!(table.get(k.as_str()).unwrap().is_some());
    }
    let redb_get = t.elapsed().as_secs_f64() / 200_000f64.min(n as f64 / 7.0) * 1e6;
    let t = Instant::now();
    for i in (0..n).step_by(7).take(200_000) {
        let (k, _) = record(i);
        assert!(ks.get(k).unwrap().is_some());
    }
    let fjall_get = t.elapsed().as_secs_f64() / 200_000f64.min(n as f64 / 7.0) * 1e6;
    println!("point read: redb {redb_get:.2} µs   fjall {fjall_get:.2} µs");
    let size = |p: &std::path::Path| -> u64 {
        walk(p)
    };
    fn walk(p: &std::path::Path) -> u64 {
        if p.is_file() {
            return p.metadata().map(|m| m.len()).unwrap_or(0);
        }
        std::fs::read_dir(p)
            .map(|d| d.flatten().map(|e| walk(&e.path())).sum())
            .unwrap_or(0)
    }
    println!(
        "disk: redb {:.0} MB   fjall {:.0} MB",
        size(dir.path()) as f64 / 1e6,
        size(fdir.path()) as f64 / 1e6
    );
}
