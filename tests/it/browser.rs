//! GraphiQL in a real browser with no network: Debian's chromium, headless, driven by
//! `playwright-core` (`tests/browser/`), with every request to anything but this machine
//! refused. The IDE must load from the service alone and answer a query; the
//! screenshot is kept in Cargo's target tmp directory.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::TestApp;
use crate::process::Serve;

/// `npm ci` in `tests/browser` unless `playwright-core` is already there.
fn npm_ci(dir: &Path) {
    static ONCE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _once = ONCE.lock().unwrap_or_else(|p| p.into_inner());
    if dir.join("node_modules/playwright-core").is_dir() {
        return;
    }
    let st = std::process::Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund"])
        .current_dir(dir)
        .status()
        .expect("npm is needed for the browser tests (install Node.js and npm)");
    assert!(st.success(), "npm ci in tests/browser failed");
}

#[tokio::test]
async fn graphiql_renders_and_runs_a_query_in_chromium_without_network() {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_owned());
    assert!(
        Path::new(&chromium).exists(),
        "the browser test needs Debian's chromium at {chromium} (apt-get install chromium; .ci/run installs it)"
    );
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    npm_ci(&dir);
    let t = TestApp::new().await;
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("graphiql.png");
    let _ = std::fs::remove_file(&shot);
    let run = tokio::process::Command::new("node")
        .arg(dir.join("graphiql.mjs"))
        .arg(format!("{}/graphql", t.base))
        .arg(&shot)
        .env("CHROMIUM", &chromium)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the browser finished")
        .expect("node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    let result: Value = serde_json::from_str(line).unwrap_or_else(|e| {
        panic!("{e}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    });
    eprintln!("GraphiQL in chromium: {result}; screenshot {}", shot.display());
    assert_eq!(result["offsite"], Value::Array(vec![]), "the page asked for nothing off this machine");
    assert_eq!(result["errors"], Value::Array(vec![]), "no script errors");
    assert_eq!(result["editor"], true, "the query editor is there");
    let answer = result["answer"].as_str().unwrap_or_default();
    assert!(answer.contains("\"data\"") && answer.contains("__typename"), "the query ran: {answer}");
    let png = std::fs::metadata(&shot).expect("a screenshot");
    assert!(png.len() > 10_000, "a screenshot of a rendered page, not a blank one ({} bytes)", png.len());
}

// ---- the run inspector (/ui/) --------------------------------------------------------

/// `tests/browser/inspector.mjs`, driven one JSON command per line.
struct Page {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    out: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Page {
    async fn launch() -> Page {
        let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_owned());
        assert!(Path::new(&chromium).exists(), "the inspector tests need Debian's chromium at {chromium}");
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
        npm_ci(&dir);
        let mut child = tokio::process::Command::new("node")
            .arg(dir.join("inspector.mjs"))
            .env("CHROMIUM", &chromium)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("node");
        let stdin = child.stdin.take().expect("stdin");
        let out = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(
            child.stdout.take().expect("stdout"),
        ));
        Page { child, stdin, out }
    }

    /// Sends one command; its answer's `value`, or an error message.
    async fn try_cmd(&mut self, cmd: Value) -> Result<Value, String> {
        use tokio::io::AsyncWriteExt;
        let line = format!("{cmd}\n");
        self.stdin.write_all(line.as_bytes()).await.expect("write to the driver");
        let answer = tokio::time::timeout(Duration::from_secs(120), self.out.next_line())
            .await
            .unwrap_or_else(|_| panic!("the driver did not answer {cmd}"))
            .expect("read")
            .unwrap_or_else(|| panic!("the driver ended at {cmd}"));
        let v: Value = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer}"));
        if v["ok"] == true {
            Ok(v["value"].clone())
        } else {
            Err(v["error"].as_str().unwrap_or_default().to_owned())
        }
    }

    async fn cmd(&mut self, cmd: Value) -> Value {
        match self.try_cmd(cmd.clone()).await {
            Ok(v) => v,
            Err(e) => {
                let report = self.try_cmd(serde_json::json!({"cmd": "report"})).await;
                panic!("{cmd} failed: {e}\npage report: {report:?}")
            }
        }
    }

    async fn wait(&mut self, expr: &str, timeout_ms: u64) {
        self.cmd(serde_json::json!({"cmd": "wait", "expr": expr, "timeout": timeout_ms})).await;
    }

    async fn eval(&mut self, expr: &str) -> Value {
        self.cmd(serde_json::json!({"cmd": "eval", "expr": expr})).await
    }

    /// Waits until the page shows the view at `seq` with every item drawn.
    async fn settled_at(&mut self, seq: i64, timeout_ms: u64) {
        let expr = format!(
            "window.__inspector && window.__inspector.seq() === {seq} && window.__inspector.settled()"
        );
        if let Err(e) =
            self.try_cmd(serde_json::json!({"cmd": "wait", "expr": expr, "timeout": timeout_ms})).await
        {
            let at =
                self.eval("window.__inspector && [window.__inspector.seq(), window.__inspector.mode]").await;
            let report = self.cmd(serde_json::json!({"cmd": "report"})).await;
            panic!("the page did not reach seq {seq} ({e}); it is at {at}; {report}");
        }
    }

    async fn shot(&mut self, name: &str) -> std::path::PathBuf {
        let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
        let _ = std::fs::remove_file(&path);
        self.cmd(serde_json::json!({"cmd": "shot", "path": path})).await;
        let len = std::fs::metadata(&path).expect("a screenshot").len();
        assert!(len > 10_000, "{name}: a rendered page, not a blank one ({len} bytes)");
        eprintln!("screenshot: {}", path.display());
        path
    }

    /// No request left this machine and no script failed.
    async fn clean(&mut self) -> Value {
        let report = self.cmd(serde_json::json!({"cmd": "report"})).await;
        assert_eq!(report["offsite"], Value::Array(vec![]), "the page asked for nothing off this machine");
        assert_eq!(report["errors"], Value::Array(vec![]), "no script errors");
        report
    }

    async fn quit(mut self) {
        use tokio::io::AsyncWriteExt;
        let _ = self.stdin.write_all(b"{\"cmd\":\"quit\"}\n").await;
        let _ = tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await;
    }
}

/// The GraphQL selection of a run's view the comparison reads.
const VIEW_QUERY: &str = "query($id: ID!) { run(id: $id) { lastSeq view { seq
  lifecycle { state transitions { seq childId from to reason } }
  messages { id childId role status blocks { kind text } text reasoning stopReason startedSeq }
  tools { callId childId tool status progressCount output error startedSeq }
  plan { id childId steps { title } proposedSeq decision { decision } }
  steps { seq childId stepIndex stepKind }
  children { childId parentChildId prompt spawnedSeq }
  compaction { active count last { removed kept seq } } } } }";

fn word(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_lowercase().replace('_', "-")
}

fn lane(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}

/// A JSON value as the page shows it: None for null or `{}`, else the value.
fn shown(v: &Value) -> Option<Value> {
    match v {
        Value::Null => None,
        Value::Object(m) if m.is_empty() => None,
        v => Some(v.clone()),
    }
}

/// The page's text of a JSON value read back: a string as it is, else parsed JSON.
fn read_back(text: &Value, like: &Value) -> Option<Value> {
    let s = text.as_str()?;
    if like.is_string() {
        return Some(Value::String(s.to_owned()));
    }
    serde_json::from_str(s).ok()
}

/// Compares the page's items with the `run { view }` answer, record by record.
fn compare(items: &Value, view: &Value) -> usize {
    use std::collections::BTreeMap;
    let got: BTreeMap<String, &Value> = items
        .as_array()
        .expect("items")
        .iter()
        .map(|i| (i["key"].as_str().expect("key").to_owned(), i))
        .collect();
    assert_eq!(got.len(), items.as_array().map_or(0, Vec::len), "every item once");
    let mut want: Vec<(String, Value)> = vec![];
    let mut check = |key: String, lane_id: String, seq: &Value, kind: &str, f: &dyn Fn(&Value)| {
        let it = got.get(&key).unwrap_or_else(|| panic!("the page has no {kind} {key}"));
        assert_eq!(it["kind"], kind, "{key}");
        assert_eq!(it["lane"].as_str(), Some(lane_id.as_str()), "{key}: lane");
        assert_eq!(it["seq"], *seq, "{key}: seq");
        f(it);
        want.push((key, Value::Null));
    };
    for m in view["messages"].as_array().expect("messages") {
        let key = format!("m:{}:{}", lane(&m["childId"]), m["id"].as_str().expect("id"));
        check(key.clone(), lane(&m["childId"]), &m["startedSeq"], "message", &|it| {
            assert_eq!(it["role"].as_str().map(str::to_owned), Some(word(&m["role"])), "{key}: role");
            assert_eq!(it["status"].as_str().map(str::to_owned), Some(word(&m["status"])), "{key}: status");
            assert_eq!(it["text"], m["text"], "{key}: text");
            assert_eq!(it["reasoning"], m["reasoning"], "{key}: reasoning");
            assert_eq!(it["stop"], m["stopReason"], "{key}: stop reason");
            assert_eq!(it["reasoningOpen"], false, "{key}: reasoning is collapsed");
        });
    }
    for t in view["tools"].as_array().expect("tools") {
        let key = format!("t:{}:{}", lane(&t["childId"]), t["callId"].as_str().expect("callId"));
        check(key.clone(), lane(&t["childId"]), &t["startedSeq"], "tool", &|it| {
            assert_eq!(it["tool"], t["tool"], "{key}: tool");
            let status = word(&t["status"]);
            assert_eq!(it["status"].as_str(), Some(status.as_str()), "{key}: status");
            assert_eq!(it["spinner"], status == "running", "{key}: a spinner while running");
            for field in ["output", "error"] {
                match shown(&t[field]) {
                    None => assert_eq!(it[field], Value::Null, "{key}: no {field}"),
                    Some(v) => assert_eq!(read_back(&it[field], &v), Some(v), "{key}: {field}"),
                }
            }
            let n = t["progressCount"].as_i64().unwrap_or(0);
            assert_eq!(it["progress"].is_string(), n > 0, "{key}: progress shown");
        });
    }
    for s in view["steps"].as_array().expect("steps") {
        let key = format!("s:{}", s["seq"]);
        check(key.clone(), lane(&s["childId"]), &s["seq"], "step", &|it| {
            let text = format!("step {} · {}", s["stepIndex"], word(&s["stepKind"]));
            assert_eq!(it["text"].as_str(), Some(text.as_str()), "{key}");
        });
    }
    for l in view["lifecycle"]["transitions"].as_array().expect("transitions") {
        let key = format!("l:{}", l["seq"]);
        check(key.clone(), lane(&l["childId"]), &l["seq"], "transition", &|it| {
            assert_eq!(it["to"].as_str().map(str::to_owned), Some(word(&l["to"])), "{key}");
            assert_eq!(it["reason"], l["reason"], "{key}: reason");
        });
    }
    for c in view["children"].as_array().expect("children") {
        let key = format!("k:{}", c["childId"].as_str().expect("childId"));
        check(key.clone(), lane(&c["parentChildId"]), &c["spawnedSeq"], "child", &|it| {
            assert_eq!(it["prompt"], c["prompt"].as_str().map_or(Value::String(String::new()), |p| p.into()));
        });
    }
    if let Some(p) = view["plan"].as_object() {
        check("p".into(), lane(&p["childId"]), &p["proposedSeq"], "plan", &|it| {
            let titles: Vec<Value> =
                p["steps"].as_array().expect("steps").iter().map(|s| s["title"].clone()).collect();
            assert_eq!(it["steps"], Value::Array(titles), "plan steps");
            match p["decision"].as_object() {
                Some(d) => assert_eq!(it["decision"].as_str().map(str::to_owned), Some(word(&d["decision"]))),
                None => assert_eq!(it["decision"], Value::Null),
            }
        });
    }
    let k = &view["compaction"];
    if k["active"] == true || !k["last"].is_null() {
        let seq = if k["last"].is_null() { view["seq"].clone() } else { k["last"]["seq"].clone() };
        check("c".into(), String::new(), &seq, "compaction", &|it| {
            let text = it["text"].as_str().unwrap_or_default();
            if k["active"] == true {
                assert!(text.contains("compacting"), "{text}");
            } else {
                let s = format!("{} removed, {} kept", k["last"]["removed"], k["last"]["kept"]);
                assert!(text.contains(&s), "{text} / {s}");
            }
        });
    }
    let extra: Vec<&String> = got.keys().filter(|k| !want.iter().any(|(w, _)| w == *k)).collect();
    assert!(extra.is_empty(), "the page shows items the view does not have: {extra:?}");
    want.len()
}

async fn view_of(t: &TestApp, base: &str, key: &str, run: &str) -> Value {
    let r = t
        .http
        .post(format!("{base}/graphql"))
        .bearer_auth(key)
        .json(&serde_json::json!({"query": VIEW_QUERY, "variables": {"id": run}}))
        .send()
        .await
        .expect("send");
    let v: Value = r.json().await.expect("json");
    assert!(v["errors"].is_null(), "{v}");
    v["data"]["run"].clone()
}

async fn append_chunks(t: &TestApp, key: &str, run: &str, events: &[Value]) -> i64 {
    let mut last = 0;
    for chunk in events.chunks(2000) {
        last = t.append_ok(key, run, Value::Array(chunk.to_vec())).await.1;
    }
    last
}

/// A generated run and `every_type()`, each drawn by the page and compared with the
/// `run { view }` query item by item; then the same run replayed (the replay route)
/// and as a JSONL file from disk (`POST /v1/fold`), compared again; a 10,000-event run
/// drawn without long stalls; screenshots at 1280x800 and 400x800.
#[tokio::test]
async fn inspector_draws_the_runs_view_item_by_item() {
    let t = TestApp::new().await;
    let generated = agent_stream_core::testkit::generated_run_mix(7, 400, 30);
    let gen_run = t.create_run(&t.key_a).await;
    let gen_last = append_chunks(&t, &t.key_a, &gen_run, &generated).await;
    let every = t.create_run(&t.key_a).await;
    let every_last = t.append_ok(&t.key_a, &every, crate::common::every_type()).await.1;

    let mut page = Page::launch().await;
    // The key comes in the fragment, lands in session storage and leaves the address bar.
    let url = format!("{}/ui/runs/{gen_run}#key={}", t.base, t.key_a);
    page.cmd(serde_json::json!({"cmd": "open", "url": url})).await;
    page.settled_at(gen_last, 60_000).await;
    assert_eq!(page.eval("location.hash").await, "", "the key left the address bar");
    assert_eq!(page.eval("sessionStorage.getItem('agent-stream-key')").await, t.key_a.as_str());
    let items = page.cmd(serde_json::json!({"cmd": "items"})).await;
    let view = view_of(&t, &t.base, &t.key_a, &gen_run).await;
    let n = compare(&items, &view["view"]);
    assert!(n > 50, "a generated run has many records ({n})");
    page.shot("ui-generated.png").await;

    // Through the page's own links: the list shows both runs, newest first.
    let listed = page.eval("[...document.querySelectorAll('#runs a')].map(a => a.dataset.run)").await;
    assert_eq!(listed, serde_json::json!([every, gen_run]), "the runs, newest first");
    page.cmd(
        serde_json::json!({"cmd": "press", "selector": format!("a[data-run='{every}']"), "key": "Enter"}),
    )
    .await;
    page.settled_at(every_last, 30_000).await;
    let view = view_of(&t, &t.base, &t.key_a, &every).await;
    let items = page.cmd(serde_json::json!({"cmd": "items"})).await;
    assert!(compare(&items, &view["view"]) >= 10);
    // Every kind of item is there: messages, tools, steps, transitions, plan, child, compaction.
    let kinds: std::collections::BTreeSet<String> = items
        .as_array()
        .expect("items")
        .iter()
        .map(|i| i["kind"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(kinds.len(), 7, "{kinds:?}");
    page.shot("ui-run.png").await;
    // The sub-run is a tab: chosen from the keyboard, its lane shows and the run's hides.
    page.cmd(serde_json::json!({"cmd": "press", "selector": ".tab[data-lane='kid']", "key": "Enter"})).await;
    let shown = page
        .eval("[...document.querySelectorAll('.lane')].filter(l => !l.hidden).map(l => [l.dataset.lane, l.children.length])")
        .await;
    assert_eq!(shown, serde_json::json!([["kid", 2]]), "the child's lifecycle change and text");
    page.cmd(serde_json::json!({"cmd": "press", "selector": ".tab[data-lane='']", "key": "Enter"})).await;

    // Replay of the stored run at 100x from the start, through the replay route.
    page.cmd(serde_json::json!({"cmd": "select", "selector": "#speed", "value": "100"})).await;
    page.cmd(serde_json::json!({"cmd": "click", "selector": "#replay-start"})).await;
    page.wait("window.__inspector.mode === 'replay'", 10_000).await;
    page.settled_at(every_last, 30_000).await;
    let items = page.cmd(serde_json::json!({"cmd": "items"})).await;
    compare(&items, &view["view"]);
    // Jump back to seq 5: the view at 5, as the query folds it after 5 events.
    page.eval("(() => { const i = document.getElementById('replay-at'); i.value = '5'; return true; })()")
        .await;
    page.cmd(serde_json::json!({"cmd": "click", "selector": "#jump-form button"})).await;
    page.settled_at(5, 30_000).await;
    let items = page.cmd(serde_json::json!({"cmd": "items"})).await;
    let keys: Vec<i64> = items.as_array().expect("items").iter().filter_map(|i| i["seq"].as_i64()).collect();
    assert!(!keys.is_empty() && keys.iter().all(|s| *s <= 5), "only items of seq <= 5: {keys:?}");

    // A JSONL export from disk, replayed without importing it.
    let (status, export) = t.get_text(&t.key_a, &format!("/v1/runs/{every}/events.jsonl")).await;
    assert!(status.is_success());
    let file = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui-every-type.jsonl");
    std::fs::write(&file, export).expect("write the export");
    let runs_before = t.count_rows("runs").await;
    page.cmd(serde_json::json!({"cmd": "file", "selector": "#file", "path": file})).await;
    page.wait("window.__inspector.mode === 'file'", 20_000).await;
    page.settled_at(every_last, 30_000).await;
    let items = page.cmd(serde_json::json!({"cmd": "items"})).await;
    compare(&items, &view["view"]);
    assert_eq!(t.count_rows("runs").await, runs_before, "the file was folded, not imported");

    // Narrow window.
    page.cmd(serde_json::json!({"cmd": "viewport", "width": 400, "height": 800})).await;
    page.shot("ui-narrow.png").await;
    let overflow = page.eval("document.documentElement.scrollWidth <= window.innerWidth + 1").await;
    assert_eq!(overflow, true, "nothing wider than a 400 px window");
    page.cmd(serde_json::json!({"cmd": "viewport", "width": 1280, "height": 800})).await;

    // 10,000 events: drawn in batches, the main thread never blocked for long.
    let big = t.create_run(&t.key_a).await;
    let events = agent_stream_core::testkit::generated_run_mix(3, 10_000, 60);
    let big_last = append_chunks(&t, &t.key_a, &big, &events).await;
    assert!(big_last >= 10_000, "{big_last}");
    page.cmd(serde_json::json!({"cmd": "open", "url": format!("{}/ui/runs/{big}", t.base)})).await;
    page.settled_at(big_last, 120_000).await;
    let report = page.clean().await;
    let longest = report["longest"].as_f64().unwrap_or(f64::MAX);
    eprintln!("10,000-event run: longest main-thread task {longest} ms");
    assert!(longest < 1_500.0, "the tab froze for {longest} ms");
    let items = page.cmd(serde_json::json!({"cmd": "items"})).await;
    let view = view_of(&t, &t.base, &t.key_a, &big).await;
    compare(&items, &view["view"]);
    page.quit().await;
}

fn text(n: usize, tag: &str) -> Vec<Value> {
    (0..n)
        .map(|i| serde_json::json!({"type": "text.delta", "payload": {"text": format!("{tag}{i} ")}}))
        .collect()
}

/// A run followed live by the page while the service it talks to is SIGKILLed and
/// started again, with events appended (through another instance) while it is down:
/// the page ends with exactly the query's view, every seq once, none skipped.
#[tokio::test]
async fn inspector_follows_a_live_run_across_a_service_sigkill() {
    let t = TestApp::new().await;
    let mut server = Serve::start(&t, &[]).await;
    let base = server.base.clone();
    let run = t.create_run(&t.key_a).await;
    let mut first = vec![
        serde_json::json!({"type": "run.lifecycle", "payload": {"state": "running"}}),
        serde_json::json!({"type": "message.start", "payload": {"message_id": "u1", "role": "user"}}),
        serde_json::json!({"type": "text.delta", "payload": {"text": "compare two prices"}}),
        serde_json::json!({"type": "message.end", "payload": {"message_id": "u1", "stop_reason": "end_turn"}}),
        serde_json::json!({"type": "message.start", "payload": {"message_id": "a1", "role": "assistant"}}),
        serde_json::json!({"type": "reasoning.delta", "payload": {"text": "look both up"}}),
    ];
    first.extend(text(5, "before"));
    let before = t.append_ok_at(&base, &t.key_a, &run, Value::Array(first)).await.1;

    let mut page = Page::launch().await;
    page.cmd(serde_json::json!({"cmd": "open", "url": format!("{base}/ui/runs/{run}#key={}", t.key_a)}))
        .await;
    page.settled_at(before, 30_000).await;
    // Live: appended while the page watches.
    let live = t.append_ok_at(&base, &t.key_a, &run, Value::Array(text(5, "live"))).await.1;
    page.settled_at(live, 30_000).await;

    server.kill().await;
    page.wait("document.getElementById('connection').textContent !== 'live'", 20_000).await;
    // Written while the page's service is down, through the in-process instance.
    let mut down = text(5, "down");
    down.push(serde_json::json!({"type": "tool.start", "payload": {"call_id": "c1", "tool": "shop.price", "input": {"item": "a"}}}));
    let down_last = t.append_ok(&t.key_a, &run, Value::Array(down)).await.1;
    page.shot("ui-live-down.png").await;

    server.restart().await;
    page.settled_at(down_last, 60_000).await;
    let mut after = vec![
        serde_json::json!({"type": "tool.progress", "payload": {"call_id": "c1", "data": {"pct": 50}}}),
        serde_json::json!({"type": "tool.end", "payload": {"call_id": "c1", "ok": true, "output": {"price": 3}}}),
    ];
    after.extend(text(5, "after"));
    after.push(serde_json::json!({"type": "message.end", "payload": {"message_id": "a1", "stop_reason": "end_turn"}}));
    after.push(
        serde_json::json!({"type": "run.lifecycle", "payload": {"state": "done", "reason": "finished"}}),
    );
    let last = t.append_ok_at(&base, &t.key_a, &run, Value::Array(after)).await.1;
    page.settled_at(last, 30_000).await;

    let probe = page.eval("({gaps: window.__inspector.gaps, repeats: window.__inspector.repeats, reconnects: window.__inspector.reconnects, updates: window.__inspector.updates})").await;
    eprintln!("live across SIGKILL: {probe}");
    assert_eq!(probe["gaps"], serde_json::json!([]), "no seq skipped");
    assert_eq!(probe["repeats"], serde_json::json!([]), "no complete seq received twice");
    assert!(probe["reconnects"].as_i64().unwrap_or(0) >= 1, "the socket was lost and opened again");
    let items = page.cmd(serde_json::json!({"cmd": "items"})).await;
    let view = view_of(&t, &t.base, &t.key_a, &run).await;
    compare(&items, &view["view"]);
    let texts: Vec<&str> =
        items.as_array().expect("items").iter().filter_map(|i| i["text"].as_str()).collect();
    let assistant = texts.iter().find(|s| s.starts_with("before0")).expect("the assistant's bubble");
    for tag in ["before", "live", "down", "after"] {
        assert_eq!(assistant.matches(&format!("{tag}0 ")).count(), 1, "{tag} text once: {assistant}");
    }
    page.clean().await;
    page.shot("ui-live.png").await;
    page.quit().await;
    server.kill().await;
}

/// The plan approved from the page (keyboard), then checked through the API; the runs
/// list shows a new run as it is created (`runsActivity`).
#[tokio::test]
async fn inspector_approves_a_plan_and_lists_new_runs_live() {
    let t = TestApp::new().await;
    let mut page = Page::launch().await;
    // The login form, once: the key is typed, not in the URL.
    page.cmd(serde_json::json!({"cmd": "open", "url": format!("{}/ui/", t.base)})).await;
    page.wait("!document.getElementById('login').hidden", 10_000).await;
    page.eval(&format!(
        "(() => {{ document.getElementById('key-input').value = {}; return true; }})()",
        Value::String(t.key_a.clone())
    ))
    .await;
    page.cmd(serde_json::json!({"cmd": "press", "selector": "#key-input", "key": "Enter"})).await;
    page.wait("document.getElementById('connection').textContent === 'live'", 20_000).await;

    // A run made now appears in the list without a reload.
    let run = t.create_run(&t.key_a).await;
    page.wait(&format!("document.querySelector(\"a[data-run='{run}']\") !== null"), 20_000).await;
    let plan = serde_json::json!([
        {"type": "run.lifecycle", "payload": {"state": "planning"}},
        {"type": "plan.proposal", "payload": {"plan": {"id": "p1", "steps": [
            {"id": "s1", "title": "Search two shops", "intent": "research", "est_tools": ["web.search"], "est_cost_usd": 0.02},
            {"id": "s2", "title": "Compare the prices", "intent": "verify", "est_tools": [], "est_cost_usd": 0.01}
        ]}}},
        {"type": "run.lifecycle", "payload": {"state": "awaiting_approval"}}
    ]);
    let last = t.append_ok(&t.key_a, &run, plan).await.1;
    page.wait(
        &format!(
            "document.querySelector(\"a[data-run='{run}'] .badge\")?.textContent === 'awaiting-approval'"
        ),
        20_000,
    )
    .await;
    page.cmd(serde_json::json!({"cmd": "press", "selector": format!("a[data-run='{run}']"), "key": "Enter"}))
        .await;
    page.settled_at(last, 20_000).await;
    page.wait("document.querySelector('.plan .decide button.approve') !== null", 10_000).await;
    page.shot("ui-plan.png").await;
    // Hover: the item's seq and the time of its event (asked for then: the plan has none).
    page.cmd(serde_json::json!({"cmd": "hover", "selector": ".item.plan"})).await;
    page.wait("/^seq 2 · \\d{4}-\\d\\d-\\d\\dT/.test(document.querySelector('.item.plan').title)", 10_000)
        .await;
    page.cmd(serde_json::json!({"cmd": "press", "selector": ".plan .decide button.approve", "key": "Enter"}))
        .await;
    // The decision and the new state come back through the live view.
    page.wait("document.querySelector('.plan .decision')?.textContent === 'approved'", 20_000).await;

    let view = view_of(&t, &t.base, &t.key_a, &run).await;
    assert_eq!(view["view"]["plan"]["decision"]["decision"], "APPROVED", "{view}");
    assert_eq!(view["view"]["lifecycle"]["state"], "RUNNING", "{view}");
    let seq = view["lastSeq"].as_i64().expect("lastSeq");
    page.settled_at(seq, 20_000).await;
    let items = page.cmd(serde_json::json!({"cmd": "items"})).await;
    compare(&items, &view["view"]);
    // Pause and resume from the page's toolbar.
    page.cmd(serde_json::json!({"cmd": "click", "selector": "#pause-run"})).await;
    page.wait("document.getElementById('run-state').textContent === 'paused'", 20_000).await;
    page.cmd(serde_json::json!({"cmd": "click", "selector": "#resume-run"})).await;
    page.wait("document.getElementById('run-state').textContent === 'running'", 20_000).await;
    let view = view_of(&t, &t.base, &t.key_a, &run).await;
    let states: Vec<String> = view["view"]["lifecycle"]["transitions"]
        .as_array()
        .expect("t")
        .iter()
        .map(|x| word(&x["to"]))
        .collect();
    assert_eq!(states, ["planning", "awaiting-approval", "running", "paused", "running"]);
    page.clean().await;
    page.quit().await;
}

/// `POST /v1/fold`: the reducer's updates of an export, nothing stored; bad files get
/// the import's codes with their line; a key needs read scope; the size is capped.
#[tokio::test]
async fn fold_answers_the_views_of_an_export_and_stores_nothing() {
    use agent_stream::auth::Scope;
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    let last = t.append_ok(&t.key_a, &run, crate::common::every_type()).await.1;
    let (_, export) = t.get_text(&t.key_a, &format!("/v1/runs/{run}/events.jsonl")).await;
    let rows = (t.count_rows("runs").await, t.count_rows("agent_run_events").await);
    let fold = |key: Option<String>, body: Vec<u8>| {
        let mut req = t
            .http
            .post(format!("{}/v1/fold", t.base))
            .header("content-type", "application/x-ndjson")
            .body(body);
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        async move {
            let r = req.send().await.expect("send");
            (r.status().as_u16(), r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, folded) = fold(Some(t.key_a.clone()), export.clone().into_bytes()).await;
    assert_eq!(status, 200, "{folded}");
    assert_eq!(folded["last_seq"], last);
    assert_eq!(folded["events"].as_array().map(Vec::len), Some(last as usize));
    // The last view equals the stored run's view (the same reducer over the same log).
    let stored = t.get_json(&t.key_a, &format!("/v1/runs/{run}/view")).await;
    assert_eq!(folded["view"], stored, "the fold of the file is the run's view");
    assert_eq!(folded["initial"]["seq"], 0);
    let seqs: Vec<i64> =
        folded["updates"].as_array().expect("updates").iter().filter_map(|u| u["seq"].as_i64()).collect();
    assert!(seqs.windows(2).all(|w| w[0] <= w[1]) && seqs.first() == Some(&1) && seqs.last() == Some(&last));
    assert_eq!((t.count_rows("runs").await, t.count_rows("agent_run_events").await), rows, "nothing stored");

    // A bad line: the import's code, blamed by its number.
    let mut bad = export.lines().take(3).collect::<Vec<_>>().join("\n");
    bad.push_str("\n{\"ts\":\"2026-01-01T00:00:00Z\",\"type\":\"nope\",\"seq\":4,\"payload\":{}}\n");
    let (status, err) = fold(Some(t.key_a.clone()), bad.into_bytes()).await;
    assert_eq!((status, err["error"]["code"].as_str()), (422, Some("EVENT-UNKNOWN-TYPE")), "{err}");
    assert!(err["error"]["message"].as_str().unwrap_or_default().starts_with("line 4:"), "{err}");
    let (status, err) = fold(Some(t.key_a.clone()), b"\n".to_vec()).await;
    assert_eq!(err["error"]["code"], "BATCH-EMPTY", "{status} {err}");
    // Keys: none is refused, and so is one without read scope.
    let (status, _) = fold(None, export.clone().into_bytes()).await;
    assert_eq!(status, 401);
    let writer = t.key_for_a(&[Scope::Write]).await.secret;
    let (status, err) = fold(Some(writer), export.clone().into_bytes()).await;
    assert_eq!(status, 403, "{err}");
    // Larger than 16 MiB: refused before it is read.
    let (status, err) = fold(Some(t.key_a.clone()), vec![b' '; (16 << 20) + 1]).await;
    assert_eq!((status, err["error"]["code"].as_str()), (413, Some("BODY-TOO-LARGE")), "{err}");

    // A small file whose answer would be huge: every update of a message carries its
    // text so far, so 1,500 deltas of 100 characters make ~110 MB of updates from a
    // ~250 KB file. The fold stops at the answer's limit instead of filling memory.
    let long = t.create_run(&t.key_a).await;
    let mut events =
        vec![json!({"type": "message.start", "payload": {"message_id": "m", "role": "assistant"}})];
    events
        .extend((0..1_500).map(|i| json!({"type": "text.delta", "payload": {"text": format!("{i:>100}")}})));
    t.append_ok(&t.key_a, &long, Value::Array(events)).await;
    let (_, export) = t.get_text(&t.key_a, &format!("/v1/runs/{long}/events.jsonl")).await;
    assert!(export.len() < 1 << 20, "the file is small: {} bytes", export.len());
    let (status, err) = fold(Some(t.key_a.clone()), export.into_bytes()).await;
    assert_eq!((status, err["error"]["code"].as_str()), (413, Some("BODY-TOO-LARGE")), "{err}");
    let message = err["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("64 MiB") && message.contains("/v1/runs/import"), "{err}");
}

/// The page and its assets: their types, `no-cache` with an ETag that answers 304, the
/// same shell for a run's address, a 404 for anything else.
#[tokio::test]
async fn inspector_pages_are_served_from_the_binary_with_types_and_validators() {
    let t = TestApp::new().await;
    for (path, ty) in [
        ("/ui/", "text/html"),
        ("/ui/runs/01M82EFA61SA47S6546MJGZGF7", "text/html"),
        ("/ui/assets/app.js", "text/javascript"),
        ("/ui/assets/view.js", "text/javascript"),
        ("/ui/assets/gqlws.js", "text/javascript"),
        ("/ui/assets/style.css", "text/css"),
    ] {
        let r = t.http.get(format!("{}{path}", t.base)).send().await.expect("send");
        assert_eq!(r.status(), 200, "{path}");
        let h = r.headers().clone();
        let header = |n: &str| h.get(n).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        assert!(header("content-type").starts_with(ty), "{path}: {}", header("content-type"));
        assert_eq!(header("cache-control"), "no-cache", "{path}");
        assert_eq!(header("x-content-type-options"), "nosniff", "{path}");
        let etag = header("etag");
        assert!(etag.starts_with('"'), "{path}: {etag}");
        let body = r.text().await.expect("body");
        assert!(!body.contains("https://") || path.ends_with(".js"), "{path}: nothing from another site");
        let again = t
            .http
            .get(format!("{}{path}", t.base))
            .header("if-none-match", &etag)
            .send()
            .await
            .expect("send");
        assert_eq!(again.status(), 304, "{path}");
    }
    let page = t.http.get(format!("{}/ui/", t.base)).send().await.expect("send").text().await.expect("html");
    assert!(page.contains("/ui/assets/app.js") && page.contains("type=\"module\""), "{page}");
    let r = t.http.get(format!("{}/ui/assets/nope.js", t.base)).send().await.expect("send");
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"]["code"], "NOT-FOUND");
}
