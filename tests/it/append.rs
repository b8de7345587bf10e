//! The append path: round trip, gapless seqs under concurrency, idempotency, optimistic
//! concurrency, NDJSON framing.

use agent_stream::domain::{Batch, Event, EventBody, NewEvent, Origin};
use agent_stream::storage;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::{every_type, TestApp, TestDb};

#[tokio::test]
async fn every_event_type_round_trips_through_the_log() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    let sent = every_type();
    let n = sent.as_array().unwrap().len() as i64;
    assert_eq!(t.append_ok(&t.key_a, &run, sent.clone()).await, (1, n));

    let stored = t.events(&t.key_a, &run).await;
    assert_eq!(stored.len() as i64, n);
    let mut prev_id = String::new();
    for (i, (got, want)) in stored.iter().zip(sent.as_array().unwrap()).enumerate() {
        // Envelope assigned by the server.
        assert_eq!(got["seq"], json!(i as i64 + 1));
        assert_eq!(got["run_id"], json!(run));
        let id = got["id"].as_str().unwrap().to_owned();
        assert!(id > prev_id, "ids must increase: {prev_id} then {id}");
        prev_id = id;
        assert!(got["ts"].as_str().unwrap().ends_with('Z'));
        // Body as sent (typed comparison: canonical form drops nothing).
        assert_eq!(got["type"], want["type"]);
        assert_eq!(got["child_id"], want.get("child_id").cloned().unwrap_or(Value::Null));
        let want_body = EventBody::parse(want["type"].as_str().unwrap(), want["payload"].clone()).unwrap();
        let got_body = EventBody::parse(got["type"].as_str().unwrap(), got["payload"].clone()).unwrap();
        assert_eq!(got_body, want_body, "event {i}");
        // T1: the stored envelope deserialises into the Rust model and back, losslessly.
        let ev: Event = serde_json::from_value(got.clone()).unwrap();
        assert_eq!(serde_json::to_value(&ev).unwrap(), *got);
    }
}

#[tokio::test]
async fn plan_decision_round_trips_when_the_service_writes_it() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(
        &t.key_a,
        &run,
        json!([
            {"type": "run.lifecycle", "payload": {"state": "planning"}},
            {"type": "plan.proposal", "payload": {"plan": {"id": "p1", "steps": []}}},
            {"type": "run.lifecycle", "payload": {"state": "awaiting_approval"}}
        ]),
    )
    .await;
    let decision = json!({"plan_id": "p1", "decision": "approved", "reason": "lgtm", "decided_by": "key1"});
    let batch = Batch {
        events: vec![NewEvent {
            child_id: None,
            key: None,
            body: EventBody::parse("plan.decision", decision.clone()).unwrap(),
        }],
        expected_last_seq: Some(3),
    };
    let out =
        storage::append(&t.app.db, &t.app.guards, &t.tenant_a, &run, &batch, Origin::Service).await.unwrap();
    assert_eq!((out.first_seq, out.last_seq), (4, 4));
    let stored = t.events(&t.key_a, &run).await;
    assert_eq!(stored[3]["type"], "plan.decision");
    assert_eq!(stored[3]["payload"], decision);
}

#[tokio::test]
async fn concurrent_producers_get_gapless_seqs_in_their_own_order() {
    const PRODUCERS: usize = 32;
    const BATCHES: usize = 100;
    const PER_BATCH: usize = 3;
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    let mut tasks = vec![];
    for p in 0..PRODUCERS {
        let (http, base, key, run) = (t.http.clone(), t.base.clone(), t.key_a.clone(), run.clone());
        tasks.push(tokio::spawn(async move {
            for b in 0..BATCHES {
                let events: Vec<Value> = (0..PER_BATCH)
                    .map(|i| json!({"type": "custom.tick", "payload": {"p": p, "n": b * PER_BATCH + i}}))
                    .collect();
                let r = http
                    .post(format!("{base}/v1/runs/{run}/events"))
                    .bearer_auth(&key)
                    .json(&events)
                    .send()
                    .await
                    .expect("send");
                let status = r.status();
                let body: Value = r.json().await.expect("json");
                assert_eq!(status, StatusCode::CREATED, "{body}");
                let (first, last) = (body["first_seq"].as_i64().unwrap(), body["last_seq"].as_i64().unwrap());
                assert_eq!(last - first + 1, PER_BATCH as i64, "a batch's seqs are contiguous");
            }
        }));
    }
    for task in tasks {
        task.await.expect("producer");
    }
    let stored = t.events(&t.key_a, &run).await;
    let total = PRODUCERS * BATCHES * PER_BATCH;
    assert_eq!(stored.len(), total);
    let seqs: Vec<i64> = stored.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, (1..=total as i64).collect::<Vec<_>>(), "seqs are exactly 1..N");
    let mut next = vec![0u64; PRODUCERS];
    for e in &stored {
        let p = e["payload"]["p"].as_u64().unwrap() as usize;
        assert_eq!(e["payload"]["n"].as_u64().unwrap(), next[p], "producer {p} out of order");
        next[p] += 1;
    }
    let ids: Vec<&str> = stored.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids are monotonic in seq order");
}

#[tokio::test]
async fn idempotent_retry_returns_the_original_seqs_and_writes_nothing() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "custom.a", "payload": {}}])).await;
    let batch = json!([
        {"type": "text.delta", "payload": {"text": "x"}, "key": "k1"},
        {"type": "text.delta", "payload": {"text": "y"}, "key": "k2"}
    ]);
    let (s1, v1) = t.append(&t.key_a, &run, &batch).await;
    assert_eq!(s1, StatusCode::CREATED);
    assert_eq!(v1, json!({"first_seq": 2, "last_seq": 3, "replayed": false}));
    t.append_ok(&t.key_a, &run, json!([{"type": "custom.b", "payload": {}}])).await;

    let (s2, v2) = t.append(&t.key_a, &run, &batch).await;
    assert_eq!(s2, StatusCode::OK);
    assert_eq!(v2, json!({"first_seq": 2, "last_seq": 3, "replayed": true}));
    assert_eq!(t.stored_count(&t.tenant_a, &run).await, 4);

    // Same key, different content: refused, nothing written.
    let changed = json!([{"type": "text.delta", "payload": {"text": "z"}, "key": "k1"}]);
    let (s3, v3) = t.append(&t.key_a, &run, &changed).await;
    assert_eq!((s3, v3["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("IDEMPOTENCY-MISMATCH")));
    // A stored key mixed with a new one: refused, nothing written.
    let mixed = json!([
        {"type": "text.delta", "payload": {"text": "x"}, "key": "k1"},
        {"type": "text.delta", "payload": {"text": "w"}, "key": "k9"}
    ]);
    let (s4, v4) = t.append(&t.key_a, &run, &mixed).await;
    assert_eq!(
        (s4, v4["error"]["code"].as_str(), v4["error"]["index"].as_u64()),
        (StatusCode::CONFLICT, Some("IDEMPOTENCY-MISMATCH"), Some(1))
    );
    assert_eq!(t.stored_count(&t.tenant_a, &run).await, 4);

    // Retries racing each other: exactly one write.
    let race = json!([{"type": "custom.once", "payload": {"v": 1}, "key": "race"}]);
    let results = futures::future::join_all((0..8).map(|_| t.append(&t.key_a, &run, &race))).await;
    let written = results.iter().filter(|(s, _)| *s == StatusCode::CREATED).count();
    assert_eq!(written, 1, "{results:?}");
    assert!(results.iter().all(|(_, v)| v["first_seq"] == json!(5)), "{results:?}");
    assert_eq!(t.stored_count(&t.tenant_a, &run).await, 5);
}

#[tokio::test]
async fn expected_last_seq_conflict() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    let ok = json!({"events": [{"type": "custom.a", "payload": {}}], "expected_last_seq": 0});
    assert_eq!(t.append(&t.key_a, &run, &ok).await.0, StatusCode::CREATED);
    let (s, v) = t.append(&t.key_a, &run, &ok).await;
    assert_eq!(s, StatusCode::CONFLICT);
    assert_eq!(v["error"]["code"], "SEQ-CONFLICT");
    assert!(v["error"]["message"].as_str().unwrap().contains("is 1"), "{v}");
    // Query-string form.
    let r = t
        .http
        .post(format!("{}/v1/runs/{run}/events?expected_last_seq=1", t.base))
        .bearer_auth(&t.key_a)
        .json(&json!([{"type": "custom.b", "payload": {}}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(t.stored_count(&t.tenant_a, &run).await, 2);
}

#[tokio::test]
async fn ndjson_bodies_append_like_arrays() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    let body = "{\"type\":\"text.delta\",\"payload\":{\"text\":\"a\"}}\n\n{\"type\":\"text.delta\",\"payload\":{\"text\":\"b\"}}\n";
    let r = t
        .http
        .post(format!("{}/v1/runs/{run}/events", t.base))
        .bearer_auth(&t.key_a)
        .header("content-type", "application/x-ndjson")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let v: Value = r.json().await.unwrap();
    assert_eq!((v["first_seq"].as_i64(), v["last_seq"].as_i64()), (Some(1), Some(2)));
    let texts: Vec<Value> =
        t.events(&t.key_a, &run).await.iter().map(|e| e["payload"]["text"].clone()).collect();
    assert_eq!(texts, vec![json!("a"), json!("b")]);
}

#[tokio::test]
async fn sub_runs_record_parent_and_root() {
    let t = TestApp::new().await;
    let root = t.create_run(&t.key_a).await;
    let r = t
        .http
        .post(format!("{}/v1/runs", t.base))
        .bearer_auth(&t.key_a)
        .json(&json!({"parent_run_id": root}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let child: Value = r.json().await.unwrap();
    let r = t
        .http
        .post(format!("{}/v1/runs", t.base))
        .bearer_auth(&t.key_a)
        .json(&json!({"parent_run_id": child["run_id"]}))
        .send()
        .await
        .unwrap();
    let grandchild: Value = r.json().await.unwrap();
    assert_eq!(grandchild["parent_run_id"], child["run_id"]);
    assert_eq!(grandchild["root_run_id"], json!(root));
    // A parent of another tenant is not found, exactly like a parent that does not exist.
    let other = t.create_run(&t.key_b).await;
    let r = t
        .http
        .post(format!("{}/v1/runs", t.base))
        .bearer_auth(&t.key_a)
        .json(&json!({"parent_run_id": other}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

/// Group commit: 64 producers appending single events at once share transactions, and
/// every append keeps its own answer: accepted ones get gapless seqs in their run,
/// refused ones write nothing, retries are answered from the stored rows.
#[tokio::test]
async fn concurrent_single_event_appends_share_commits_and_keep_their_own_answers() {
    use std::sync::atomic::Ordering::Relaxed;
    let t = TestApp::new().await;
    let mut runs = vec![];
    for _ in 0..16 {
        let run = t.create_run(&t.key_a).await;
        t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}]))
            .await;
        runs.push(run);
    }
    let groups_before = t.app.metrics.commit_groups.load(Relaxed);
    let appends_before = t.app.metrics.appends.load(Relaxed);
    let mut tasks = vec![];
    for p in 0..64usize {
        let (http, base, key, run) = (t.http.clone(), t.base.clone(), t.key_a.clone(), runs[p % 16].clone());
        tasks.push(tokio::spawn(async move {
            let mut answers = vec![];
            for i in 0..20usize {
                // Every 7th append is invalid (a tool.end for a call never started).
                let body = if i % 7 == 3 {
                    json!([{"type": "tool.end", "payload": {"call_id": format!("none-{p}-{i}"), "ok": true}}])
                } else {
                    json!([{"type": "text.delta", "key": format!("k-{p}-{i}"), "payload": {"text": format!("{p}.{i} ")}}])
                };
                let r = http.post(format!("{base}/v1/runs/{run}/events")).bearer_auth(&key).json(&body).send().await.unwrap();
                let status = r.status().as_u16();
                let v: Value = r.json().await.unwrap();
                answers.push((i, status, v["first_seq"].as_i64(), body));
            }
            (run, answers)
        }));
    }
    let mut accepted: std::collections::HashMap<String, Vec<i64>> = Default::default();
    let (mut ok, mut refused) = (0, 0);
    let mut retries = vec![];
    for task in tasks {
        let (run, answers) = task.await.unwrap();
        for (i, status, seq, body) in answers {
            if i % 7 == 3 {
                assert!(status == 409 || status == 422, "invalid append refused: {status}");
                refused += 1;
            } else {
                assert_eq!(status, 201);
                accepted.entry(run.clone()).or_default().push(seq.unwrap());
                ok += 1;
                if i == 0 {
                    retries.push((run.clone(), body, seq.unwrap()));
                }
            }
        }
    }
    for (run, seqs) in &mut accepted {
        seqs.sort_unstable();
        assert_eq!(
            *seqs,
            (2..2 + seqs.len() as i64).collect::<Vec<_>>(),
            "run {run}: gapless, one seq per accepted append"
        );
        assert_eq!(
            t.stored_count(&t.tenant_a, run).await,
            1 + seqs.len() as i64,
            "refused appends wrote nothing"
        );
    }
    // Retries (same keys) get the original seqs and write nothing.
    for (run, body, seq) in retries.iter().take(8) {
        let r = t
            .http
            .post(format!("{}/v1/runs/{run}/events", t.base))
            .bearer_auth(&t.key_a)
            .json(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        assert_eq!((v["first_seq"].as_i64(), v["replayed"].as_bool()), (Some(*seq), Some(true)));
    }
    let groups = t.app.metrics.commit_groups.load(Relaxed) - groups_before;
    let appends = t.app.metrics.appends.load(Relaxed) - appends_before;
    eprintln!("{ok} accepted, {refused} refused; {appends} appends written in {groups} transactions");
    assert_eq!(appends, ok as u64);
    assert!(groups <= appends, "never more commits than appends");
}

/// After a COMMIT whose answer never came, the append path asks whether it took effect
/// (`storage::append::commit_outcome`) instead of redoing it: a redo would store a
/// keyless append twice. The check must see stored rows, must not mistake another row
/// for the one asked about, and must wait for a transaction the server is still
/// finishing rather than call it not stored.
#[tokio::test]
async fn commit_outcome_sees_stored_rows_and_waits_out_an_open_transaction() {
    use storage::append::commit_outcome;
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "custom.a", "payload": {}}])).await;
    let stored = t.events(&t.key_a, &run).await;
    let id = stored[0]["id"].as_str().expect("id").to_owned();
    let (db, tenant) = (&t.app.db, t.tenant_a.as_str());
    assert!(commit_outcome(db, tenant, &run, 1, &id).await.expect("check"), "a stored row is stored");
    assert!(!commit_outcome(db, tenant, &run, 1, "01ARZ3NDEKTSV4RRFFQ69G5FAV").await.expect("check"));
    assert!(!commit_outcome(db, tenant, &run, 2, &id).await.expect("check"), "nothing at seq 2");
    assert!(!commit_outcome(db, &t.tenant_b, &run, 1, &id).await.expect("check"), "tenant b sees nothing");

    // A transaction with seq 2 written but not yet committed, holding no lock on the
    // run's row (as group commit's one-round-trip path): the check waits for it,
    // whichever way it ends.
    for commit in [false, true] {
        let mut client = t.app.db.pool.get().await.expect("client");
        let tx = storage::db::tenant_tx(&mut client, tenant).await.expect("tx");
        let new_id = "01J0000000000000000000000Z";
        tx.execute(
            "INSERT INTO agent_run_events (tenant_id, run_id, seq, id, ts, type, payload)
             VALUES ($1, $2, 2, $3, now(), 'custom.b', '{}')",
            &[&tenant, &run, &new_id],
        )
        .await
        .expect("insert");
        let check = {
            let (db, tenant, run) = (t.app.db.clone(), tenant.to_owned(), run.clone());
            tokio::spawn(async move { commit_outcome(&db, &tenant, &run, 2, new_id).await })
        };
        // Until the check's backend waits on the open transaction (not a sleep: its
        // state). On Citus the wait is on a worker, and the coordinator's view of it is
        // citus_lock_waits.
        let owner = t.db.owner().await;
        let waits = if t.db.citus().await {
            "SELECT count(*) FROM citus_lock_waits WHERE blocked_statement LIKE '%DO NOTHING RETURNING 1'"
        } else {
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
             AND query LIKE '%DO NOTHING RETURNING 1'"
        };
        loop {
            let waiting: i64 = owner.query_one(waits, &[]).await.expect("activity").get(0);
            if waiting > 0 {
                break;
            }
            assert!(!check.is_finished(), "the check did not wait for the open transaction");
            tokio::task::yield_now().await;
        }
        assert!(!check.is_finished());
        if commit {
            tx.commit().await.expect("commit");
        } else {
            tx.rollback().await.expect("rollback");
        }
        let stored = check.await.expect("task").expect("check");
        assert_eq!(stored, commit, "the check reports how the open transaction ended");
    }
}

/// Two service instances appending to one run in turn: each one's group-commit lane
/// caches the run's head, which the other then moves. The stale one-round-trip group is
/// refused by the database (the log's primary key already holds its first seq), rolled
/// back and built again under the row lock: seqs stay gapless, nothing is stored twice, and an
/// `expected_last_seq` that is right against the database is not refused because the
/// cache was behind.
#[tokio::test]
async fn appends_from_two_instances_to_one_run_stay_gapless() {
    let t = TestApp::new().await;
    let other = t.second_instance().await;
    let run = t.create_run(&t.key_a).await;
    for n in 0..8i64 {
        let base = if n % 2 == 0 { t.base.clone() } else { other.clone() };
        let events = json!([{"type": "custom.tick", "payload": {"n": n}}]);
        // Every other round states the head it expects, which only the database knows.
        let body = if n % 4 >= 2 { json!({"events": events, "expected_last_seq": n}) } else { events };
        let (status, v) = t.append_at(&base, &t.key_a, &run, &body).await;
        assert_eq!(status, StatusCode::CREATED, "append {n}: {v}");
        assert_eq!(v["first_seq"], n + 1, "append {n}: {v}");
    }
    // Both instances again, each now a run behind: the same.
    for (n, base) in [(8i64, t.base.clone()), (9, other.clone())] {
        let (first, _) = t
            .append_ok_at(&base, &t.key_a, &run, json!([{"type": "custom.tick", "payload": {"n": n}}]))
            .await;
        assert_eq!(first, n + 1);
    }
    let owner = t.db.owner().await;
    let rows = owner
        .query(
            "SELECT seq, (payload->>'n')::bigint FROM agent_run_events WHERE run_id = $1 ORDER BY seq",
            &[&run],
        )
        .await
        .expect("rows");
    let got: Vec<(i64, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let want: Vec<(i64, i64)> = (0..10).map(|n| (n + 1, n)).collect();
    assert_eq!(got, want, "one row per append, gapless, in order");
    let head: i64 = owner
        .query_one("SELECT last_seq FROM run_summary WHERE run_id = $1", &[&run])
        .await
        .expect("head")
        .get(0);
    assert_eq!(head, 10);
}

/// Two instances appending to the same runs at once, from many producers each: the
/// one-round-trip groups (no row lock), the locking groups and the single-append path
/// race for the same seqs. Whoever loses is refused by the log's primary key and builds
/// its appends again: every append is answered 201 with its own seqs, each is stored
/// once, and every run's seqs are gapless.
#[tokio::test]
async fn concurrent_appends_from_two_instances_to_the_same_runs_are_all_stored_once() {
    const RUNS: usize = 3;
    const PRODUCERS: usize = 8;
    const EACH: usize = 15;
    let t = std::sync::Arc::new(TestApp::new().await);
    let other = t.second_instance().await;
    let mut runs = vec![];
    for _ in 0..RUNS {
        runs.push(t.create_run(&t.key_a).await);
    }
    let mut tasks = vec![];
    for p in 0..PRODUCERS {
        let (t, run) = (t.clone(), runs[p % RUNS].clone());
        let base = if p % 2 == 0 { t.base.clone() } else { other.clone() };
        tasks.push(tokio::spawn(async move {
            let mut seqs = vec![];
            for n in 0..EACH {
                // Every fifth append carries a key (the locking path), the rest none.
                let mut e = json!({"type": "custom.tick", "payload": {"p": p, "n": n}});
                if n % 5 == 4 {
                    e["key"] = json!(format!("p{p}-n{n}"));
                }
                let (status, v) = t.append_at(&base, &t.key_a, &run, &json!([e])).await;
                assert_eq!(status, StatusCode::CREATED, "producer {p}, append {n}: {v}");
                seqs.push(v["first_seq"].as_i64().expect("first_seq"));
            }
            (run, p, seqs)
        }));
    }
    let mut answered: std::collections::HashMap<String, Vec<(i64, usize, usize)>> = Default::default();
    for task in tasks {
        let (run, p, seqs) = task.await.expect("producer");
        answered.entry(run).or_default().extend(seqs.into_iter().enumerate().map(|(n, s)| (s, p, n)));
    }
    let owner = t.db.owner().await;
    for run in &runs {
        let rows = owner
            .query(
                "SELECT seq, (payload->>'p')::bigint, (payload->>'n')::bigint FROM agent_run_events
                 WHERE run_id = $1 ORDER BY seq",
                &[run],
            )
            .await
            .expect("rows");
        let stored: Vec<(i64, usize, usize)> = rows
            .iter()
            .map(|r| (r.get(0), r.get::<_, i64>(1) as usize, r.get::<_, i64>(2) as usize))
            .collect();
        let seqs: Vec<i64> = stored.iter().map(|s| s.0).collect();
        let want: Vec<i64> = (1..=stored.len() as i64).collect();
        assert_eq!(seqs, want, "run {run}: gapless from 1");
        let mut got = answered.remove(run).unwrap_or_default();
        got.sort();
        assert_eq!(stored, got, "run {run}: each append stored once, at the seq it was answered with");
    }
}

/// A writer that holds a run's row lock and writer key (as the single-append path of
/// another process does) is never overtaken by this process's one-round-trip group,
/// which takes no row lock: the group waits for it rather than taking the seq it has
/// read the head for. A busy one-round-trip writer used to win that race on every
/// retry, and the locked append then failed with 500 after five.
#[tokio::test]
async fn a_locked_writer_is_not_overtaken_by_a_one_round_trip_group() {
    let t = std::sync::Arc::new(TestApp::new().await);
    let run = t.create_run(&t.key_a).await;
    // This process now knows the run's head: the next keyless single append goes out
    // in one round trip.
    t.append_ok(&t.key_a, &run, json!([{"type": "custom.tick", "payload": {"n": 1}}])).await;
    let mut other = t.db.owner().await;
    let tx = other.transaction().await.expect("begin");
    hold_as_a_locked_writer(&tx, &t.tenant_a, &run).await;
    let head: i64 = tx
        .query_one(
            "SELECT max(seq) FROM agent_run_events WHERE tenant_id = $1 AND run_id = $2",
            &[&t.tenant_a, &run],
        )
        .await
        .expect("head")
        .get(0);
    assert_eq!(head, 1);
    let append = {
        let (t, run) = (t.clone(), run.clone());
        tokio::spawn(async move {
            t.append_ok(&t.key_a, &run, json!([{"type": "custom.tick", "payload": {"n": 2}}])).await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(!append.is_finished(), "an append committed past a writer holding the run");
    // The locked writer's row goes where it read the head to be.
    tx.execute(
        "INSERT INTO agent_run_events (tenant_id, run_id, seq, id, ts, type, payload)
         VALUES ($1, $2, 2, '01J0000000000000000000000Z', now(), 'custom.other_process', '{}')",
        &[&t.tenant_a, &run],
    )
    .await
    .expect("the locked writer's seq is still free");
    tx.commit().await.expect("commit");
    let (first, _) = tokio::time::timeout(std::time::Duration::from_secs(10), append)
        .await
        .expect("the append went on once the writer committed")
        .expect("append task");
    assert_eq!(first, 3);
}

/// The UPDATEs that move runs' heads find their runs by key in the plan PostgreSQL
/// caches for them. A prepared statement gets a generic plan after its fifth run, and
/// in one the array's length is unknown: joining it to `runs` by hash over a scan of the
/// tenant's runs then looked cheapest, and every commit read every run of its tenant.
#[tokio::test]
async fn run_head_updates_find_their_runs_by_key_in_a_generic_plan() {
    use agent_stream::storage::rows::RunRows;
    let db = TestDb::new().await;
    if db.citus().await {
        // Citus sends the shard its statement with the values in it: a custom plan.
        return;
    }
    let c = db.owner().await;
    // Enough runs that reading them all is a choice a planner weighs, as in service.
    c.batch_execute(
        "INSERT INTO runs (tenant_id, run_id, root_run_id)
             SELECT 'plan', 'run_' || i, 'run_' || i FROM generate_series(1, 1000) i;
         ANALYZE runs;
         SET plan_cache_mode = force_generic_plan",
    )
    .await
    .expect("runs");
    let args = "'plan', now(), ARRAY['run_1', 'run_2'], ARRAY['running', 'done'], \
                ARRAY[NULL, now()]::timestamptz[]";
    for (name, sql) in [("states", RunRows::SQL)] {
        c.batch_execute(&format!("PREPARE {name} AS {sql}")).await.expect("prepare");
        let plan: Value = c
            .query_one(&format!("EXPLAIN (FORMAT JSON) EXECUTE {name}({args})"), &[])
            .await
            .expect("explain")
            .get(0);
        let mut nodes = vec![];
        plan_nodes(&plan, &mut nodes);
        let on_runs: Vec<&Value> = nodes
            .iter()
            .copied()
            .filter(|n| n["Node Type"].as_str().is_some_and(|t| t.ends_with("Scan")))
            .filter(|n| {
                n["Relation Name"] == "runs"
                    || n["Index Name"].as_str().is_some_and(|i| i.starts_with("runs_"))
            })
            .collect();
        assert!(!on_runs.is_empty(), "{name}: no scan of runs in {plan}");
        for n in on_runs {
            let cond = n["Index Cond"].as_str().unwrap_or_default();
            assert!(
                n["Node Type"] != "Seq Scan"
                    && (cond.contains("run_id") || n["Node Type"] == "Bitmap Heap Scan"),
                "{name}: runs must be found by key, got {n} in {plan}"
            );
        }
    }
}

/// Every node of an `EXPLAIN (FORMAT JSON)` plan.
fn plan_nodes<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    match v {
        Value::Array(items) => items.iter().for_each(|i| plan_nodes(i, out)),
        Value::Object(o) => {
            if o.contains_key("Node Type") {
                out.push(v);
            }
            o.values().for_each(|i| plan_nodes(i, out));
        }
        _ => {}
    }
}

/// A group-commit lane commits its tenants' groups side by side: a tenant whose group
/// waits on a run's lock does not hold up another tenant's appends gathered with it.
/// With one lane, tenant a's append to `a2` and tenant b's append queue while the lane
/// waits on `a1`'s lock; once `a1` is free they form the lane's next group, in which
/// `a2` waits in turn, and b's append must not.
#[tokio::test]
async fn a_tenant_waiting_on_a_lock_does_not_hold_up_another_tenant_in_its_lane() {
    use std::time::Duration;
    let one_lane = agent_stream::app::Settings { group_commit_lanes: 1, ..Default::default() };
    let t = std::sync::Arc::new(TestApp::with_settings(one_lane).await);
    let (a1, a2) = (t.create_run(&t.key_a).await, t.create_run(&t.key_a).await);
    let b = t.create_run(&t.key_b).await;
    let (mut hold_a1, mut hold_a2) = (t.db.owner().await, t.db.owner().await);
    let (tx1, tx2) =
        (hold_a1.transaction().await.expect("begin"), hold_a2.transaction().await.expect("begin"));
    for (tx, run) in [(&tx1, &a1), (&tx2, &a2)] {
        hold_as_a_locked_writer(tx, &t.tenant_a, run).await;
    }
    let on_a1 = spawn_tick(&t, &t.key_a, &a1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let on_a2 = spawn_tick(&t, &t.key_a, &a2);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let on_b = spawn_tick(&t, &t.key_b, &b);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !on_a1.is_finished() && !on_a2.is_finished() && !on_b.is_finished(),
        "the lane waits on a1's lock"
    );
    tx1.rollback().await.expect("free a1");
    let (first, _) =
        tokio::time::timeout(Duration::from_secs(10), on_a1).await.expect("a1's append").expect("task");
    assert_eq!(first, 1);
    let (first, _) = tokio::time::timeout(Duration::from_secs(5), on_b)
        .await
        .expect("tenant b's append committed while tenant a's group waited")
        .expect("task");
    assert_eq!(first, 1);
    assert!(!on_a2.is_finished(), "a2's append waits for its lock");
    tx2.rollback().await.expect("free a2");
    let (first, _) =
        tokio::time::timeout(Duration::from_secs(10), on_a2).await.expect("a2's append").expect("task");
    assert_eq!(first, 1);
}

/// A tenant's single appends wait in one lane whatever their runs (`Spread::ByTenant`),
/// so appends to several runs that queue together commit in one transaction, however
/// many lanes there are: with 8 lanes, four runs' appends queued behind a waiting
/// group of the same tenant commit in one group after it.
#[tokio::test]
async fn a_tenants_single_appends_to_several_runs_gather_in_one_lane() {
    use std::sync::atomic::Ordering::Relaxed;
    use std::time::Duration;
    let lanes = agent_stream::app::Settings { group_commit_lanes: 8, ..Default::default() };
    let t = std::sync::Arc::new(TestApp::with_settings(lanes).await);
    let held = t.create_run(&t.key_a).await;
    let others = runs_of_a(&t, 4).await;
    let mut hold = t.db.owner().await;
    let tx = hold.transaction().await.expect("begin");
    hold_as_a_locked_writer(&tx, &t.tenant_a, &held).await;
    let groups_before = t.app.metrics.commit_groups.load(Relaxed);
    let (first, queued) = append_behind_a_held_run(&t, &held, &others).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(queued.iter().all(|q| !q.is_finished()), "the tenant's appends wait in the held run's lane");
    tx.rollback().await.expect("free the run");
    each_writes_its_runs_first_event(std::iter::once(first).chain(queued), "append").await;
    assert_eq!(
        t.app.metrics.commit_groups.load(Relaxed) - groups_before,
        2,
        "the held run's group, then one group of the four runs queued behind it"
    );
}

/// Once [`SECOND_GROUP_FROM`] single appends wait behind a group that cannot commit
/// yet, they go out as a second group instead of waiting for it (fewer wait for it:
/// [`a_tenants_single_appends_to_several_runs_gather_in_one_lane`]), and the held group
/// still commits once it can.
///
/// [`SECOND_GROUP_FROM`]: agent_stream::storage::group::SECOND_GROUP_FROM
#[tokio::test]
async fn enough_single_appends_waiting_behind_a_held_group_commit_in_a_second_one() {
    use agent_stream::storage::group::SECOND_GROUP_FROM;
    use std::sync::atomic::Ordering::Relaxed;
    use std::time::Duration;
    let t = std::sync::Arc::new(TestApp::new().await);
    let held = t.create_run(&t.key_a).await;
    let others = runs_of_a(&t, SECOND_GROUP_FROM).await;
    let mut hold = t.db.owner().await;
    let tx = hold.transaction().await.expect("begin");
    hold_as_a_locked_writer(&tx, &t.tenant_a, &held).await;
    let groups_before = t.app.metrics.commit_groups.load(Relaxed);
    let (first, queued) = append_behind_a_held_run(&t, &held, &others).await;
    each_writes_its_runs_first_event(queued, "the appends behind the held group commit while it waits").await;
    assert!(!first.is_finished(), "the held run's append waits for its writer");
    assert_eq!(
        t.app.metrics.commit_groups.load(Relaxed) - groups_before,
        1,
        "the waiting appends in one group"
    );
    tx.rollback().await.expect("free the run");
    let (seq, _) = tokio::time::timeout(Duration::from_secs(10), first).await.expect("append").expect("task");
    assert_eq!(seq, 1);
    for run in std::iter::once(&held).chain(&others) {
        assert_eq!(t.stored_count(&t.tenant_a, run).await, 1, "run {run}: its one event, once");
    }
}

/// A lane has at most [`GROUPS_IN_FLIGHT`] groups committing: with that many held (the
/// first behind a run another writer holds, each later one started by
/// [`SECOND_GROUP_FROM`] appends waiting and holding up behind a run of its own), the
/// next appends wait; once one held group commits, they go out and commit while the
/// others still wait.
///
/// [`GROUPS_IN_FLIGHT`]: agent_stream::storage::group::GROUPS_IN_FLIGHT
/// [`SECOND_GROUP_FROM`]: agent_stream::storage::group::SECOND_GROUP_FROM
#[tokio::test]
async fn a_lane_commits_up_to_its_groups_in_flight_past_held_ones_and_no_more() {
    use agent_stream::storage::group::{GROUPS_IN_FLIGHT, SECOND_GROUP_FROM};
    use std::time::Duration;
    let t = std::sync::Arc::new(TestApp::new().await);
    let held = runs_of_a(&t, GROUPS_IN_FLIGHT).await;
    let mut holders = vec![];
    for _ in &held {
        holders.push(t.db.owner().await);
    }
    let mut txs = vec![];
    for (c, run) in holders.iter_mut().zip(&held) {
        let tx = c.transaction().await.expect("begin");
        hold_as_a_locked_writer(&tx, &t.tenant_a, run).await;
        txs.push(tx);
    }
    let append = |run: &String| spawn_tick(&t, &t.key_a, run);
    let settle = || tokio::time::sleep(Duration::from_millis(300));
    // The first group: the first held run's append alone.
    let mut waiting = vec![append(&held[0])];
    settle().await;
    // Each later group: a held run's append first, then enough to start a group.
    let mut fresh = vec![];
    for run in &held[1..] {
        waiting.push(append(run));
        let others = runs_of_a(&t, SECOND_GROUP_FROM - 1).await;
        waiting.extend(others.iter().map(append));
        fresh.extend(others);
        settle().await;
    }
    let probe_runs = runs_of_a(&t, SECOND_GROUP_FROM).await;
    let probe: Vec<_> = probe_runs.iter().map(append).collect();
    settle().await;
    assert!(waiting.iter().all(|w| !w.is_finished()), "every held group waits for its run");
    assert!(probe.iter().all(|p| !p.is_finished()), "no more than {GROUPS_IN_FLIGHT} groups in flight");
    // The last held group commits; the probe's group goes out in its place and commits
    // while the others still wait.
    txs.pop().expect("the last holder").rollback().await.expect("free the last held run");
    each_writes_its_runs_first_event(probe, "the waiting appends commit once a group in flight ends").await;
    let first_held_group = &waiting[0];
    assert!(!first_held_group.is_finished(), "the first group still waits for its run");
    for tx in txs {
        tx.rollback().await.expect("free a held run");
    }
    each_writes_its_runs_first_event(waiting, "append").await;
    for run in held.iter().chain(&fresh).chain(&probe_runs) {
        assert_eq!(t.stored_count(&t.tenant_a, run).await, 1, "run {run}: its one event, once");
    }
}

/// `n` new runs of tenant a.
async fn runs_of_a(t: &TestApp, n: usize) -> Vec<String> {
    let mut runs = vec![];
    for _ in 0..n {
        runs.push(t.create_run(&t.key_a).await);
    }
    runs
}

/// Appends a tick to `held` (whose writer the caller holds) and, once that append's
/// group waits on it, one to each of `others`, all as tenant a: the tasks, each giving
/// its append's seqs.
async fn append_behind_a_held_run(
    t: &std::sync::Arc<TestApp>,
    held: &str,
    others: &[String],
) -> (tokio::task::JoinHandle<(i64, i64)>, Vec<tokio::task::JoinHandle<(i64, i64)>>) {
    let first = spawn_tick(t, &t.key_a, held);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    (first, others.iter().map(|r| spawn_tick(t, &t.key_a, r)).collect())
}

/// One tick appended to `run` with `key` on a task of its own: the task gives its seqs.
fn spawn_tick(t: &std::sync::Arc<TestApp>, key: &str, run: &str) -> tokio::task::JoinHandle<(i64, i64)> {
    let (t, key, run) = (t.clone(), key.to_owned(), run.to_owned());
    tokio::spawn(
        async move { t.append_ok(&key, &run, json!([{"type": "custom.tick", "payload": {}}])).await },
    )
}

/// Waits up to 10 s for each of `tasks` (an append of one event to a new run; `why` if one
/// does not end) and checks it wrote its run's first event.
async fn each_writes_its_runs_first_event(
    tasks: impl IntoIterator<Item = tokio::task::JoinHandle<(i64, i64)>>,
    why: &str,
) {
    for task in tasks {
        let (seq, _) =
            tokio::time::timeout(std::time::Duration::from_secs(10), task).await.expect(why).expect("task");
        assert_eq!(seq, 1);
    }
}

/// Holds `run` as another process's locked writer does: its row lock, then its writer
/// key. Appends here wait for it on either path (the one-round-trip path's claim on the
/// key fails, and the locked path waits for the row).
async fn hold_as_a_locked_writer(tx: &tokio_postgres::Transaction<'_>, tenant: &str, run: &str) {
    use agent_stream::storage::rows::{writer_keys, HOLD_RUNS};
    hold_the_row(tx, tenant, run).await;
    tx.execute(HOLD_RUNS, &[&writer_keys([run])]).await.expect("writer key");
}

/// Takes `run`'s row lock in `tx`.
async fn hold_the_row(tx: &tokio_postgres::Transaction<'_>, tenant: &str, run: &str) {
    // By tenant and run: Citus routes a row lock only by its distribution column.
    tx.query_one("SELECT 1 FROM runs WHERE tenant_id = $1 AND run_id = $2 FOR UPDATE", &[&tenant, &run])
        .await
        .expect("row lock");
}

/// Whether a keyless single append to `run` commits while another connection holds the
/// run's row lock (and not its writer key): only the one-round-trip path, which builds
/// on the head this process already knows and touches no row of `runs`, can.
async fn commits_past_a_held_row(t: &std::sync::Arc<TestApp>, run: &str) -> bool {
    use std::time::Duration;
    let mut other = t.db.owner().await;
    let tx = other.transaction().await.expect("begin");
    hold_the_row(&tx, &t.tenant_a, run).await;
    let append = spawn_tick(t, &t.key_a, run);
    let past = tokio::time::timeout(Duration::from_secs(3), async {
        while !append.is_finished() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .is_ok();
    tx.rollback().await.expect("free the run");
    tokio::time::timeout(Duration::from_secs(10), append).await.expect("the append commits").expect("task");
    past
}

/// A run this process has just created has no events, and its first append builds on
/// that without reading the run: 1,000 streaming appends starting at once otherwise sent
/// their first groups down the locked path, up to 28 ms a group
/// (docs/benchmarks-log.md, 2026-11-29 22:10).
#[tokio::test]
async fn a_run_created_here_is_appended_to_in_one_round_trip_from_its_first_event() {
    let t = std::sync::Arc::new(TestApp::new().await);
    let run = t.create_run(&t.key_a).await;
    assert!(commits_past_a_held_row(&t, &run).await, "the first append read the run under its lock");
    let seqs: Vec<i64> = t.events(&t.key_a, &run).await.iter().filter_map(|e| e["seq"].as_i64()).collect();
    assert_eq!(seqs, vec![1]);
}

/// The head an append leaves is known to every write path of the process: after a
/// batch that committed on its own (outside the group-commit lanes), the next single
/// append goes out in one round trip, at the next seq.
#[tokio::test]
async fn a_head_left_by_one_write_path_is_built_on_by_the_lanes() {
    let t = std::sync::Arc::new(TestApp::new().await);
    let run = t.create_run(&t.key_a).await;
    let own = agent_stream::storage::group::OWN_COMMIT_FROM;
    let batch: Vec<Value> = (0..own).map(|n| json!({"type": "custom.tick", "payload": {"n": n}})).collect();
    t.append_ok(&t.key_a, &run, Value::Array(batch)).await;
    assert!(commits_past_a_held_row(&t, &run).await, "the lane read the run again");
    let seqs: Vec<i64> = t.events(&t.key_a, &run).await.iter().filter_map(|e| e["seq"].as_i64()).collect();
    assert_eq!(seqs, (1..=own as i64 + 1).collect::<Vec<_>>());
}

/// A producer that hangs up while its append commits (fire and forget: a last
/// `run.lifecycle` sent on the way out) still has it announced: the row writer wakes the
/// run's subscribers and notifies other processes, not the request that is gone. Before,
/// the notification was sent from the request after its answer came, and a dropped
/// request left other processes to find the events by their safety poll.
#[tokio::test]
async fn an_append_whose_client_hangs_up_mid_commit_is_still_announced() {
    hang_up_mid_append(json!([{"type": "run.lifecycle", "payload": {"state": "done"}}])).await;
}

/// As above, for an append large enough to commit on its own rather than in a lane
/// (`OWN_COMMIT_FROM` events): it was awaited in the request, so a hang-up while it
/// waited for the run dropped it (the client never knew), and one during its COMMIT left
/// it stored but unannounced.
#[tokio::test]
async fn a_large_append_whose_client_hangs_up_mid_commit_is_stored_and_announced() {
    let n = agent_stream::storage::group::OWN_COMMIT_FROM;
    let mut events: Vec<Value> =
        (0..n - 1).map(|i| json!({"type": "text.delta", "payload": {"text": format!("{i} ")}})).collect();
    events.push(json!({"type": "run.lifecycle", "payload": {"state": "done"}}));
    hang_up_mid_append(Value::Array(events)).await;
}

/// Sends `events` to a running run held by another process's locked writer, hangs up
/// before the answer, lets the run go: the events are stored and announced.
async fn hang_up_mid_append(events: Value) {
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;
    let n = events.as_array().map_or(0, Vec::len) as i64;
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}])).await;
    // The owner listens on the schema's channel, as another process does.
    let (_listening, mut heard) = crate::attack::owner_listening(&t).await;
    // What the earlier writes announced has gone out (the notifier gathers for 3 ms).
    tokio::time::sleep(Duration::from_millis(300)).await;
    while heard.try_recv().is_ok() {}
    // Another process's locked writer holds the run: the append waits for it, in its lane.
    let mut other = t.db.owner().await;
    let tx = other.transaction().await.expect("begin");
    hold_as_a_locked_writer(&tx, &t.tenant_a, &run).await;
    let host = t.base.trim_start_matches("http://");
    let mut tcp = tokio::net::TcpStream::connect(host).await.expect("connect");
    let body = events.to_string();
    let request = format!(
        "POST /v1/runs/{run}/events HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        t.key_a,
        body.len()
    );
    tcp.write_all(request.as_bytes()).await.expect("request");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The producer hangs up without its answer; then the other writer lets go.
    drop(tcp);
    tokio::time::sleep(Duration::from_millis(300)).await;
    tx.rollback().await.expect("free the run");
    let stored = async {
        while t.stored_count(&t.tenant_a, &run).await < 1 + n {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), stored).await.expect("the append commits");
    let (_, payload) = tokio::time::timeout(Duration::from_secs(5), heard.recv())
        .await
        .expect("a notification for the append whose client hung up")
        .expect("listening");
    assert!(payload.lines().count() >= 2, "a payload naming a run: {payload}");
}
