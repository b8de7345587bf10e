//! The run command with DATABASE_URL unset: the real binary starts a private cluster,
//! serves, and stops the cluster on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

#[tokio::test]
async fn serve_without_database_url_uses_a_private_cluster() {
    if agent_stream::storage::embedded::find_bin_dir().is_err() {
        eprintln!("skipping: no PostgreSQL server binaries on this machine");
        return;
    }
    // Under /tmp so the unprivileged cluster user can reach it when we run as root.
    let dir = std::env::temp_dir().join(format!("agent-stream-embedded-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_agent-stream"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(&dir)
        .env_remove("DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn agent-stream");
    let stdout = child.stdout.take().unwrap();
    let lines = tokio::task::spawn_blocking(move || {
        let mut seen = vec![];
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap_or_default();
            let done = line.contains("listening on");
            seen.push(line);
            if done {
                break;
            }
        }
        seen
    });
    let lines = tokio::time::timeout(Duration::from_secs(120), lines).await.expect("server start").unwrap();
    let key = lines.iter().find(|l| l.starts_with("ask_")).expect("dev key printed").clone();
    assert_eq!(std::fs::read_to_string(dir.join("dev-key")).unwrap().trim(), key);

    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let run: Value =
        http.post(format!("{base}/v1/runs")).bearer_auth(&key).send().await.unwrap().json().await.unwrap();
    let run = run["run_id"].as_str().unwrap().to_owned();
    let r = http
        .post(format!("{base}/v1/runs/{run}/events"))
        .bearer_auth(&key)
        .json(&json!([{"type": "run.lifecycle", "payload": {"state": "running"}}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "clean exit: {status:?}");
    assert!(!dir.join("pg/postmaster.pid").exists(), "the private cluster was stopped");
    let _ = std::fs::remove_dir_all(&dir);
}
