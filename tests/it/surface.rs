//! The surface a new user meets: the README's claims about commands and the schema,
//! the run list, answers to wrong methods, export formatting and the command line's
//! small edges (issue 26).

use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::TestApp;

const README: &str = include_str!("../../README.md");

/// The indented block of the README that follows the line starting with `after`.
fn readme_block(after: &str) -> Vec<&'static str> {
    let mut lines = README.lines().skip_while(|l| !l.starts_with(after)).skip(1);
    let mut block = vec![];
    for l in lines.by_ref() {
        if l.starts_with("    ") {
            block.push(l);
        } else if !block.is_empty() && !l.trim().is_empty() {
            break;
        }
    }
    assert!(!block.is_empty(), "README has a block after `{after}`");
    block
}

/// Runs the binary against the test's schema with `AGENT_STREAM_KEY` = tenant a's key.
fn cli(t: &TestApp, args: &[&str], stdin: Option<&[u8]>) -> std::process::Output {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_agent-stream"))
        .args(args)
        .args(["--schema", &t.db.schema])
        .env("DATABASE_URL", &t.db.url)
        .env("AGENT_STREAM_KEY", &t.key_a)
        .env("RUST_LOG", "warn")
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("agent-stream runs");
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(input).expect("write stdin");
    }
    child.wait_with_output().expect("agent-stream ends")
}

#[tokio::test]
async fn migrate_prints_what_the_readme_shows() {
    let t = TestApp::new().await;
    let out = cli(&t, &["migrate"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let shown = README
        .lines()
        .skip_while(|l| l.trim() != "$ agent-stream migrate")
        .nth(1)
        .expect("the README shows `agent-stream migrate`'s output")
        .trim();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), shown);
}

#[tokio::test]
async fn tenant_retention_without_flags_says_so_in_words() {
    let t = TestApp::new().await;
    let out = cli(&t, &["tenant", "retention", "a"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.trim(), "tenant `a` follows the service's retention defaults");
    let out = cli(&t, &["tenant", "retention", "a", "--done-days", "7"], None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("done runs are kept for 7 days"), "{stdout}");
    assert!(!stdout.contains("None") && !stdout.contains("Some("), "{stdout}");
}

#[tokio::test]
async fn import_dash_reads_standard_input() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run, crate::common::every_type()).await;
    let (_, export) = t.get_text(&t.key_a, &format!("/v1/runs/{run}/events.jsonl")).await;
    let out = cli(&t, &["import", "-"], Some(export.as_bytes()));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let copy = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert_eq!(t.events(&t.key_a, &copy).await.len(), t.events(&t.key_a, &run).await.len());
    // A bad line on standard input is refused like one in a file, and writes nothing.
    let runs = t.count_rows("runs").await;
    let out = cli(&t, &["import", "-"], Some(b"{\"seq\":1}\n"));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 1"));
    assert_eq!(t.count_rows("runs").await, runs);
}

#[tokio::test]
async fn get_v1_runs_lists_the_tenants_runs_newest_first_in_pages() {
    let t = TestApp::new().await;
    let mut mine = vec![];
    for _ in 0..5 {
        mine.push(t.create_run(&t.key_a).await);
    }
    let other = t.create_run(&t.key_b).await;
    t.append_ok(&t.key_a, &mine[4], json!([{"type":"run.lifecycle","payload":{"state":"running"}}])).await;

    let page = t.get_json(&t.key_a, "/v1/runs?limit=2").await;
    let ids = |p: &Value| -> Vec<String> {
        p["runs"]
            .as_array()
            .expect("runs")
            .iter()
            .map(|r| r["run_id"].as_str().expect("id").to_owned())
            .collect()
    };
    assert_eq!(ids(&page), vec![mine[4].clone(), mine[3].clone()]);
    assert_eq!(page["runs"][0]["last_seq"], 1);
    let mut all = ids(&page);
    let mut cursor = page["next_before"].as_str().expect("a next page").to_owned();
    loop {
        let page = t.get_json(&t.key_a, &format!("/v1/runs?limit=2&before={cursor}")).await;
        all.extend(ids(&page));
        match page["next_before"].as_str() {
            Some(c) => cursor = c.to_owned(),
            None => break,
        }
    }
    let newest_first: Vec<String> = mine.iter().rev().cloned().collect();
    assert_eq!(all, newest_first, "every run once, newest first, never another tenant's");
    assert!(!all.contains(&other));

    let running = t.get_json(&t.key_a, "/v1/runs?state=running").await;
    assert_eq!(ids(&running), vec![mine[4].clone()]);
    assert!(running["next_before"].is_null());

    for bad in
        ["limit=0", "limit=1001", "state=sleeping", "before=nope", "created_after=yesterday", "color=red"]
    {
        let (status, body) = t.get_text(&t.key_a, &format!("/v1/runs?{bad}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        let v: Value = serde_json::from_str(&body).expect("json");
        assert_eq!(v["error"]["code"], "PARAM-INVALID", "{bad}");
    }
    let r = t.http.get(format!("{}/v1/runs", t.base)).send().await.expect("send");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn wrong_methods_get_405_with_a_json_error_and_allow() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    for (method, path) in [
        (reqwest::Method::DELETE, "/v1/runs".to_owned()),
        (reqwest::Method::PUT, format!("/v1/runs/{run}/events")),
        (reqwest::Method::POST, format!("/v1/runs/{run}/view")),
        (reqwest::Method::PATCH, "/v1/keys".to_owned()),
        (reqwest::Method::POST, "/metrics".to_owned()),
    ] {
        let r =
            t.http.request(method.clone(), format!("{}{path}", t.base)).bearer_auth(&t.key_a).send().await;
        let r = r.expect("send");
        assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        assert!(r.headers().contains_key("allow"), "{method} {path}: Allow lists the methods");
        let v: Value = r.json().await.expect("a JSON body");
        assert_eq!(v["error"]["code"], "METHOD-NOT-ALLOWED", "{method} {path}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains(method.as_str())));
    }
}

#[tokio::test]
async fn jsonl_export_payloads_are_compact_like_every_other_surface() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(
        &t.key_a,
        &run,
        json!([
            {"type":"tool.start","payload":{"call_id":"c1","tool":"t","input":{"q":"a: b, c","n":[1, 2, {"x":null}],"s":"quote \" and \\ , : "}}},
            {"type":"tool.end","payload":{"call_id":"c1","ok":true,"output":{"hits":[ {"a":1} ]}}}
        ]),
    )
    .await;
    let (_, export) = t.get_text(&t.key_a, &format!("/v1/runs/{run}/events.jsonl")).await;
    let lines: Vec<&str> = export.lines().collect();
    assert_eq!(lines.len(), 3, "two events and the end line");
    let events = t.events(&t.key_a, &run).await;
    for (line, event) in lines.iter().zip(&events) {
        // The same event as the HTTP page, with no whitespace between its tokens.
        assert_eq!(&serde_json::from_str::<Value>(line).expect("json"), event);
        let (mut in_string, mut escaped) = (false, false);
        for c in line.chars() {
            match (in_string, escaped, c) {
                (true, true, _) => escaped = false,
                (true, false, '\\') => escaped = true,
                (_, false, '"') => in_string = !in_string,
                (false, _, c) => assert!(!c.is_whitespace(), "whitespace between tokens: {line}"),
                _ => {}
            }
        }
    }
    let (_, all) = t.get_text(&t.key_a, "/v1/events.jsonl").await;
    assert!(all.starts_with(lines[0]), "the tenant-wide export writes the same lines");
}

/// Starts `serve` with `AGENT_STREAM_LOG=filter`, asks it one request, stops it and
/// returns what it logged.
async fn serve_log(t: &TestApp, filter: &str) -> String {
    let (child, _) = serve_logging(t, filter).await;
    stop_for_log(child).await
}

/// Starts `serve` with `AGENT_STREAM_LOG=filter` and its stderr piped; returns it and its
/// base URL once it answers.
async fn serve_logging(t: &TestApp, filter: &str) -> (tokio::process::Child, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agent-stream"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--schema", &t.db.schema])
        .args(["--retention-interval", "0"])
        .env("DATABASE_URL", &t.db.url)
        .env("AGENT_STREAM_LOG", filter)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn agent-stream");
    let base = format!("http://127.0.0.1:{port}");
    let mut up = false;
    for _ in 0..200 {
        if reqwest::get(format!("{base}/v1/runs")).await.is_ok() {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(up, "server started");
    (child, base)
}

/// Stops `child` gracefully and returns what it logged.
async fn stop_for_log(child: tokio::process::Child) -> String {
    let pid = nix::unistd::Pid::from_raw(child.id().expect("pid") as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output()).await.expect("stops");
    String::from_utf8_lossy(&out.expect("output").stderr).into_owned()
}

/// A live stream's body is polled outside its request's span (`src/http/traced.rs`), so
/// what the stream logs later must name that span itself: the line that says a revoked
/// key closed the stream carries the stream's path and request id, as the README says.
#[tokio::test]
async fn a_live_streams_log_line_carries_its_requests_context() {
    use agent_stream::auth::Scope;
    use agent_stream::storage::tenants;
    use futures::StreamExt;
    let t = TestApp::new().await;
    let key = t.key_for_a(&[Scope::Read]).await;
    let run = t.create_run(&t.key_a).await;
    let (child, base) = serve_logging(&t, "info,tokio_postgres=warn").await;
    let path = format!("/v1/runs/{run}/stream");
    let r = t
        .http
        .get(format!("{base}{path}"))
        .bearer_auth(&key.secret)
        .header("x-request-id", "stream-under-test")
        .send()
        .await
        .expect("stream");
    assert_eq!(r.status(), StatusCode::OK);
    let mut body = r.bytes_stream();
    let owner = t.db.owner().await;
    assert!(tenants::revoke_key(&owner, &key.key_id).await.expect("revoke"));
    // The stream closes within the key cache's 2 s and its re-check's 2 s.
    let closed =
        tokio::time::timeout(Duration::from_secs(10), async { while let Some(Ok(_)) = body.next().await {} })
            .await;
    assert!(closed.is_ok(), "the revoked key's stream closed");
    let log = stop_for_log(child).await;
    let line = log.lines().find(|l| l.contains("key revoked; closing its stream")).unwrap_or_else(|| {
        panic!("the stream logged its close:\n{log}");
    });
    assert!(line.contains(&path), "the stream's path: {line}");
    assert!(line.contains("stream-under-test"), "the stream's request id: {line}");
}

#[tokio::test]
async fn requests_are_logged_at_debug_as_the_readme_says() {
    let t = TestApp::new().await;
    let quiet = serve_log(&t, "info,tokio_postgres=warn").await;
    assert!(!quiet.contains("finished processing request"), "no request lines at info:\n{quiet}");
    // The README's recipe for seeing them.
    let recipe = README
        .lines()
        .find_map(|l| l.split("use `AGENT_STREAM_LOG=").nth(1))
        .and_then(|rest| rest.split('`').next())
        .expect("the README says how to see requests");
    let loud = serve_log(&t, recipe).await;
    assert!(loud.contains("finished processing request"), "{recipe} shows requests:\n{loud}");
    assert!(loud.contains("/v1/runs") && loud.contains("401"), "{loud}");
}

#[test]
fn the_readmes_graphql_summary_matches_the_sdl() {
    // The SDL without descriptions, one space between tokens, none inside parentheses.
    let sdl = agent_stream::graphql::sdl();
    let bare: String = sdl.split("\"\"\"").step_by(2).collect();
    let sdl = bare.split_whitespace().collect::<Vec<_>>().join(" ").replace("( ", "(").replace(" )", ")");
    let block = readme_block("`agent-stream schema` prints the whole SDL");
    let mut checked = 0;
    for line in block {
        let line = line.split('#').next().unwrap_or_default();
        // Every `name(args): Type` the summary shows is a field of the SDL, as written there.
        let mut rest = line;
        while let Some(open) = rest.find('(') {
            let start = rest[..open].rfind(|c: char| !c.is_alphanumeric()).map_or(0, |i| i + 1);
            let Some(close) = rest[open..].find(')') else { break };
            let mut end = open + close + 1;
            if rest[end..].starts_with(": ") {
                end += 2 + rest[end + 2..]
                    .find(|c: char| c.is_whitespace() || c == '}')
                    .unwrap_or(rest.len() - end - 2);
            }
            let field = rest[start..end].split_whitespace().collect::<Vec<_>>().join(" ");
            assert!(sdl.contains(&field), "README's `{field}` is not in the SDL");
            checked += 1;
            rest = &rest[end..];
        }
    }
    assert!(checked >= 10, "checked {checked} fields");
}

#[test]
fn the_readmes_layout_names_what_is_there() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let block = readme_block("Files:");
    let text = block.join("\n");
    for line in &block {
        let first = line.trim_start().split("  ").next().unwrap_or_default();
        if line.starts_with("     ") || first.is_empty() {
            continue; // a continuation line
        }
        for path in first.split(", ") {
            assert!(root.join(path.trim()).exists(), "README's layout names `{path}`, which is not there");
        }
    }
    let mut named = 0;
    for dir in ["sql", "crates", "tests/it"] {
        for entry in std::fs::read_dir(root.join(dir)).expect("dir") {
            let name = entry.expect("entry").file_name().into_string().expect("utf-8");
            if dir == "tests/it" && !matches!(name.as_str(), "main.rs" | "common.rs") {
                continue;
            }
            assert!(text.contains(&name), "README's layout does not mention {dir}/{name}");
            named += 1;
        }
    }
    assert!(named > 10);
}

#[test]
fn the_readmes_error_table_is_every_code_with_its_status() {
    use agent_stream::error::ErrorCode;
    let mut rows = 0;
    for line in README.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let [_, code, status, ..] = cells.as_slice() else { continue };
        let Some(code) = code.strip_prefix('`').and_then(|c| c.strip_suffix('`')) else { continue };
        let status = match *status {
            // WebSocket-only codes: no HTTP answer carries them.
            "(GraphQL)" => None,
            s => match s.parse::<u16>() {
                Ok(n) => Some(n),
                Err(_) => continue,
            },
        };
        let known = ErrorCode::ALL.iter().find(|c| c.as_str() == code);
        let known = known.unwrap_or_else(|| panic!("the README lists `{code}`, which is not an ErrorCode"));
        if let Some(status) = status {
            assert_eq!(agent_stream::http::error::status(*known).as_u16(), status, "{code}");
        }
        rows += 1;
    }
    assert!(rows > 30, "{rows} rows");
    for c in ErrorCode::ALL {
        let row = format!("| `{}` |", c.as_str());
        assert!(README.contains(&row), "the README's error table has no row for `{}`", c.as_str());
    }
}

/// README, "Request ids": every response carries an `x-request-id`, the one the
/// request sent or else a new one (a random UUID, never the same twice).
#[tokio::test]
async fn every_answer_carries_the_request_id_it_was_sent_or_a_new_one() {
    let t = TestApp::new().await;
    let mut seen = std::collections::HashSet::new();
    for path in ["/healthz", "/v1/runs/not-a-run-id", "/no/such/route"] {
        for _ in 0..20 {
            let r = t.http.get(format!("{}{path}", t.base)).bearer_auth(&t.key_a).send().await.expect("send");
            let id = r.headers().get("x-request-id").and_then(|v| v.to_str().ok()).expect("an x-request-id");
            let b = id.as_bytes();
            let uuid_v4 = b.len() == 36
                && [8, 13, 18, 23].iter().all(|&i| b[i] == b'-')
                && b[14] == b'4'
                && matches!(b[19], b'8' | b'9' | b'a' | b'b')
                && b.iter().enumerate().all(|(i, c)| [8, 13, 18, 23].contains(&i) || c.is_ascii_hexdigit());
            assert!(uuid_v4, "{path}: a random (version 4) UUID, not {id}");
            assert!(seen.insert(id.to_owned()), "{path}: the request id {id} was given twice");
        }
    }
    let r = t
        .http
        .get(format!("{}/healthz", t.base))
        .header("x-request-id", "trace-me-42")
        .send()
        .await
        .expect("send");
    assert_eq!(r.headers().get("x-request-id").and_then(|v| v.to_str().ok()), Some("trace-me-42"));
}
