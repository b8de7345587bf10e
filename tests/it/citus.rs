//! On Citus (the suite's second pass, `DATABASE_URL` at a coordinator): the log is
//! distributed by tenant and co-located, row-level security on the workers sees the
//! tenant each transaction sets, and the service's appends, reads and wake-ups are
//! router queries: each goes to one worker, in a counted number of round trips. On plain
//! PostgreSQL these tests return at once.

use std::time::Duration;

use agent_stream::app::App;
use agent_stream::storage::{db, Db, DbConfig};
use futures::StreamExt;
use serde_json::json;

use crate::common::TestApp;

/// Skips on plain PostgreSQL (saying so), so the first pass stays what it was.
async fn on_citus(t: &TestApp) -> bool {
    let citus = t.db.citus().await;
    if !citus {
        eprintln!("not a Citus coordinator: nothing to check here");
    }
    citus
}

#[tokio::test]
async fn the_log_is_distributed_by_tenant_and_co_located() {
    let t = TestApp::new().await;
    if !on_citus(&t).await {
        return;
    }
    let rows = t
        .db
        .owner()
        .await
        .query(
            "SELECT c.relname::text, p.partmethod::text, column_to_column_name(p.logicalrelid, p.partkey),
                    p.colocationid
             FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid
             WHERE c.relnamespace = current_schema()::regnamespace ORDER BY 1",
            &[],
        )
        .await
        .expect("pg_dist_partition");
    let tables: Vec<(String, String, Option<String>, i32)> =
        rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))).collect();
    let find =
        |name: &str| tables.iter().find(|t| t.0 == name).unwrap_or_else(|| panic!("{name}: {tables:?}"));
    for reference in ["analyst_logins", "api_keys", "tenants"] {
        assert_eq!(find(reference).1, "n", "{reference} is a reference table");
    }
    let (runs, events) = (find("runs"), find("agent_run_events"));
    assert_eq!((runs.1.as_str(), runs.2.as_deref()), ("h", Some("tenant_id")), "runs by tenant_id");
    assert_eq!((events.1.as_str(), events.2.as_deref()), ("h", Some("tenant_id")), "events by tenant_id");
    assert_eq!(runs.3, events.3, "co-located");
    let tombstones = find("run_tombstones");
    assert_eq!(
        (tombstones.1.as_str(), tombstones.2.as_deref()),
        ("h", Some("tenant_id")),
        "tombstones by tenant_id"
    );
    assert_eq!(runs.3, tombstones.3, "tombstones co-located with runs");
    assert_eq!(tables.len(), 6, "schema_migrations stays local: {tables:?}");
    // Citus turns TLS on with a self-made X.509 v1 certificate, which webpki will not
    // parse: sslmode=prefer (the default) must still take TLS, checking the handshake's
    // signature with that certificate's key.
    let owner = t.db.owner().await;
    let offered: String = owner.query_one("SHOW ssl", &[]).await.expect("ssl").get(0);
    let used: bool = owner
        .query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[])
        .await
        .expect("pg_stat_ssl")
        .get(0);
    let over_tcp = t.db.url.contains("127.0.0.1") || t.db.url.contains("localhost");
    if offered == "on" && over_tcp && !t.db.url.contains("sslmode=disable") {
        assert!(used, "TLS with the coordinator's own certificate");
    }
}

/// The service's pool, its tenant scoping and a query that names no tenant: only the
/// workers' policies can filter it, so each count below is right only if the workers
/// saw the tenant of that transaction (and not the previous one on the same
/// connection). Scoped with `set_config` instead, which Citus does not pass on, the
/// workers see no tenant and every count is 0: that is checked too.
#[tokio::test]
async fn row_level_security_on_the_workers_sees_each_transactions_tenant() {
    let t = TestApp::new().await;
    if !on_citus(&t).await {
        return;
    }
    let run_a = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run_a, json!([{"type": "custom.a"}, {"type": "custom.a"}, {"type": "custom.a"}]))
        .await;
    let run_b = t.create_run(&t.key_b).await;
    t.append_ok(&t.key_b, &run_b, json!([{"type": "custom.b"}])).await;
    // One pooled connection, used for a, b, a, nobody: the same worker connections
    // carry each transaction.
    let mut client = t.app.db.pool.get().await.expect("pooled connection");
    let mut counts = vec![];
    for tenant in [&t.tenant_a, &t.tenant_b, &t.tenant_a] {
        let tx = db::tenant_tx(&mut client, tenant).await.expect("scoped transaction");
        let events: i64 =
            tx.query_one("SELECT count(*) FROM agent_run_events", &[]).await.expect("count").get(0);
        let runs: i64 = tx.query_one("SELECT count(*) FROM runs", &[]).await.expect("count").get(0);
        tx.commit().await.expect("commit");
        counts.push((events, runs));
    }
    assert_eq!(counts, vec![(3, 1), (1, 1), (3, 1)], "each transaction sees its own tenant's rows");
    // A row of tenant a written in tenant b's transaction: refused on the worker.
    let tx = db::tenant_tx(&mut client, &t.tenant_b).await.expect("scoped transaction");
    let forged = tx
        .execute(
            "INSERT INTO agent_run_events (tenant_id, run_id, seq, id, ts, type, payload)
             VALUES ($1, $2, 99, 'x', now(), 'custom.x', '{}')",
            &[&t.tenant_a, &run_a],
        )
        .await
        .expect_err("another tenant's row");
    assert!(format!("{forged:?}").contains("row-level security"), "{forged:?}");
    drop(tx);
    // The control: the setting made with set_config stays on the coordinator.
    let tx = client.transaction().await.expect("transaction");
    tx.execute("SELECT set_config('agent_stream.tenant_id', $1, true)", &[&t.tenant_a])
        .await
        .expect("set_config");
    let seen: i64 = tx.query_one("SELECT count(*) FROM agent_run_events", &[]).await.expect("count").get(0);
    assert_eq!(seen, 0, "the workers did not see a set_config() tenant");
}

/// One command Citus sent to a worker: the statement and the node.
#[derive(Debug)]
struct Remote {
    command: String,
    node: String,
}

/// Reads what the coordinator logged past `from` (bytes into its log file) and
/// returns the remote commands and the new end.
async fn remote_commands(owner: &tokio_postgres::Client, from: i64) -> (Vec<Remote>, i64) {
    let size: i64 =
        owner.query_one("SELECT size FROM pg_stat_file('log')", &[]).await.expect("log size").get(0);
    let text: String = owner
        .query_one("SELECT pg_read_file('log', $1, $2)", &[&from, &(size - from)])
        .await
        .expect("read log")
        .get(0);
    let mut out: Vec<Remote> = vec![];
    for line in text.lines() {
        if let Some((_, cmd)) = line.split_once("NOTICE:  issuing ") {
            out.push(Remote { command: cmd.to_owned(), node: String::new() });
        } else if let Some((_, detail)) = line.split_once("DETAIL:  on server ") {
            if let Some(last) = out.last_mut().filter(|r| r.node.is_empty()) {
                last.node = detail.split(" connectionId").next().unwrap_or_default().to_owned();
            }
        } else if let Some(last) = out.last_mut().filter(|r| r.node.is_empty()) {
            // The rest of a statement that spans lines.
            last.command.push('\n');
            last.command.push_str(line);
        }
    }
    (out, size)
}

/// Reads an SSE body until the frame with `id: seq` has arrived.
async fn wait_for(
    body: &mut futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    seen: &mut String,
    seq: i64,
) {
    let needle = format!("id: {seq}\n");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !seen.contains(&needle) {
        let chunk = tokio::time::timeout_at(deadline, body.next()).await.expect("a frame in 15 s");
        seen.push_str(&String::from_utf8_lossy(&chunk.expect("open").expect("chunk")));
    }
}

/// `url` with server options added, in its own syntax.
fn with_options(url: &str, options: &str) -> String {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}options={}", options.replace(' ', "%20").replace('=', "%3D"))
    } else {
        format!("{url} options='{options}'")
    }
}

/// A pool on the test's schema whose connections make the coordinator log every command
/// it sends to a worker.
fn logging_pool(t: &TestApp) -> Db {
    let url = with_options(&t.db.url, "-c citus.log_remote_commands=on -c log_min_messages=notice");
    Db::new(&DbConfig { url, schema: t.db.schema.clone(), max_connections: 4 }).expect("pool")
}

/// A second service instance on the test's schema whose connections make the
/// coordinator log every command it sends to a worker.
async fn logging_instance(t: &TestApp) -> String {
    crate::common::serve_app("127.0.0.1:0", App::new(logging_pool(t), t.app.settings.clone())).await.0
}

/// Round trips of an append, a read and a live subscriber's wake-up, counted from the
/// commands the coordinator sends to the workers: every one goes to one worker (a
/// router transaction), and their number stays what the README says.
#[tokio::test]
async fn appends_reads_and_wake_ups_are_router_transactions() {
    let t = TestApp::new().await;
    if !on_citus(&t).await {
        return;
    }
    let owner = t.db.owner().await;
    owner.query_one("SELECT size FROM pg_stat_file('log')", &[]).await.expect(
        "this test reads the coordinator's log at <data_directory>/log, where ../shared/citus/cluster.sh puts it",
    );
    let logging = logging_instance(&t).await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}])).await;
    // The key is looked up once, then cached: warm the logging instance's cache.
    let (status, _) = t.append_at(&logging, &t.key_a, &run, &json!([{"type": "custom.warm"}])).await;
    assert!(status.is_success());
    let mut from: i64 = 0;
    (_, from) = remote_commands(&owner, from).await;

    let mut costs = vec![];
    // The budgets the README states: BEGIN with the run's lock, the INSERT's rows sent
    // as an intermediate result, the INSERT, the UPDATE, and a two-phase COMMIT (Citus
    // commits an INSERT ... SELECT run by the coordinator in two phases, even on one
    // worker); a read's BEGIN, run row, page and COMMIT; a wake-up's page alone.
    let mut check = |what: &str, budget: usize, cmds: Vec<Remote>| {
        // The worker, whichever role the command ran as (the listener checks the run's
        // newest seq as the schema's owner).
        let nodes: std::collections::BTreeSet<&str> =
            cmds.iter().map(|r| r.node.rsplit('@').next().unwrap_or(&r.node)).collect();
        eprintln!("{what}: {} round trips to {nodes:?}", cmds.len());
        for c in &cmds {
            eprintln!("    {}", c.command.lines().next().unwrap_or_default());
        }
        assert_eq!(nodes.len(), 1, "{what} is a router transaction: {cmds:#?}");
        assert!(
            cmds.iter().all(|c| !c.command.contains("SET LOCAL agent_stream.tenant_id")
                || c.command.contains(&t.tenant_a)),
            "{what} is scoped to its tenant on the worker"
        );
        assert!(cmds.len() <= budget, "{what}: {} round trips, budget {budget}", cmds.len());
        costs.push((what.to_owned(), cmds.len()));
    };

    // An append of one event (group commit, the default).
    t.append_ok_at(&logging, &t.key_a, &run, json!([{"type": "custom.one"}])).await;
    let (cmds, end) = remote_commands(&owner, from).await;
    from = end;
    check("append of 1 event", 7, cmds);

    // An append of 100 events (committed on its own).
    let batch: Vec<_> =
        (0..100).map(|i| json!({"type": "text.delta", "payload": {"text": format!("{i}")}})).collect();
    t.append_ok_at(&logging, &t.key_a, &run, json!(batch)).await;
    let (cmds, end) = remote_commands(&owner, from).await;
    from = end;
    check("append of 100 events", 7, cmds);

    // A read of a page of events.
    let r =
        t.http.get(format!("{logging}/v1/runs/{run}/events?after_seq=0")).bearer_auth(&t.key_a).send().await;
    assert_eq!(r.expect("read").status(), 200);
    let (cmds, end) = remote_commands(&owner, from).await;
    from = end;
    check("read of a page", 4, cmds);

    // A live subscriber on the logging instance, woken by an append on the other one
    // (NOTIFY on the coordinator, LISTEN on the coordinator): its feed reads once.
    let sse = t
        .http
        .get(format!("{logging}/v1/runs/{run}/stream?detail=full"))
        .bearer_auth(&t.key_a)
        .send()
        .await
        .expect("stream");
    let mut body = sse.bytes_stream().boxed();
    let mut seen = String::new();
    wait_for(&mut body, &mut seen, 103).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    (_, from) = remote_commands(&owner, from).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "custom.live"}])).await;
    wait_for(&mut body, &mut seen, 104).await;
    let (cmds, end) = remote_commands(&owner, from).await;
    from = end;
    check("subscription wake-up", 4, cmds);

    // Feeds woken together read in one statement: still one worker, the tenant's.
    let second = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &second, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}])).await;
    let pool = logging_pool(&t);
    let client = pool.pool.get().await.expect("connection");
    (_, from) = remote_commands(&owner, from).await;
    let asks = [(run.clone(), 100), (second.clone(), 0)];
    let read = agent_stream::storage::events::read_after_many(&client, &t.tenant_a, &asks, 1000).await;
    let counts: Vec<usize> = read.expect("combined read").iter().map(Vec::len).collect();
    assert_eq!(counts, [4, 1], "the rows after each cursor");
    let (cmds, _) = remote_commands(&owner, from).await;
    check("combined read of two runs", 4, cmds);
    eprintln!("round trips to the worker: {costs:?}");
}
