//! GraphiQL in a real browser with no network: Debian's chromium, headless, driven by
//! `playwright-core` (`tests/browser/`), with every request to anything but this machine
//! refused. The IDE must load from the service alone and answer a query; the
//! screenshot is kept in Cargo's target tmp directory.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::common::TestApp;

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
