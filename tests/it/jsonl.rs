//! JSONL export and import, replay, and the dialects over real streams: round trips,
//! line-numbered refusals that write nothing, ranges, tenant walls, pacing, and the
//! official AG-UI and AI SDK packages reading our agui and vercel streams.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::TestApp;

/// A generated run (children, tools, plans, compaction, deltas) that ends `done`.
async fn finished_run(t: &TestApp, seed: u64, steps: usize) -> String {
    let events = agent_stream_core::testkit::generated_run_mix(seed, steps, 40);
    finished_run_of(t, &events).await
}

/// A finished run of `events` (ended with `done` if they do not end it).
async fn finished_run_of(t: &TestApp, events: &[Value]) -> String {
    let run = t.create_run(&t.key_a).await;
    for chunk in events.chunks(25) {
        t.append_ok(&t.key_a, &run, Value::Array(chunk.to_vec())).await;
    }
    let state = t.get_json(&t.key_a, &format!("/v1/runs/{run}")).await["state"].clone();
    if !matches!(state.as_str(), Some("done" | "aborted" | "error")) {
        if state != "running" {
            t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}]))
                .await;
        }
        t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "done"}}])).await;
    }
    run
}

async fn get_text(t: &TestApp, key: &str, path: &str) -> (StatusCode, String) {
    t.get_text(key, path).await
}

async fn import(t: &TestApp, key: &str, body: String) -> (StatusCode, Value) {
    let r = t
        .http
        .post(format!("{}/v1/runs/import", t.base))
        .bearer_auth(key)
        .header("content-type", "application/x-ndjson")
        .body(body)
        .send()
        .await
        .expect("send");
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The event lines of a native export, after checking that it ends with its end line
/// and that the end line counts them.
fn events_of(jsonl: &str) -> Vec<Value> {
    let mut lines: Vec<Value> =
        jsonl.lines().map(|l| serde_json::from_str(l).expect("line is JSON")).collect();
    let end = lines.pop().expect("an export has at least its end line");
    let count = end["export_end"]["lines"].as_u64();
    assert_eq!(count, Some(lines.len() as u64), "the end line counts the event lines: {end}");
    assert!(lines.iter().all(|l| l.get("export_end").is_none()), "one end line, last");
    lines
}

/// Event lines with the ids that differ between a run and its import taken out.
fn without_ids(jsonl: &str) -> Vec<Value> {
    let n = events_of(jsonl).len();
    jsonl
        .lines()
        .take(n)
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).expect("line is JSON");
            let m = v.as_object_mut().expect("object");
            assert!(m.remove("id").is_some() && m.remove("run_id").is_some(), "envelope has id and run_id");
            v
        })
        .collect()
}

async fn run_count(t: &TestApp) -> i64 {
    t.count_rows("runs").await
}

#[tokio::test]
async fn export_import_export_gives_the_same_lines_and_the_same_view() {
    let t = TestApp::new().await;
    let run = finished_run(&t, 5, 300).await;
    let (status, first) = get_text(&t, &t.key_a, &format!("/v1/runs/{run}/events.jsonl")).await;
    assert_eq!(status, StatusCode::OK);
    let n = events_of(&first).len() as i64;
    assert_eq!(n, t.stored_count(&t.tenant_a, &run).await, "one line per stored event");
    let (status, created) = import(&t, &t.key_a, first.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let copy = created["run_id"].as_str().expect("run id").to_owned();
    assert_ne!(copy, run);
    assert_eq!(created["last_seq"], json!(n));
    let (_, second) = get_text(&t, &t.key_a, &format!("/v1/runs/{copy}/events.jsonl")).await;
    assert_eq!(without_ids(&first), without_ids(&second), "same types, payloads, seqs and times");
    let view = |r: String| {
        let t = &t;
        async move { t.get_json(&t.key_a, &format!("/v1/runs/{r}/view")).await }
    };
    assert_eq!(view(run.clone()).await, view(copy.clone()).await, "the imported run folds to the same views");
    // The imported run is finished: nothing more can be appended.
    let (status, _) =
        t.append(&t.key_a, &copy, &json!([{"type": "text.delta", "payload": {"text": "x"}}])).await;
    assert_eq!(status, StatusCode::CONFLICT);
}

#[tokio::test]
async fn a_bad_line_is_refused_with_its_number_and_nothing_is_written() {
    let t = TestApp::new().await;
    let run = finished_run(&t, 9, 80).await;
    let (_, jsonl) = get_text(&t, &t.key_a, &format!("/v1/runs/{run}/events.jsonl")).await;
    let lines: Vec<&str> = jsonl.lines().collect();
    let before = run_count(&t).await;
    let rows_before = t.count_rows("agent_run_events").await;
    let with_line = |i: usize, replacement: String| {
        let mut l: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
        l[i] = replacement;
        l.join("\n")
    };
    let mut unknown: Value = serde_json::from_str(lines[6]).expect("json");
    unknown["type"] = "no.such.type".into();
    let mut tool_end: Value = serde_json::from_str(lines[6]).expect("json");
    tool_end["type"] = "tool.end".into();
    tool_end["payload"] = json!({"call_id": "never-started", "ok": true});
    let mut gap: Value = serde_json::from_str(lines[6]).expect("json");
    gap["seq"] = 99_999.into();
    let cases = [
        (with_line(6, "{not json".into()), "EVENT-MALFORMED"),
        (with_line(6, unknown.to_string()), "EVENT-UNKNOWN-TYPE"),
        (with_line(6, tool_end.to_string()), "TOOL-UNKNOWN-CALL"),
        (with_line(6, gap.to_string()), "SEQ-CONFLICT"),
    ];
    for (body, code) in cases {
        let (status, err) = import(&t, &t.key_a, body).await;
        assert!(status.is_client_error(), "{status} {err}");
        assert_eq!(err["error"]["code"], code, "{err}");
        let msg = err["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.starts_with("line 7:"), "the line is named: {msg}");
    }
    let (status, err) = import(&t, &t.key_a, String::new()).await;
    assert!(status.is_client_error(), "{err}");
    let rows_after = t.count_rows("agent_run_events").await;
    assert_eq!((run_count(&t).await, rows_after), (before, rows_before), "no run and no row was written");
}

#[tokio::test]
async fn export_takes_ranges_filters_and_dialects_and_refuses_bad_parameters() {
    let t = TestApp::new().await;
    let run = finished_run(&t, 21, 120).await;
    let path = |q: &str| format!("/v1/runs/{run}/events.jsonl{q}");
    let (_, all) = get_text(&t, &t.key_a, &path("")).await;
    let all = events_of(&all);
    let (_, part) = get_text(&t, &t.key_a, &path("?from_seq=10&to_seq=20")).await;
    let seqs: Vec<i64> = events_of(&part).iter().map(|v| v["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, (10..=20).collect::<Vec<_>>());
    assert!(part.ends_with("{\"export_end\":{\"lines\":11,\"last_seq\":20}}\n"), "{part}");
    let (_, tools) = get_text(&t, &t.key_a, &path("?types=tool.start,tool.end")).await;
    let want = all.iter().filter(|v| v["type"] == "tool.start" || v["type"] == "tool.end").count();
    assert_eq!(events_of(&tools).len(), want);
    assert!(want > 0);
    if let Some(child) = all.iter().find_map(|v| v["child_id"].as_str()) {
        let (_, c) = get_text(&t, &t.key_a, &path(&format!("?child_id={child}"))).await;
        let c = events_of(&c);
        assert!(c.iter().all(|v| v["child_id"] == child));
        assert!(!c.is_empty());
    }
    for format in ["multica", "chunks", "hier", "typed", "agui", "vercel"] {
        let (status, body) = get_text(&t, &t.key_a, &path(&format!("?format={format}"))).await;
        assert_eq!(status, StatusCode::OK, "{format}");
        assert!(
            body.lines().count() > 10 && body.lines().all(|l| serde_json::from_str::<Value>(l).is_ok()),
            "{format}"
        );
    }
    for q in [
        "?from_seq=0",
        "?from_seq=5&to_seq=4",
        "?to_seq=x",
        "?format=klingon",
        "?bogus=1",
        "?types=",
        "?types=tool.strat",
        "?child_id=",
    ] {
        let (status, body) = get_text(&t, &t.key_a, &path(q)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{q}: {body}");
        assert!(body.contains("PARAM-INVALID"), "{q}: {body}");
    }
}

#[tokio::test]
async fn other_tenants_get_not_found_and_the_tenant_export_holds_only_its_own_rows() {
    let t = TestApp::new().await;
    let run_a = finished_run(&t, 2, 40).await;
    let run_b = t.create_run(&t.key_b).await;
    t.append_ok(&t.key_b, &run_b, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}])).await;
    for path in [format!("/v1/runs/{run_a}/events.jsonl"), format!("/v1/runs/{run_a}/replay?speed=100")] {
        let (status, body) = get_text(&t, &t.key_b, &path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert!(body.contains("RUN-NOT-FOUND"), "{body}");
    }
    let (_, a) = get_text(&t, &t.key_a, "/v1/events.jsonl").await;
    let (_, b) = get_text(&t, &t.key_b, "/v1/events.jsonl").await;
    let runs = |s: &str| -> std::collections::BTreeSet<String> {
        events_of(s).iter().map(|v| v["run_id"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(runs(&a), [run_a.clone()].into());
    assert_eq!(runs(&b), [run_b].into());
    assert_eq!(events_of(&a).len() as i64, t.stored_count(&t.tenant_a, &run_a).await);
    assert!(
        a.ends_with(&format!("{{\"export_end\":{{\"lines\":{},\"runs\":1}}}}\n", events_of(&a).len())),
        "{a}"
    );
    let (_, none) = get_text(&t, &t.key_a, "/v1/events.jsonl?since=2999-01-01T00:00:00Z").await;
    assert_eq!(none, "{\"export_end\":{\"lines\":0,\"runs\":0}}\n");
    let (status, _) = get_text(&t, &t.key_a, "/v1/events.jsonl?since=yesterday").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

/// An imported run with events 300 ms apart: replay keeps the pace, divided by speed.
#[tokio::test]
async fn replay_streams_a_stored_run_at_its_recorded_pace() {
    let t = TestApp::new().await;
    let lines: Vec<String> = (0..4)
        .map(|i| {
            let ev = match i {
                0 => json!({"type": "run.lifecycle", "payload": {"state": "running"}}),
                3 => json!({"type": "run.lifecycle", "payload": {"state": "done"}}),
                _ => json!({"type": "text.delta", "payload": {"text": format!("t{i}")}}),
            };
            let mut ev = ev;
            ev["seq"] = (i + 1).into();
            ev["ts"] = format!("2026-01-01T00:00:00.{:03}Z", i * 300).into();
            ev.to_string()
        })
        .collect();
    let (status, created) = import(&t, &t.key_a, lines.join("\n")).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let run = created["run_id"].as_str().unwrap().to_owned();
    let started = Instant::now();
    let (status, body) = get_text(&t, &t.key_a, &format!("/v1/runs/{run}/replay?speed=1")).await;
    let at_pace = started.elapsed();
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<&str> = body.lines().filter_map(|l| l.strip_prefix("id:")).map(str::trim).collect();
    assert_eq!(ids, ["1", "2", "3", "4"]);
    assert!(at_pace >= Duration::from_millis(850), "three 300 ms gaps took {at_pace:?}");
    let started = Instant::now();
    let (_, fast) = get_text(&t, &t.key_a, &format!("/v1/runs/{run}/replay?speed=100&format=typed")).await;
    assert!(started.elapsed() < at_pace, "100x is faster");
    assert!(fast.contains(r#""type":"final""#), "{fast}");
    // Resume after seq 2 replays the rest only; a finished replay answers 204.
    let r = t
        .http
        .get(format!("{}/v1/runs/{run}/replay?speed=100", t.base))
        .bearer_auth(&t.key_a)
        .header("Last-Event-ID", "2")
        .send()
        .await
        .unwrap();
    let body = r.text().await.unwrap();
    let ids: Vec<&str> = body.lines().filter_map(|l| l.strip_prefix("id:")).map(str::trim).collect();
    assert_eq!(ids, ["3", "4"]);
    let (status, _) = get_text(&t, &t.key_a, &format!("/v1/runs/{run}/replay?speed=0")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

/// The agui and vercel streams of a rich run, read by `@ag-ui/core` / `@ag-ui/client`
/// and the `ai` package themselves (tests/node/dialects.mjs).
#[tokio::test]
async fn the_official_ag_ui_and_ai_sdk_packages_accept_our_streams() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node");
    crate::live::npm_ci(&dir);
    let t = TestApp::new().await;
    for seed in [3u64, 8] {
        let run = finished_run(&t, seed, 250).await;
        for format in ["agui", "vercel"] {
            for detail in ["", "&detail=full"] {
                let url = format!("{}/v1/runs/{run}/stream?format={format}{detail}", t.base);
                let out = tokio::process::Command::new(crate::live::node_bin(&dir))
                    .arg("dialects.mjs")
                    .arg(format)
                    .arg(&url)
                    .arg(&t.key_a)
                    .current_dir(&dir)
                    .output()
                    .await
                    .expect("node is needed for the Node client tests");
                let stdout = String::from_utf8_lossy(&out.stdout);
                let last = stdout.lines().last().unwrap_or_default();
                assert!(
                    out.status.success(),
                    "{format}{detail} seed {seed}: {last}\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let v: Value = serde_json::from_str(last).expect("summary line");
                assert_eq!(v["ok"], true);
                assert!(v["frames"].as_i64().unwrap_or(0) > 20, "{v}");
            }
        }
    }
}

/// Resuming our agui and vercel streams with `Last-Event-ID` after any frame gives the
/// official clients what a never-disconnected client has: `node dialects.mjs resume` cuts
/// a finished run's stream after every frame (every 5th of a longer run), checks each
/// resumed stream on its own (204 once the client has seen the whole run) and compares
/// the folds (AbstractAgent; readUIMessageStream and AbstractChat.resumeStream).
#[tokio::test]
async fn the_official_packages_resume_our_streams_after_any_frame() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node");
    crate::live::npm_ci(&dir);
    let t = TestApp::new().await;
    // A run cut inside its first event resumes from an empty view (a cut after the
    // call's arguments must not get them again); a message opened by reasoning has its
    // first deltas merged ahead of the cut, which the client keeps through the snapshot.
    let cut_early: Vec<Value> = [
        ("tool.start", json!({"call_id": "c0", "tool": "web.search", "input": {"q": "x"}})),
        ("reasoning.delta", json!({"message_id": "a1", "text": "Think"})),
        ("reasoning.delta", json!({"message_id": "a1", "text": " hard"})),
        ("text.delta", json!({"message_id": "a1", "text": "Hi"})),
        ("reasoning.delta", json!({"message_id": "a1", "text": " more"})),
        ("text.delta", json!({"message_id": "a1", "text": " there"})),
        ("tool.end", json!({"call_id": "c0", "ok": true, "output": "found"})),
        ("message.end", json!({"message_id": "a1", "text": "Hi there"})),
        ("message.start", json!({"message_id": "u2", "role": "user"})),
        ("text.delta", json!({"message_id": "u2", "text": "ok"})),
        ("message.end", json!({"message_id": "u2", "text": "ok"})),
    ]
    .into_iter()
    .map(|(ty, payload)| json!({"type": ty, "payload": payload}))
    .collect();
    let runs = [
        (finished_run(&t, 3, 120).await, 1, 40),
        (finished_run(&t, 8, 250).await, 5, 40),
        (finished_run_of(&t, &cut_early).await, 1, 8),
    ];
    let mut checks = Vec::new();
    for (run, every, min_frames) in &runs {
        for format in ["agui", "vercel"] {
            for detail in ["", "&detail=full"] {
                checks.push((
                    format!("{}/v1/runs/{run}/stream?format={format}{detail}", t.base),
                    format,
                    *every,
                    *min_frames,
                ));
            }
        }
    }
    // One Node process per stream (all its cuts, over one keep-alive connection), side by side.
    let outcomes = futures::future::join_all(checks.into_iter().map(|(url, format, every, min_frames)| {
        let node = crate::live::node_bin(&dir);
        let (dir, key) = (dir.clone(), t.key_a.clone());
        async move {
            let out = tokio::process::Command::new(node)
                .args(["dialects.mjs", "resume", format, &url, &key, "--every", &every.to_string()])
                .current_dir(&dir)
                .output()
                .await
                .expect("node runs");
            let stdout = String::from_utf8_lossy(&out.stdout);
            let last = stdout.lines().last().unwrap_or_default().to_owned();
            let summary: Value = serde_json::from_str(&last).unwrap_or_else(|_| {
                panic!("{url}: no summary line: {stdout}\n{}", String::from_utf8_lossy(&out.stderr))
            });
            (url, every, min_frames, out.status.success(), summary)
        }
    }))
    .await;
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|(_, _, _, ok, v)| !ok || v["ok"] != true)
        .map(|(url, _, _, _, v)| format!("{url}: {v}"))
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    for (url, every, min_frames, _, v) in &outcomes {
        let (cuts, frames) = (v["cuts"].as_i64().unwrap_or(0), v["frames"].as_i64().unwrap_or(0));
        assert!(frames > *min_frames && cuts >= frames / every, "{url}: {v}");
        assert!(v["terminal_cuts"].as_i64().unwrap_or(0) >= 1, "the end was answered 204: {url}: {v}");
    }
}

/// The validators are not vacuous: they accept the valid sample streams and refuse
/// each broken one for the reason its manifest names.
#[tokio::test]
async fn the_dialect_validators_refuse_broken_streams() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node");
    crate::live::npm_ci(&dir);
    let out = tokio::process::Command::new(crate::live::node_bin(&dir))
        .args(["dialects.mjs", "--self-test"])
        .current_dir(&dir)
        .output()
        .await
        .expect("node is needed for the Node client tests");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(" 0 failed"), "{stdout}");
}

/// `agent-stream export` and `agent-stream import` do what the routes do, from the
/// command line (no terminal here, so no progress bar in the output).
#[tokio::test]
async fn the_export_and_import_commands_round_trip_a_run() {
    let t = TestApp::new().await;
    let run = finished_run(&t, 13, 60).await;
    let dir = std::env::temp_dir().join(format!("agent-stream-cli-{}", t.db.schema));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("run.jsonl");
    let cli = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_agent-stream"))
            .args(args)
            .args(["--schema", &t.db.schema])
            .env("DATABASE_URL", &t.db.url)
            .env("AGENT_STREAM_KEY", &t.key_a)
            .env("RUST_LOG", "warn")
            .output()
            .expect("agent-stream runs")
    };
    let out = cli(&["export", &run, "--out", file.to_str().expect("path")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let exported = std::fs::read_to_string(&file).expect("file");
    let (_, via_http) = get_text(&t, &t.key_a, &format!("/v1/runs/{run}/events.jsonl")).await;
    assert_eq!(exported, via_http, "the command writes what the route serves");
    let out = cli(&["import", file.to_str().expect("path")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let copy = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let (_, again) = get_text(&t, &t.key_a, &format!("/v1/runs/{copy}/events.jsonl")).await;
    assert_eq!(without_ids(&exported), without_ids(&again));
    // A bad file is refused with its line and writes nothing.
    std::fs::write(&file, "{\"seq\":1}\n").expect("write");
    let out = cli(&["import", file.to_str().expect("path")]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("line 1"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `agent-stream import` reads the file as it writes (memory does not grow with the
/// file), in one transaction: a file longer than one write chunk is stored whole, and
/// one whose last line is bad stores nothing, though earlier chunks were already sent.
#[tokio::test]
async fn the_import_command_streams_a_long_file_in_one_transaction() {
    let t = TestApp::new().await;
    let dir = std::env::temp_dir().join(format!("agent-stream-import-{}", t.db.schema));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("long.jsonl");
    let n = 12_000;
    let mut body = String::new();
    for seq in 1..=n {
        body.push_str(&format!(
            "{{\"ts\":\"2026-01-01T00:00:00.000Z\",\"type\":\"custom.tick\",\"seq\":{seq},\"payload\":{{\"i\":{seq}}}}}\n"
        ));
    }
    let import = |contents: &str| {
        std::fs::write(&file, contents).expect("write");
        std::process::Command::new(env!("CARGO_BIN_EXE_agent-stream"))
            .args(["import", file.to_str().expect("path"), "--schema", &t.db.schema])
            .env("DATABASE_URL", &t.db.url)
            .env("AGENT_STREAM_KEY", &t.key_a)
            .env("RUST_LOG", "warn")
            .output()
            .expect("agent-stream runs")
    };
    let (runs0, events0) = (t.count_rows("runs").await, t.count_rows("agent_run_events").await);
    let bad = format!(
        "{body}{{\"ts\":\"2026-01-01T00:00:00.000Z\",\"type\":\"nope\",\"seq\":{},\"payload\":{{}}}}\n",
        n + 1
    );
    let out = import(&bad);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a bad last line fails the import");
    assert!(stderr.contains(&format!("line {}", n + 1)), "{stderr}");
    assert_eq!(t.count_rows("runs").await, runs0, "no run was created");
    assert_eq!(t.count_rows("agent_run_events").await, events0, "no event was kept");

    let out = import(&body);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let events = t.events(&t.key_a, &run).await;
    assert_eq!(events.len(), n as usize);
    for (i, e) in events.iter().enumerate() {
        assert_eq!((e["seq"].as_i64(), e["payload"]["i"].as_i64()), (Some(i as i64 + 1), Some(i as i64 + 1)));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
