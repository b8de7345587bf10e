//! Pieces the benches share: a separate `agent-stream serve` process to measure, its
//! `/proc` readings, and percentiles. Each bench uses some of them.
#![allow(dead_code)]

use std::time::Duration;

/// A release `agent-stream serve` on a free port over `schema` of `url`.
pub struct Server {
    /// The process (killed on drop).
    pub child: tokio::process::Child,
    /// Its pid.
    pub pid: u32,
    /// `http://127.0.0.1:<port>`
    pub base: String,
}

/// Starts the server with `extra` flags and waits until it answers `/healthz`.
pub async fn serve(url: &str, schema: &str, extra: &[&str]) -> Server {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port");
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agent-stream"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--schema", schema])
        .args(extra)
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("serve");
    let pid = child.id().expect("pid");
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    for _ in 0..200 {
        if http.get(format!("{base}/healthz")).send().await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Server { child, pid, base }
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS:`, `VmHWM:`), in KiB.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The `p` quantile of `v` (sorted in place); NaN when empty.
pub fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}
