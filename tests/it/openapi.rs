//! The OpenAPI document at `/openapi.json`: in step with the router (every route the
//! code registers is in the document, every operation in the document answers), valid
//! by a standard OpenAPI 3.1 validator, and its bodies shaped like what the service
//! sends. And the event vocabulary's JSON Schema at `/schema/events.json`.

use std::collections::BTreeSet;
use std::path::Path;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::TestApp;

const METHODS: [&str; 5] = ["get", "post", "put", "delete", "patch"];

/// Every `(path, method)` the code registers with `.route("/path", get(..).post(..))`,
/// read from the sources under `src/` (axum's router cannot list its routes).
fn routes_in_code() -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    let mut files = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
    while let Some(p) = files.pop() {
        if p.is_dir() {
            files.extend(std::fs::read_dir(&p).expect("dir").map(|e| e.expect("entry").path()));
            continue;
        }
        if p.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let src = std::fs::read_to_string(&p).expect("source");
        // A file's unit tests (its `#[cfg(test)] mod tests`, last) route for themselves.
        let src = src.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
        let mut rest = src;
        while let Some(at) = rest.find(".route(\"") {
            rest = &rest[at + 8..];
            let path = &rest[..rest.find('"').expect("closing quote")];
            // The route's method routers: up to the parenthesis that closes `.route(`.
            let (mut depth, mut end) = (1, 0);
            for (i, c) in rest.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    end = i;
                    break;
                }
            }
            let args = &rest[path.len()..end];
            for m in METHODS {
                let called = args
                    .match_indices(&format!("{m}("))
                    .any(|(i, _)| i == 0 || !args[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_'));
                if called {
                    out.insert((path.to_owned(), m.to_owned()));
                }
            }
        }
    }
    out
}

fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for m in METHODS {
            if item.get(m).is_some() {
                out.insert((path.clone(), m.to_owned()));
            }
        }
    }
    out
}

/// Runs `script` of tests/openapi with the Node 22 of tests/node, `input` on stdin.
fn node(script: &str, args: &[&str], input: &[u8]) -> std::process::Output {
    use std::io::Write;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let node_dir = root.join("tests/node");
    crate::live::npm_ci(&node_dir);
    let dir = root.join("tests/openapi");
    npm_ci(&dir);
    let mut child = std::process::Command::new(crate::live::node_bin(&node_dir))
        .arg(script)
        .args(args)
        .current_dir(&dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("node runs");
    child.stdin.take().expect("stdin").write_all(input).expect("write");
    child.wait_with_output().expect("node ends")
}

/// `npm ci` in tests/openapi unless its packages are there.
fn npm_ci(dir: &Path) {
    static ONCE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _once = ONCE.lock().unwrap_or_else(|p| p.into_inner());
    if dir.join("node_modules/@seriousme/openapi-schema-validator").is_dir()
        && dir.join("node_modules/ajv").is_dir()
    {
        return;
    }
    let st = std::process::Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund"])
        .current_dir(dir)
        .status()
        .expect("npm is needed for the OpenAPI test (install Node.js and npm)");
    assert!(st.success(), "npm ci in tests/openapi failed");
}

#[tokio::test]
async fn the_openapi_document_covers_the_router_and_is_valid() {
    let t = TestApp::new().await;
    let doc = t.get_json(&t.key_a, "/openapi.json").await;
    assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.1")), "{}", doc["openapi"]);

    // The router and the document list the same routes and methods.
    let code = routes_in_code();
    let documented = operations(&doc);
    assert!(code.len() > 15, "{code:?}");
    let undocumented: Vec<_> = code.difference(&documented).collect();
    let unrouted: Vec<_> = documented.difference(&code).collect();
    assert!(undocumented.is_empty(), "routes missing from /openapi.json: {undocumented:?}");
    assert!(unrouted.is_empty(), "operations in /openapi.json the code does not route: {unrouted:?}");

    // And every documented operation is answered by a route (not the fallbacks).
    let fake_run = "01M82EFA61SA47S6546MJGZGF7";
    for (path, method) in &documented {
        let url =
            path.replace("{run_id}", fake_run).replace("{key_id}", "0123456789ab").replace("{name}", "x");
        let method = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).expect("method");
        let r = t.http.request(method.clone(), format!("{}{url}", t.base)).send().await.expect("send");
        let status = r.status();
        let body = r.text().await.unwrap_or_default();
        assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        assert!(!body.contains("no such route"), "{method} {path}: {body}");
    }

    // Every error code is in the error schema, and every error response names its codes.
    let codes = &doc["components"]["schemas"]["ErrorDetail"]["properties"]["code"]["enum"];
    for c in ["RUN-NOT-FOUND", "METHOD-NOT-ALLOWED", "TOOL-UNKNOWN-CALL", "CURSOR-BEYOND-END", "INTERNAL"] {
        assert!(codes.as_array().is_some_and(|a| a.contains(&json!(c))), "{c} in {codes}");
    }
    let append = &doc["paths"]["/v1/runs/{run_id}/events"]["post"]["responses"];
    assert!(
        append["422"]["description"].as_str().is_some_and(|d| d.contains("`TOOL-UNKNOWN-CALL`")),
        "{append}"
    );
    assert!(append["409"]["description"].as_str().is_some_and(|d| d.contains("`SEQ-CONFLICT`")), "{append}");
    let params = &doc["paths"]["/v1/runs"]["get"]["parameters"];
    let names: Vec<&str> =
        params.as_array().expect("params").iter().filter_map(|p| p["name"].as_str()).collect();
    assert_eq!(names, ["limit", "before", "state", "created_after", "created_before"]);

    // A standard validator accepts it.
    let out = node("validate.mjs", &["-"], doc.to_string().as_bytes());
    assert!(
        out.status.success(),
        "the OpenAPI validator refused /openapi.json:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("valid OpenAPI 3.1"));
}

/// The properties a schema of the document lists.
fn properties(doc: &Value, schema: &str) -> BTreeSet<String> {
    doc["components"]["schemas"][schema]["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("schema {schema}"))
        .keys()
        .cloned()
        .collect()
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object().expect("object").keys().cloned().collect()
}

#[tokio::test]
async fn the_documents_bodies_have_the_fields_the_service_sends() {
    let t = TestApp::new().await;
    let doc = t.get_json(&t.key_a, "/openapi.json").await;
    let run = t.create_run(&t.key_a).await;
    let (_, appended) = t.append(&t.key_a, &run, &crate::common::every_type()).await;
    assert_eq!(keys(&appended), properties(&doc, "Appended"));
    assert_eq!(keys(&t.get_json(&t.key_a, &format!("/v1/runs/{run}")).await), properties(&doc, "Run"));
    let page = t.get_json(&t.key_a, &format!("/v1/runs/{run}/events")).await;
    assert_eq!(keys(&page), properties(&doc, "EventPage"));
    for e in page["events"].as_array().expect("events") {
        assert_eq!(keys(e), properties(&doc, "Event"));
    }
    assert_eq!(keys(&t.get_json(&t.key_a, &format!("/v1/runs/{run}/view")).await), properties(&doc, "View"));
    assert_eq!(keys(&t.get_json(&t.key_a, "/v1/runs").await), properties(&doc, "RunPage"));
    let (_, err) = t.get_text(&t.key_a, "/v1/runs/nope").await;
    let err: Value = serde_json::from_str(&err).expect("json");
    assert_eq!(keys(&err), properties(&doc, "ErrorBody"));
}

#[tokio::test]
async fn stored_events_match_the_vocabularys_json_schema() {
    let t = TestApp::new().await;
    let schema = t.get_json(&t.key_a, "/schema/events.json").await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run, crate::common::every_type()).await;
    let valid = t.events(&t.key_a, &run).await;
    let types: BTreeSet<&str> = valid.iter().filter_map(|e| e["type"].as_str()).collect();
    for ty in ["run.lifecycle", "tool.end", "plan.proposal", "compaction.end", "child.spawn"] {
        assert!(types.contains(ty), "the run has a {ty}");
    }
    // What the append refuses, the schema refuses too.
    let mut invalid = vec![];
    for (ty, payload) in [
        ("run.lifecycle", json!({"state": "sleeping"})),
        ("message.start", json!({"message_id": "m", "role": "robot"})),
        ("text.delta", json!({"text": "x", "colour": "red"})),
        ("tool.end", json!({"call_id": "c"})),
        ("nonsense", json!({})),
    ] {
        let mut e = valid[0].clone();
        e["type"] = json!(ty);
        e["payload"] = payload;
        invalid.push(e);
    }
    let input = json!({"schema": schema, "valid": valid, "invalid": invalid});
    let out = node("check_events.mjs", &[], input.to_string().as_bytes());
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains(&format!("{} valid and 5 invalid events checked", valid.len())), "{said}");
}
