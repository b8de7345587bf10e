//! The update stream's contract: folding updates the way a client would (on JSON, by
//! the rules in the module docs) gives exactly the reducer's view at every seq.

use proptest::prelude::*;
use serde_json::{json, Value};

use super::{updates, RunView, UpdateKind, ViewUpdate};
use crate::testkit::{generated_run_mix, stored};

/// A client's fold, written against the JSON only.
fn client_apply(view: &mut Value, u: &ViewUpdate) {
    let u = serde_json::to_value(u).expect("update json");
    let upsert = |list: &mut Value, item: &Value, keys: &[&str]| {
        let list = list.as_array_mut().expect("list");
        match list.iter_mut().find(|x| keys.iter().all(|k| x[*k] == item[*k])) {
            Some(x) => *x = item.clone(),
            None => list.push(item.clone()),
        }
    };
    match u["kind"].as_str().expect("kind") {
        "snapshot" => *view = u["view"].clone(),
        "message" => upsert(&mut view["messages"], &u["message"], &["child_id", "id"]),
        "tool" => upsert(&mut view["tools"], &u["tool"], &["child_id", "call_id"]),
        "child" => upsert(&mut view["children"], &u["child"], &["child_id"]),
        "transition" => {
            view["lifecycle"]["transitions"]
                .as_array_mut()
                .expect("transitions")
                .push(u["transition"].clone());
            view["lifecycle"]["state"] = u.get("run_state").cloned().unwrap_or(Value::Null);
        }
        "step" => view["steps"].as_array_mut().expect("steps").push(u["step"].clone()),
        "plan" => view["plan"] = u["plan"].clone(),
        "compaction" => view["compaction"] = u["compaction"].clone(),
        "seq" => {}
        other => panic!("unknown kind {other}"),
    }
    view["seq"] = u["seq"].clone();
}

fn check(inputs: &[Value], snapshot_at: usize) {
    let events = stored(inputs);
    let mut server = RunView::new();
    let mut client = serde_json::to_value(RunView::new()).expect("json");
    for (i, e) in events.iter().enumerate() {
        let change = server.apply(e);
        if i + 1 == snapshot_at {
            let snap = ViewUpdate::snapshot(std::sync::Arc::new(server.clone()));
            assert_eq!(snap.kind, UpdateKind::Snapshot);
            client = json!({});
            client_apply(&mut client, &snap);
            continue;
        }
        for u in updates(&server, e.seq, change) {
            assert_eq!(u.seq, e.seq);
            client_apply(&mut client, &u);
        }
        assert_eq!(client, serde_json::to_value(&server).expect("json"), "views differ after seq {}", e.seq);
    }
}

#[test]
fn interrupted_records_and_child_edges_come_as_updates() {
    check(
        &[
            json!({"type": "run.lifecycle", "payload": {"state": "running"}}),
            json!({"type": "child.spawn", "payload": {"child_id": "a"}}),
            json!({"type": "child.spawn", "child_id": "a", "payload": {"child_id": "b"}}),
            json!({"type": "run.lifecycle", "child_id": "b", "payload": {"state": "running"}}),
            json!({"type": "text.delta", "child_id": "b", "payload": {"text": "x"}}),
            json!({"type": "tool.start", "child_id": "b", "payload": {"call_id": "c", "tool": "t"}}),
            json!({"type": "tool.start", "payload": {"call_id": "c", "tool": "t"}}),
            json!({"type": "run.lifecycle", "payload": {"state": "aborted"}}),
        ],
        0,
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn client_fold_of_updates_equals_the_view(seed in any::<u64>(), steps in 1usize..150, snap in 0usize..40) {
        check(&generated_run_mix(seed, steps, 40), snap);
    }
}
