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

/// Reads SSE frames' ids off a run's stream, reconnecting after `Last-Event-ID` as
/// EventSource does when the stream ends or breaks, until `want` ids have arrived.
async fn follow(http: reqwest::Client, base: String, key: String, run: String, want: usize) -> Vec<i64> {
    use futures::StreamExt;
    let mut ids: Vec<i64> = vec![];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while ids.len() < want && tokio::time::Instant::now() < deadline {
        let mut req = http.get(format!("{base}/v1/runs/{run}/stream?detail=full")).bearer_auth(&key);
        if let Some(last) = ids.last() {
            req = req.header("Last-Event-ID", last.to_string());
        }
        let Ok(r) = req.send().await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        if r.status() != 200 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        let mut body = r.bytes_stream();
        let mut buf = String::new();
        while let Ok(Some(Ok(chunk))) = tokio::time::timeout_at(deadline, body.next()).await {
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buf.find("\n\n") {
                let frame: String = buf.drain(..end + 2).collect();
                if let Some(id) = frame.lines().find_map(|l| l.strip_prefix("id: ")?.trim().parse().ok()) {
                    ids.push(id);
                }
            }
            if ids.len() >= want {
                break;
            }
        }
    }
    ids
}

/// The embedded default's PostgreSQL killed (SIGKILL to the postmaster) while a
/// producer appends and a subscriber follows: the service says so in its log, starts
/// it again, `/readyz` answers 503 meanwhile, appends resume (retried with their
/// idempotency keys, as the 503 asks), and the subscriber gets every event once.
#[tokio::test]
async fn the_embedded_postgres_is_restarted_when_it_dies_and_nothing_is_lost() {
    assert!(
        agent_stream::storage::embedded::find_bin_dir().is_ok(),
        "this test needs the PostgreSQL server binaries (initdb, pg_ctl, postgres)"
    );
    let dir = std::env::temp_dir().join(format!("agent-stream-supervised-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let log_path = std::env::temp_dir().join(format!("agent-stream-supervised-{}.log", std::process::id()));
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_agent-stream"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--retention-interval", "0", "--data-dir"])
        .arg(&dir)
        .env_remove("DATABASE_URL")
        .env("AGENT_STREAM_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log_path).expect("log file"))
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
    let http = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let run: Value =
        http.post(format!("{base}/v1/runs")).bearer_auth(&key).send().await.unwrap().json().await.unwrap();
    let run = run["run_id"].as_str().unwrap().to_owned();

    const N: usize = 60;
    let subscriber = tokio::spawn(follow(http.clone(), base.clone(), key.clone(), run.clone(), N));
    let pid_file = dir.join("pg/postmaster.pid");
    let postmaster = || -> i32 {
        let text = std::fs::read_to_string(&pid_file).unwrap_or_default();
        text.lines().next().and_then(|l| l.trim().parse().ok()).unwrap_or(0)
    };
    let first_pid = postmaster();
    assert!(first_pid > 0, "the private cluster is running");
    let (mut seqs, mut refused, mut readiness) = (vec![], 0, vec![]);
    let mut watcher = None;
    for i in 1..=N {
        if i == N / 3 {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(first_pid), nix::sys::signal::Signal::SIGKILL)
                .expect("kill the postmaster");
            // Readiness, sampled until it is back.
            let (http, base) = (http.clone(), base.clone());
            watcher = Some(tokio::spawn(async move {
                let mut seen = vec![];
                let until = tokio::time::Instant::now() + Duration::from_secs(60);
                while tokio::time::Instant::now() < until {
                    let s = http
                        .get(format!("{base}/readyz"))
                        .send()
                        .await
                        .map(|r| r.status().as_u16())
                        .unwrap_or(0);
                    seen.push(s);
                    if s == 200 && seen.contains(&503) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                seen
            }));
        }
        let body =
            json!([{"type": "text.delta", "payload": {"text": format!("{i} ")}, "key": format!("k{i}")}]);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let r =
                http.post(format!("{base}/v1/runs/{run}/events")).bearer_auth(&key).json(&body).send().await;
            match r {
                Ok(r) if r.status().is_success() => {
                    let v: Value = r.json().await.unwrap();
                    seqs.push(v["first_seq"].as_i64().unwrap());
                    break;
                }
                Ok(r) => assert_eq!(r.status(), 503, "only 503 while the database is away"),
                Err(_) => {}
            }
            refused += 1;
            assert!(tokio::time::Instant::now() < deadline, "append {i} was not taken within 60 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    if let Some(w) = watcher {
        readiness = w.await.unwrap();
    }
    let received =
        tokio::time::timeout(Duration::from_secs(130), subscriber).await.expect("subscriber").unwrap();
    let second_pid = postmaster();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait()).await.unwrap().unwrap();
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let _ = std::fs::remove_file(&log_path);
    eprintln!(
        "postmaster {first_pid} killed after {} appends; {refused} attempts refused meanwhile; readyz {:?}; \
         restarted as {second_pid}; subscriber received {} events",
        N / 3 - 1,
        readiness.iter().fold(vec![], |mut runs: Vec<(u16, usize)>, s| {
            match runs.last_mut() {
                Some((last, n)) if last == s => *n += 1,
                _ => runs.push((*s, 1)),
            }
            runs
        }),
        received.len()
    );
    for line in log.lines().filter(|l| l.contains("embedded PostgreSQL") || l.contains("WARN")) {
        eprintln!("log: {line}");
    }
    let expected: Vec<i64> = (1..=N as i64).collect();
    assert_eq!(seqs, expected, "every append taken once, in order");
    assert_eq!(received, expected, "the subscriber got every event once, in order");
    assert!(readiness.contains(&503), "readyz said the database was down: {readiness:?}");
    assert_eq!(readiness.last(), Some(&200), "and then ready again: {readiness:?}");
    assert!(second_pid > 0 && second_pid != first_pid, "a new postmaster: {first_pid} -> {second_pid}");
    assert!(
        log.contains("stopped (exit status: signal: 9 (SIGKILL)); restarting it"),
        "the log says what happened:\n{log}"
    );
    assert!(log.contains("the embedded PostgreSQL restarted after"), "and that it is back:\n{log}");
    assert!(status.success(), "clean exit: {status:?}");
    assert!(!pid_file.exists(), "the private cluster was stopped with the service");
    let _ = std::fs::remove_dir_all(&dir);
}
