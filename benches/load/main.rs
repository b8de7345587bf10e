//! The load tool (issue 6): one scenario per run, each printing one table next to its
//! baseline measured in the same run on the same machine.
//!
//!     cargo bench --bench load -- <scenario>
//!
//! Scenarios: `ingest`, `ingest-single`, `fanout`, `export`, `fold`; each module's doc
//! says what it measures and against what. The ones that need PostgreSQL find it like the
//! tests do (`DATABASE_URL`, else 127.0.0.1:5432) and work in a schema of their own,
//! dropped at the end. BENCHMARKS.md keeps the latest tables.

#[path = "../support/mod.rs"]
mod support;

mod export;
mod fanout;
mod fold;
mod ingest;
mod ingest_single;

use agent_stream::storage::{db, migrate};

/// The service's allocator (see `agent_stream::Allocator`).
#[global_allocator]
static GLOBAL: agent_stream::Allocator = agent_stream::Allocator;

const SCENARIOS: &[&str] = &["ingest", "ingest-single", "fanout", "export", "fold"];

#[tokio::main]
async fn main() {
    // `cargo bench` passes `--bench`; the scenario is the first other argument.
    let Some(scenario) = std::env::args().skip(1).find(|a| !a.starts_with('-')) else {
        eprintln!("usage: cargo bench --bench load -- <scenario>; scenarios: {}", SCENARIOS.join(", "));
        std::process::exit(2);
    };
    if !SCENARIOS.contains(&scenario.as_str()) {
        eprintln!("load: unknown scenario `{scenario}`; known: {}", SCENARIOS.join(", "));
        std::process::exit(2);
    }
    println!("date: {}", chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    if scenario == "fold" {
        fold::run();
        return;
    }
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "host=127.0.0.1 port=5432 user=postgres dbname=test".to_owned());
    if tokio_postgres::connect(&url, tokio_postgres::NoTls).await.is_err() {
        eprintln!("load: no PostgreSQL at {url}; set DATABASE_URL. Skipping.");
        return;
    }
    let schema = format!("bench_load_{}", std::process::id());
    migrate::migrate(&url, &schema).await.expect("migrate");
    match scenario.as_str() {
        "ingest" => ingest::run(&url, &schema).await,
        "ingest-single" => ingest_single::run(&url, &schema).await,
        "fanout" => fanout::run(&url, &schema).await,
        "export" => export::run(&url, &schema).await,
        _ => unreachable!("checked against SCENARIOS"),
    }
    let owner = db::connect_owner(&url, &schema).await.expect("owner");
    let _ = owner.batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE")).await;
}
