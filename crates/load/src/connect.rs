//! `connect`: what a connection costs the server apart from its requests.
//!
//! 20,000 connections one after another, each opened, asked one `GET /healthz` and
//! closed (a producer that does not keep its connection, a reconnect storm); baseline,
//! in the same run: the same 20,000 requests on one kept-alive connection. Reported: the
//! server's CPU per request each way, and their ratio. Sequential on purpose: the cost
//! of a connection is read without the queueing of a burst (`fanout` and `many-runs`
//! open theirs in bursts).

use std::path::Path;
use std::time::Instant;

use super::http::Conn;
use super::support;

/// Requests per pass: enough that the server's CPU time, read in clock ticks (10 ms),
/// is known to 2%.
const REQUESTS: usize = 20_000;

/// Server CPU seconds and wall seconds for `n` health checks, a connection each
/// (`fresh`) or all on one.
async fn pass(server: &support::Server, fresh: bool, n: usize) -> (f64, f64) {
    // The kept-alive pass's connection is opened before the clock starts.
    let mut kept = if fresh { None } else { Some(Conn::open(&server.base).await.expect("connect")) };
    let (cpu0, t0) = (support::cpu_secs(server.pid), Instant::now());
    for _ in 0..n {
        let mut opened;
        let c = match kept.as_mut() {
            Some(c) => c,
            None => {
                opened = Conn::open(&server.base).await.expect("connect");
                &mut opened
            }
        };
        let r = c.get("/healthz", None).await.expect("healthz");
        assert!(r.status.is_success(), "healthz: {}", r.status);
    }
    (support::cpu_secs(server.pid) - cpu0, t0.elapsed().as_secs_f64())
}

/// Runs the scenario against `schema` of `url`, measuring `bin serve`.
pub async fn run(bin: &Path, url: &str, schema: &str) {
    let server = support::serve(bin, url, schema, &["--retention-interval", "0"]).await;
    // Warm-up: the first connections fill the allocator's and the kernel's caches.
    let _ = pass(&server, true, REQUESTS / 4).await;
    let (kept_cpu, kept_wall) = pass(&server, false, REQUESTS).await;
    let (fresh_cpu, fresh_wall) = pass(&server, true, REQUESTS).await;
    let per = |cpu: f64| cpu / REQUESTS as f64 * 1e6;
    println!("| {REQUESTS} × `GET /healthz`, one after another | requests/s | server CPU per request (µs) |");
    println!("|---|---|---|");
    println!(
        "| on one kept-alive connection (baseline) | {:.0} | {:.1} |",
        REQUESTS as f64 / kept_wall,
        per(kept_cpu)
    );
    println!("| a connection each | {:.0} | {:.1} |", REQUESTS as f64 / fresh_wall, per(fresh_cpu));
    println!(
        "a connection costs the server {:.1} µs beyond its request: {:.2}× a kept-alive request",
        per(fresh_cpu) - per(kept_cpu),
        fresh_cpu / kept_cpu.max(f64::MIN_POSITIVE)
    );
}
