//! Fuzz targets for everything that parses input from outside: the append parser (JSON
//! array, `{"events"}` object, NDJSON), the append guard behind it, and the JSONL import
//! reader. A mutation fuzzer (bit flips, inserted and deleted bytes, spliced seeds, deep
//! nesting, huge numbers and strings, invalid UTF-8) runs each target for `FUZZ_SECS`
//! seconds (default 2, a smoke pass inside `cargo test`); a panic is a failure and
//! prints the input that caused it.
//!
//!     FUZZ_SECS=60 cargo test --release --test fuzz -- --nocapture --test-threads 1
//!
//! (`cargo fuzz` needs a nightly toolchain, which these machines do not have; this is
//! the same idea on stable, seeded from valid generated runs.)

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use agent_stream::domain::input::parse_batch;
use agent_stream::domain::jsonl::parse_export;
use agent_stream::domain::{Framing, Limits, Origin, RunGuard};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn budget() -> Duration {
    let secs: f64 = std::env::var("FUZZ_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(2.0);
    Duration::from_secs_f64(secs)
}

/// Valid inputs to mutate: generated runs as event lines.
fn seeds() -> Vec<Vec<u8>> {
    (0..12u64)
        .flat_map(|s| agent_stream_core::testkit::generated_run_mix(s, 40, 40))
        .map(|v| serde_json::to_vec(&v).expect("json"))
        .collect()
}

const TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b":",
    b",",
    b"null",
    b"true",
    b"1e999999",
    b"-9223372036854775809",
    b"18446744073709551616",
    b"\\u0000",
    b"\\ud800",
    b"\xff\xfe",
    b"\xc3\x28",
    b"\"type\"",
    b"\"payload\"",
    b"\"seq\"",
    b"\"ts\"",
    b"\"child_id\"",
    b"\"key\"",
    b"\"text.delta\"",
    b"\"tool.end\"",
    b"\"run.lifecycle\"",
    b"\"custom.x\"",
    b"\n",
    b"\r\n",
    b"\"events\"",
    b"\"expected_last_seq\"",
];

fn mutate(rng: &mut StdRng, seeds: &[Vec<u8>], input: &mut Vec<u8>) {
    for _ in 0..rng.gen_range(1..6) {
        let len = input.len();
        match rng.gen_range(0..9) {
            0 if len > 0 => {
                let i = rng.gen_range(0..len);
                input[i] ^= 1 << rng.gen_range(0..8);
            }
            1 => {
                let i = rng.gen_range(0..=len);
                input.insert(i, rng.gen());
            }
            2 if len > 1 => {
                let a = rng.gen_range(0..len);
                let b = (a + rng.gen_range(1..16)).min(len);
                input.drain(a..b);
            }
            3 => {
                let t = TOKENS[rng.gen_range(0..TOKENS.len())];
                let i = rng.gen_range(0..=len);
                input.splice(i..i, t.iter().copied());
            }
            4 => {
                let other = &seeds[rng.gen_range(0..seeds.len())];
                let i = rng.gen_range(0..=len);
                let j = rng.gen_range(0..=other.len());
                input.truncate(i);
                input.extend_from_slice(&other[j..]);
            }
            5 => {
                let depth = rng.gen_range(10..3000);
                let i = rng.gen_range(0..=len);
                let open = if rng.gen() { b'[' } else { b'{' };
                input.splice(i..i, std::iter::repeat_n(open, depth));
            }
            6 => {
                let i = rng.gen_range(0..=len);
                let n = rng.gen_range(1..200_000);
                input.splice(i..i, std::iter::repeat_n(b'a', n));
            }
            7 if len > 0 => {
                let i = rng.gen_range(0..len);
                input.truncate(i);
            }
            _ => {
                let other = &seeds[rng.gen_range(0..seeds.len())];
                input.push(b'\n');
                input.extend_from_slice(other);
            }
        }
    }
}

/// Runs `target` on mutated inputs for the budget; panics with the input on a panic.
fn fuzz(name: &str, wrap: fn(&[Vec<u8>], &mut StdRng) -> Vec<u8>, target: impl Fn(&[u8])) {
    let seeds = seeds();
    let seed: u64 = std::env::var("FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    let mut rng = StdRng::seed_from_u64(seed);
    let started = Instant::now();
    let mut runs = 0u64;
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    while started.elapsed() < budget() {
        let mut input = wrap(&seeds, &mut rng);
        mutate(&mut rng, &seeds, &mut input);
        if catch_unwind(AssertUnwindSafe(|| target(&input))).is_err() {
            std::panic::set_hook(hook);
            panic!(
                "{name}: panic on input (FUZZ_SEED={seed}, run {runs}): {:?}",
                String::from_utf8_lossy(&input)
            );
        }
        runs += 1;
    }
    std::panic::set_hook(hook);
    eprintln!("{name}: {runs} inputs in {:.1?}, no panic (FUZZ_SEED={seed})", started.elapsed());
    assert!(runs > 0);
}

fn array_of_seeds(seeds: &[Vec<u8>], rng: &mut StdRng) -> Vec<u8> {
    let n = rng.gen_range(1..20);
    let start = rng.gen_range(0..seeds.len());
    let items: Vec<&[u8]> = seeds.iter().cycle().skip(start).take(n).map(Vec::as_slice).collect();
    [b"[".as_slice(), &items.join(&b","[..]), b"]"].concat()
}

fn ndjson_of_seeds(seeds: &[Vec<u8>], rng: &mut StdRng) -> Vec<u8> {
    let n = rng.gen_range(1..20);
    let start = rng.gen_range(0..seeds.len());
    seeds.iter().cycle().skip(start).take(n).map(Vec::as_slice).collect::<Vec<_>>().join(&b"\n"[..])
}

#[test]
fn fuzz_append_parser_and_guard() {
    let limits = Limits::default();
    fuzz("append JSON", array_of_seeds, |input| {
        for framing in [Framing::Json, Framing::Ndjson] {
            if let Ok(batch) = parse_batch(input, framing, limits) {
                // Whatever parses must go through the guard without panicking too.
                let mut g = RunGuard::default();
                for (i, e) in batch.events.iter().enumerate() {
                    let _ = g.apply(i as i64 + 1, e.child_id.as_deref(), &e.body, Origin::Producer);
                }
            }
        }
    });
}

#[test]
fn fuzz_ndjson_append_parser() {
    fuzz("append NDJSON", ndjson_of_seeds, |input| {
        let _ = parse_batch(input, Framing::Ndjson, Limits::default());
    });
}

#[test]
fn fuzz_jsonl_import_reader() {
    fn export_lines(seeds: &[Vec<u8>], rng: &mut StdRng) -> Vec<u8> {
        let n = rng.gen_range(1..20);
        let start = rng.gen_range(0..seeds.len());
        let lines: Vec<Vec<u8>> = seeds
            .iter()
            .cycle()
            .skip(start)
            .take(n)
            .enumerate()
            .map(|(i, s)| {
                let mut v: serde_json::Value = serde_json::from_slice(s).expect("seed");
                v["seq"] = (i + 1).into();
                v["ts"] = "2026-01-01T00:00:00.000Z".into();
                serde_json::to_vec(&v).expect("json")
            })
            .collect();
        lines.join(&b"\n"[..])
    }
    fuzz("import JSONL", export_lines, |input| {
        let _ = parse_export(input, Limits::default());
    });
}
