//! `export`: JSONL export of a 1,000,000-event run over HTTP by a separate
//! `agent-stream serve` process, against `psql -c "COPY (SELECT row_to_json(e) ...) TO
//! STDOUT"` over the same rows, both best of 3 in the same run.
//!
//! Reported: bytes/s of each and their ratio, and the server's resident memory before
//! and at its peak (VmHWM) while it streams. `EXPORT_EVENTS=200000` for a quicker run.
//! Needs `psql` on the PATH.

use std::path::Path;
use std::time::{Duration, Instant};

use agent_stream::auth::Scope;
use agent_stream::storage::{db, tenants};
use http_body_util::BodyExt;

use super::http::Conn;
use super::support;

/// Runs the scenario in `schema` and prints its table.
pub async fn run(bin: &Path, url: &str, schema: &str) {
    let n: i64 = std::env::var("EXPORT_EVENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    let mut owner = db::connect_owner(url, schema).await.expect("owner");
    let key =
        tenants::create_tenant(&mut owner, "bench", &[Scope::Read, Scope::Write]).await.expect("tenant");
    let run = ulid::Ulid::new().to_string();
    let started = Instant::now();
    owner
        .execute(
            "INSERT INTO runs (tenant_id, run_id, root_run_id, state) VALUES ($1, $2, $2, 'running')",
            &[&key.tenant_id, &run],
        )
        .await
        .expect("run");
    // ~100-byte text deltas, ids in ULID form, one millisecond apart.
    owner
        .execute(
            "INSERT INTO agent_run_events (tenant_id, run_id, seq, id, ts, type, payload)
             SELECT $1, $2, g, lpad(g::text, 26, '0'), now() + g * interval '1 millisecond', 'text.delta',
                    jsonb_build_object('text', 'token ' || g || ' ' || repeat('lorem ipsum ', 7))
             FROM generate_series(1, $3::bigint) g",
            &[&key.tenant_id, &run, &n],
        )
        .await
        .expect("rows");
    owner.batch_execute("ANALYZE agent_run_events").await.expect("analyze");
    eprintln!("stored {n} events in {:.1?}", started.elapsed());

    // The baseline: psql COPY of the same rows as JSON, bytes counted off its stdout.
    let copy = format!(
        "COPY (SELECT row_to_json(e) FROM \"{schema}\".agent_run_events e WHERE tenant_id = '{}' AND run_id = '{run}' ORDER BY seq) TO STDOUT",
        key.tenant_id
    );
    let mut best_copy = (0u64, Duration::MAX);
    let mut best_ours = (0u64, Duration::MAX);
    let mut server = support::serve(bin, url, schema, &[]).await;
    let (pid, base) = (server.pid, server.base.clone());
    let mut http = Conn::open(&base).await.expect("connect");
    let rss_before = support::status_kib(pid, "VmRSS:");
    for _ in 0..3 {
        let t = Instant::now();
        let out = std::process::Command::new("psql")
            .arg(url)
            .args(["-X", "-q", "-c", &copy])
            .stdout(std::process::Stdio::piped())
            .output()
            .expect("psql");
        let took = t.elapsed();
        assert!(out.status.success(), "psql: {}", String::from_utf8_lossy(&out.stderr));
        if took < best_copy.1 {
            best_copy = (out.stdout.len() as u64, took);
        }

        let t = Instant::now();
        let path = format!("/v1/runs/{run}/events.jsonl");
        let r = http.start(hyper::Method::GET, &path, Some(&key.secret), None).await.expect("export");
        assert!(r.status().is_success(), "{}", r.status());
        let mut body = r.into_body();
        let (mut bytes, mut lines) = (0u64, 0u64);
        while let Some(frame) = body.frame().await {
            if let Ok(chunk) = frame.expect("chunk").into_data() {
                bytes += chunk.len() as u64;
                lines += chunk.iter().filter(|b| **b == b'\n').count() as u64;
            }
        }
        let took = t.elapsed();
        assert_eq!(lines as i64, n + 1, "one line per event, and the end line");
        if took < best_ours.1 {
            best_ours = (bytes, took);
        }
    }
    let peak = support::status_kib(pid, "VmHWM:");
    let _ = server.child.kill().await;
    let rate = |(b, t): (u64, Duration)| b as f64 / t.as_secs_f64() / 1e6;
    println!("| export of {n} events (best of 3) | bytes | time | MB/s |");
    println!("|---|---|---|---|");
    println!(
        "| psql COPY row_to_json (baseline) | {} | {:.2?} | {:.1} |",
        best_copy.0,
        best_copy.1,
        rate(best_copy)
    );
    println!(
        "| GET /v1/runs/{{id}}/events.jsonl | {} | {:.2?} | {:.1} |",
        best_ours.0,
        best_ours.1,
        rate(best_ours)
    );
    println!("ratio (ours / COPY, bytes per second): {:.2}", rate(best_ours) / rate(best_copy));
    println!(
        "server RSS: {:.1} MiB before, peak {:.1} MiB while exporting {:.0} MB three times",
        rss_before as f64 / 1024.0,
        peak as f64 / 1024.0,
        best_ours.0 as f64 / 1e6
    );
}
