//! Test harness: a real PostgreSQL, one fresh schema per test, a real server on
//! 127.0.0.1:0 spoken to over HTTP.
//!
//! The database is `DATABASE_URL` when set, else the local server on 127.0.0.1:5432
//! (database `test`), else a private cluster started from the machine's binaries.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agent_stream::app::{App, AppRef, Settings};
use agent_stream::auth::Scope;
use agent_stream::storage::{db, migrate, tenants, Db, DbConfig};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::sync::OnceCell;

static BASE_URL: OnceCell<String> = OnceCell::const_new();
static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Serves `app`'s routes on `addr` (`127.0.0.1:0` for any free port) as `serve` does
/// (no Nagle delay, the routes built once): the base URL, and the server's task.
pub async fn serve_app(addr: &str, app: AppRef) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let router = agent_stream::http::router(app);
    let task = tokio::spawn(async move {
        agent_stream::server::serve_http(
            agent_stream::server::no_delay(listener),
            router,
            std::future::pending(),
        )
        .await;
    });
    (base, task)
}

/// Where the tests' database server is.
pub async fn base_url() -> String {
    BASE_URL
        .get_or_init(|| async {
            if let Ok(url) = std::env::var("DATABASE_URL") {
                return url;
            }
            let local = "host=127.0.0.1 port=5432 user=postgres dbname=test connect_timeout=3".to_owned();
            if db::connect(&local).await.is_ok() {
                return local;
            }
            private_cluster().await
        })
        .await
        .clone()
}

/// Fallback: one private cluster shared by every test process, started under a file lock.
async fn private_cluster() -> String {
    let dir = std::env::temp_dir().join("agent-stream-test-pg");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let lock = std::fs::File::create(dir.join(".lock")).expect("lock file");
    let lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive).expect("flock");
    let emb = agent_stream::storage::embedded::Embedded::start(&dir)
        .await
        .expect("no database: set DATABASE_URL, run PostgreSQL on 127.0.0.1:5432, or install its binaries");
    drop(lock);
    emb.url()
}

/// A fresh schema with migrations applied.
pub struct TestDb {
    /// Owner connection string.
    pub url: String,
    /// This test's schema.
    pub schema: String,
}

impl TestDb {
    /// Creates and migrates a new schema.
    pub async fn new() -> TestDb {
        let db = TestDb::unmigrated().await;
        migrate::migrate(&db.url, &db.schema).await.expect("migrate");
        db
    }

    /// A schema name no one uses yet, not created.
    pub async fn unmigrated() -> TestDb {
        let url = base_url().await;
        let secs = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let schema = format!("t_{secs}_{}_{n}_{:04x}", std::process::id(), rand::random::<u16>());
        if n == 0 {
            agent_stream::storage::db::sweep_old_schemas(&url, "t", secs).await;
        }
        TestDb { url, schema }
    }

    /// True when the database has the Citus extension (the suite's second pass).
    pub async fn citus(&self) -> bool {
        let c = self.owner().await;
        c.query_opt("SELECT 1 FROM pg_extension WHERE extname = 'citus'", &[])
            .await
            .expect("pg_extension")
            .is_some()
    }

    /// An owner connection with search_path set to the schema.
    pub async fn owner(&self) -> tokio_postgres::Client {
        db::connect_owner(&self.url, &self.schema).await.expect("owner connection")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let (url, schema) = (self.url.clone(), self.schema.clone());
        // Drop runs inside the test's runtime; use a thread with its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            rt.block_on(async {
                let c = db::connect(&url).await.ok()?;
                let sql = format!("SET lock_timeout = '5s'; DROP SCHEMA IF EXISTS \"{schema}\" CASCADE");
                c.batch_execute(&sql).await.ok()
            })
        })
        .join();
    }
}

/// A running server on its own schema with two tenants, `a` and `b`.
pub struct TestApp {
    /// `http://127.0.0.1:<port>`
    pub base: String,
    /// Read+write key of tenant a.
    pub key_a: String,
    /// Read+write key of tenant b.
    pub key_b: String,
    /// Tenant ids.
    pub tenant_a: String,
    /// Tenant ids.
    pub tenant_b: String,
    /// The app behind the server.
    pub app: AppRef,
    /// HTTP client.
    pub http: reqwest::Client,
    /// The schema (dropped last).
    pub db: TestDb,
}

impl TestApp {
    /// Starts a server with default settings.
    pub async fn new() -> TestApp {
        Self::with_settings(Settings::default()).await
    }

    /// Starts a server with the given settings.
    pub async fn with_settings(settings: Settings) -> TestApp {
        // The server's warnings and errors, shown with a failing test's output.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
            .with_test_writer()
            .try_init();
        let db = TestDb::new().await;
        let mut owner = db.owner().await;
        let all = [Scope::Read, Scope::Write];
        let a = tenants::create_tenant(&mut owner, "a", &all).await.expect("tenant a");
        let b = tenants::create_tenant(&mut owner, "b", &all).await.expect("tenant b");
        let pool = Db::new(&DbConfig { url: db.url.clone(), schema: db.schema.clone(), max_connections: 12 })
            .expect("pool");
        let app = App::new(pool, settings);
        let (base, _) = serve_app("127.0.0.1:0", app.clone()).await;
        TestApp {
            base,
            key_a: a.secret,
            key_b: b.secret,
            tenant_a: a.tenant_id,
            tenant_b: b.tenant_id,
            app,
            http: reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("client"),
            db,
        }
    }

    /// A second service instance on the same schema (its own pool, hub and listener),
    /// as another `agent-stream serve` process would be. Returns its base URL.
    pub async fn second_instance(&self) -> String {
        let pool = Db::new(&DbConfig {
            url: self.db.url.clone(),
            schema: self.db.schema.clone(),
            max_connections: 8,
        })
        .expect("pool");
        serve_app("127.0.0.1:0", App::new(pool, self.app.settings.clone())).await.0
    }

    /// Issues another key for tenant `a` with `scopes`.
    pub async fn key_for_a(&self, scopes: &[Scope]) -> tenants::IssuedKey {
        let mut owner = self.db.owner().await;
        tenants::create_key(&mut owner, "a", scopes, None).await.expect("key")
    }

    /// [`TestApp::append_ok`] against another server (`base`) on the same schema.
    pub async fn append_ok_at(&self, base: &str, key: &str, run: &str, events: Value) -> (i64, i64) {
        let (status, v) = self.append_at(base, key, run, &events).await;
        assert!(status.is_success(), "append failed: {status} {v}");
        (v["first_seq"].as_i64().expect("first"), v["last_seq"].as_i64().expect("last"))
    }

    /// `GET path` as `key`: the status and the body as text.
    pub async fn get_text(&self, key: &str, path: &str) -> (StatusCode, String) {
        let r = self.http.get(format!("{}{path}", self.base)).bearer_auth(key).send().await.expect("send");
        let status = r.status();
        (status, r.text().await.expect("body"))
    }

    /// Rows in one of the schema's tables, counted on the owner connection (all tenants).
    pub async fn count_rows(&self, table: &str) -> i64 {
        let sql = format!("SELECT count(*) FROM {table}");
        self.db.owner().await.query_one(&sql, &[]).await.expect("count").get(0)
    }

    /// `POST /v1/runs` as `key`; returns the run id.
    pub async fn create_run(&self, key: &str) -> String {
        let r = self.http.post(format!("{}/v1/runs", self.base)).bearer_auth(key).send().await.expect("send");
        assert_eq!(r.status(), StatusCode::CREATED);
        let v: Value = r.json().await.expect("json");
        v["run_id"].as_str().expect("run_id").to_owned()
    }

    /// `POST /v1/runs/{run}/events` with a JSON body; returns status and body.
    pub async fn append(&self, key: &str, run: &str, body: &Value) -> (StatusCode, Value) {
        self.append_at(&self.base, key, run, body).await
    }

    /// [`TestApp::append`] against another server (`base`) on the same schema.
    pub async fn append_at(&self, base: &str, key: &str, run: &str, body: &Value) -> (StatusCode, Value) {
        let r = self
            .http
            .post(format!("{base}/v1/runs/{run}/events"))
            .bearer_auth(key)
            .json(body)
            .send()
            .await
            .expect("send");
        let status = r.status();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Appends and asserts success; returns `(first_seq, last_seq)`.
    pub async fn append_ok(&self, key: &str, run: &str, events: Value) -> (i64, i64) {
        let (s, v) = self.append(key, run, &events).await;
        assert!(s.is_success(), "append failed: {s} {v}");
        (v["first_seq"].as_i64().expect("first_seq"), v["last_seq"].as_i64().expect("last_seq"))
    }

    /// `GET path` as `key`, expecting 200 and a JSON body.
    pub async fn get_json(&self, key: &str, path: &str) -> Value {
        let r = self.http.get(format!("{}{path}", self.base)).bearer_auth(key).send().await.expect("send");
        assert_eq!(r.status(), StatusCode::OK, "GET {path}");
        r.json().await.expect("json")
    }

    /// Every stored event of a run, via the HTTP read path.
    pub async fn events(&self, key: &str, run: &str) -> Vec<Value> {
        let mut out = vec![];
        let mut after = 0;
        loop {
            let r = self
                .http
                .get(format!("{}/v1/runs/{run}/events?after_seq={after}&limit=10000", self.base))
                .bearer_auth(key)
                .send()
                .await
                .expect("send");
            assert_eq!(r.status(), StatusCode::OK);
            let v: Value = r.json().await.expect("json");
            let page = v["events"].as_array().expect("events").clone();
            if page.is_empty() {
                return out;
            }
            after = v["next_after_seq"].as_i64().expect("cursor");
            out.extend(page);
        }
    }

    /// Rows stored for `tenant`'s run, counted on the owner connection (outside RLS).
    pub async fn stored_count(&self, tenant: &str, run: &str) -> i64 {
        let c = self.db.owner().await;
        c.query_one(
            "SELECT count(*) FROM agent_run_events WHERE tenant_id = $1 AND run_id = $2",
            &[&tenant, &run],
        )
        .await
        .expect("count")
        .get(0)
    }

    /// A GraphQL request as `key` (or anonymous).
    pub async fn graphql(&self, key: Option<&str>, query: &str, variables: Value) -> Value {
        let mut req = self
            .http
            .post(format!("{}/graphql", self.base))
            .json(&json!({"query": query, "variables": variables}));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        let r = req.send().await.expect("send");
        r.json().await.expect("json")
    }
}

/// One event of each built-in type, in an order the guard accepts, plus a custom one.
pub fn every_type() -> Value {
    json!([
        {"type": "run.lifecycle", "payload": {"state": "planning", "reason": "accepted"}},
        {"type": "plan.proposal", "payload": {"plan": {"id": "p1", "run_id": "r", "steps": [
            {"id": "s1", "title": "Research", "intent": "research", "est_tools": ["web.search"], "est_cost_usd": 0.02}
        ], "est_total_cost_usd": 0.02}}},
        {"type": "run.lifecycle", "payload": {"state": "running"}},
        {"type": "message.start", "payload": {"message_id": "m1", "role": "assistant"}},
        {"type": "reasoning.delta", "payload": {"text": "thinking…", "message_id": "m1"}},
        {"type": "text.delta", "payload": {"text": "Hello, "}},
        {"type": "text.delta", "payload": {"text": "world ✓", "message_id": "m1"}},
        {"type": "message.end", "payload": {"message_id": "m1", "stop_reason": "tool_use", "text": "Hello, world ✓"}},
        {"type": "tool.start", "payload": {"call_id": "c1", "tool": "browser.navigate", "input": {"url": "https://example.com"}, "skill_id": "compare@0.2.0"}},
        {"type": "tool.progress", "payload": {"call_id": "c1", "data": {"pct": 50}}},
        {"type": "tool.end", "payload": {"call_id": "c1", "ok": false, "error": "KAI-TOOL-0001", "duration_ms": 1842, "blob_ref": "blob://x"}},
        {"type": "step.boundary", "payload": {"step_index": 1, "step_kind": "tool-roundtrip", "checkpoint_id": "ck1"}},
        {"type": "child.spawn", "payload": {"child_id": "kid", "prompt": "look it up", "tools_allowed": ["web"]}},
        {"type": "run.lifecycle", "child_id": "kid", "payload": {"state": "running"}},
        {"type": "text.delta", "child_id": "kid", "payload": {"text": "child text"}},
        {"type": "compaction.start", "payload": {}},
        {"type": "compaction.end", "payload": {"removed": 24, "kept": 8, "tokens_removed": 45000, "tokens_kept": 12000, "reason": "tokens"}},
        {"type": "custom.note", "payload": {"anything": [1, 2, {"x": null}]}},
        {"type": "run.lifecycle", "payload": {"state": "done", "reason": "finished"}}
    ])
}
