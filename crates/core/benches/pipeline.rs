//! Micro-benchmarks of the fingerprint pipeline's stages, on English prose.
//! `cargo bench -p neardup-core`; the end-to-end figures come from
//! `neardup bench fingerprint`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use neardup_core::normalize::normalize_into;
use neardup_core::tokenize::{for_each_token, words};
use neardup_core::{Features, FingerprintConfig, NormalizeConfig, SimHasher, Tokenizer};

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

criterion_group!(benches, stages);
criterion_main!(benches);
