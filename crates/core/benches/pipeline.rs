//! Micro-benchmarks of the fingerprint pipeline's stages, on English prose,
//! and of the service's reading of a text, on the evaluation sample's English
//! and Chinese documents. `cargo bench -p neardup-core --bench pipeline`; the
//! end-to-end figures come from `neardup bench fingerprint` and `neardup
//! bench serve`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use neardup_core::jaccard::shingles_for;
use neardup_core::normalize::normalize_into;
use neardup_core::sketch::Signature;
use neardup_core::tokenize::{for_each_token, words};
use neardup_core::{Features, FingerprintConfig, NormalizeConfig, SimHasher, Tokenizer, Width};

/// English prose: the sample corpus shipped with the repository, repeated.
fn english() -> String {
    let sample = include_str!("../../../examples/sample.jsonl");
    let mut text = String::new();
    for line in sample.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("sample is JSON Lines");
        if let Some(t) = v["text"].as_str()
            && t.is_ascii()
        {
            text.push_str(t);
            text.push('\n');
        }
    }
    text.repeat((1 << 20) / text.len().max(1) + 1)
}

fn stages(c: &mut Criterion) {
    let text = english();
    let mut g = c.benchmark_group("english");
    g.throughput(Throughput::Bytes(text.len() as u64));
    let (mut out, mut tmp) = (String::new(), String::new());
    g.bench_function("normalize", |b| {
        b.iter(|| normalize_into(&NormalizeConfig::default(), &text, &mut out, &mut tmp))
    });
    normalize_into(&NormalizeConfig::default(), &text, &mut out, &mut tmp);
    g.bench_function("tokenize words", |b| {
        b.iter(|| {
            let mut n = 0usize;
            words(&out, &mut |w| n += w.len());
            n
        })
    });
    g.bench_function("tokenize auto", |b| {
        b.iter(|| {
            let mut n = 0usize;
            for_each_token(Tokenizer::Auto, &out, &mut |w| n += w.len());
            n
        })
    });
    for (name, features) in [
        ("tokens", Features::Tokens),
        ("3-shingles", Features::Shingles(3)),
    ] {
        let h = SimHasher::new(FingerprintConfig {
            tokenizer: Tokenizer::Words,
            features,
            ..Default::default()
        })
        .expect("valid config");
        g.bench_function(format!("fingerprint {name}"), |b| {
            b.iter(|| h.fingerprint(&text))
        });
    }
    g.finish();
}

/// The evaluation sample's documents of `lang`, as `neardup bench serve`
/// reads them.
fn sample(lang: &str) -> Vec<String> {
    let path = format!(
        "{}/../../evalkit/data/{lang}/corpus.jsonl",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("the sample is JSON Lines");
            v["text"].as_str().expect("a text field").to_owned()
        })
        .collect()
}

/// What the service makes of a text (the default collection's 128-bit
/// fingerprint of single tokens, its bit shares, and its signature):
/// the shingles read apart from the fingerprint (a collection of store
/// version 7) against one reading for both (version 8).
fn service(c: &mut Criterion) {
    let h = SimHasher::new(FingerprintConfig {
        bits: Width::W128,
        features: Features::Tokens,
        ..Default::default()
    })
    .expect("valid config");
    let normalize = NormalizeConfig::default();
    for lang in ["en", "zh"] {
        let docs = sample(lang);
        let mut g = c.benchmark_group(format!("service reading {lang}"));
        g.throughput(Throughput::Bytes(docs.iter().map(|d| d.len() as u64).sum()));
        g.bench_function("fingerprint, then shingles apart", |b| {
            b.iter(|| {
                docs.iter()
                    .map(|d| {
                        let (fp, shares) = h.fingerprint_and_shares(d);
                        let s = Signature::of(&shingles_for(d, &normalize));
                        (fp, shares, s)
                    })
                    .count()
            })
        });
        let mut shingles = Vec::new();
        g.bench_function("one reading", |b| {
            b.iter(|| {
                docs.iter()
                    .map(|d| {
                        let (fp, shares) = h.fingerprint_shares_and_shingles(d, &mut shingles);
                        (fp, shares, Signature::of(&shingles))
                    })
                    .count()
            })
        });
        g.finish();
    }
}

criterion_group!(benches, stages, service);
criterion_main!(benches);
