//! The load tool, `agent-stream-load <scenario>`: one scenario per run, each printing one
//! table next to its baseline measured in the same run on the same machine. It is a
//! binary of its own, outside the server's: it measures the release `agent-stream`
//! binary built beside it (`cargo build --release`), started as a separate `serve`
//! process so its CPU and memory are read apart from the load generator's.
//!
//! Scenarios: `ingest`, `ingest-single`, `fanout`, `export`, `fold`, `slow-readers`,
//! `stuck`, `join`, `many-runs`, `connect`, `socket-writes`; each module's doc says what
//! it measures and against what. The ones that need PostgreSQL find it like the tests do
//! (`DATABASE_URL`, else 127.0.0.1:5432, else the embedded default's private cluster) and
//! work in a schema of their own (dropped at the end). BENCHMARKS.md keeps the latest
//! figures. [`support`] also serves the criterion benches (`cargo bench -p
//! agent-stream-load --bench <name>`).

#![warn(missing_docs)]

mod connect;
mod export;
mod fanout;
pub mod floor;
mod fold;
pub mod http;
mod ingest;
mod ingest_single;
mod join;
mod many;
mod slow;
mod stuck;
pub mod support;
mod writes;

use std::path::Path;

use agent_stream::server::{Database, DbChoice};
use agent_stream::storage::embedded::default_data_dir;

/// The scenarios, by name.
pub const SCENARIOS: [&str; 11] = [
    "ingest",
    "ingest-single",
    "fanout",
    "export",
    "fold",
    "slow-readers",
    "stuck",
    "join",
    "many-runs",
    "connect",
    "socket-writes",
];

/// The hidden scenario that serves [`floor`] (`--listen ADDR`), started by `fanout`.
pub const FLOOR: &str = "floor-sse-server";

/// Where the scenarios look for PostgreSQL when `DATABASE_URL` is unset.
const LOCAL: &str = "host=127.0.0.1 port=5432 user=postgres dbname=test";

/// Runs `scenario` (one of [`SCENARIOS`]), measuring `bin serve` where it needs a
/// server, and prints its table.
pub async fn run(scenario: &str, bin: &Path) -> anyhow::Result<()> {
    if !SCENARIOS.contains(&scenario) {
        anyhow::bail!("unknown scenario `{scenario}`; known: {}", SCENARIOS.join(", "));
    }
    println!("date: {}", chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    println!("machine: {}", machine());
    if scenario == "fold" {
        fold::run();
        return Ok(());
    }
    if scenario == "socket-writes" {
        writes::run();
        return Ok(());
    }
    let schema = format!("bench_load_{}", std::process::id());
    let database =
        Database::open(&DbChoice { url: database_url(scenario).await?, data_dir: None, schema }).await?;
    let (url, schema) = (&database.url, &database.schema);
    database.migrate().await?;
    match scenario {
        "ingest" => ingest::run(bin, url, schema).await,
        "ingest-single" => ingest_single::run(bin, url, schema).await,
        "fanout" => fanout::run(bin, url, schema).await,
        "slow-readers" => slow::run(bin, url, schema).await,
        "stuck" => stuck::run(bin, url, schema).await,
        "join" => join::run(bin, url, schema).await,
        "many-runs" => many::run(bin, url, schema).await,
        "connect" => connect::run(bin, url, schema).await,
        _ => export::run(bin, url, schema).await,
    }
    let owner = database.owner().await?;
    owner.batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE")).await?;
    database.close().await
}

/// The PostgreSQL to measure against, found like the tests find theirs: `DATABASE_URL`,
/// else the local server, else (`None`) the embedded default's private cluster, which
/// [`Database`] starts and, when it was not already running, stops at the end.
async fn database_url(scenario: &str) -> anyhow::Result<Option<String>> {
    if let Ok(url) = std::env::var("DATABASE_URL") {
        if let Err(e) = agent_stream::storage::db::connect(&url).await {
            anyhow::bail!(
                "scenario `{scenario}` needs PostgreSQL, and none answered at DATABASE_URL ({e}); \
                 point it at one (a superuser: the scenario creates a schema and roles), or unset it"
            );
        }
        return Ok(Some(url));
    }
    if agent_stream::storage::db::connect(LOCAL).await.is_ok() {
        return Ok(Some(LOCAL.to_owned()));
    }
    eprintln!(
        "load: DATABASE_URL is unset and nothing answered at {LOCAL}; using the private cluster under {}",
        default_data_dir().display()
    );
    Ok(None)
}

/// The processor and core count this run measures on. Figures from the machines these
/// scenarios run on differ by kind (an Intel Xeon and an AMD EPYC have both been
/// handed out, and the same build's ratios differ between them), so every run says which.
fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines().find_map(|l| {
                l.strip_prefix("model name").map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_owned())
            })
        })
        .unwrap_or_else(|| "an unknown processor".to_owned());
    format!("{model}, {cores} cores")
}
