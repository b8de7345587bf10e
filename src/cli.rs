//! The `agent-stream` command line: serve, migrate, administer tenants and keys, export
//! and import (the load tool is a binary of its own, `agent-stream-load`). It lives in
//! the library rather than in `main.rs` because a binary crate compiles after the
//! library, with nothing left to build beside it: this code took 40 s there, at the end
//! of every first build, and costs the library 19 s (docs/benchmarks-log.md).

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::app::{App, AppRef, Settings};
use crate::auth::Scope;
use crate::domain::Limits;
use crate::server::{self, Database, DbChoice, ServeOptions};
use crate::storage::tenants;
use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "agent-stream",
    version,
    about = "Durable, multi-tenant event log and live stream for AI-agent runs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct DbArgs {
    /// PostgreSQL to use. Unset: a private cluster under --data-dir (the embedded default).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// Data directory of the embedded default [default: ~/.local/share/agent-stream,
    /// or /var/lib/agent-stream when run as root].
    #[arg(long, env = "AGENT_STREAM_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Schema holding agent-stream's tables.
    #[arg(long, env = "AGENT_STREAM_SCHEMA", default_value = "agent_stream")]
    schema: String,
}

impl DbArgs {
    fn choice(&self) -> DbChoice {
        DbChoice {
            url: self.database_url.clone(),
            data_dir: self.data_dir.clone(),
            schema: self.schema.clone(),
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run the service (migrates first).
    Serve {
        #[command(flatten)]
        db: DbArgs,
        /// Address to listen on.
        #[arg(long, env = "AGENT_STREAM_LISTEN", default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        /// Database connections in the pool.
        #[arg(long, env = "AGENT_STREAM_POOL_SIZE", default_value_t = 32)]
        pool_size: usize,
        /// Origins allowed to call the API from a browser (comma-separated), or `*` for
        /// any origin. With the embedded default and none given, any origin is allowed.
        #[arg(long, env = "AGENT_STREAM_CORS_ORIGINS", value_delimiter = ',', value_parser = parse_origin)]
        cors_origin: Vec<String>,
        /// Largest request body in bytes.
        #[arg(long, env = "AGENT_STREAM_MAX_BODY_BYTES", default_value_t = 16 << 20)]
        max_body_bytes: usize,
        /// Largest single event in bytes.
        #[arg(long, env = "AGENT_STREAM_MAX_EVENT_BYTES", default_value_t = 1 << 20)]
        max_event_bytes: usize,
        /// Most events in one append.
        #[arg(long, env = "AGENT_STREAM_MAX_BATCH_EVENTS", default_value_t = 10_000)]
        max_batch_events: usize,
        /// Committer tasks gathering concurrent appends into shared transactions (0: each alone).
        // Two by default: a lane makes its group from what queued during its last
        // commit, so more lanes than the database commits in parallel only split the
        // same appends into smaller, costlier groups (ingest-single: 4 lanes 0.66-0.72x
        // raw INSERT at 7 appends a commit, 2 lanes 0.83-0.90x at 14). A tenant's
        // single appends keep to one lane (`Spread::ByTenant`); streaming appends use
        // both, and a lane commits its tenants' groups side by side.
        #[arg(long, env = "AGENT_STREAM_GROUP_COMMIT_LANES", default_value_t = 2)]
        group_commit_lanes: usize,
        /// Seconds a pooled database connection may stay idle before it is closed (0: never).
        #[arg(long, env = "AGENT_STREAM_POOL_IDLE_SECS", default_value_t = 60)]
        pool_idle_secs: u64,
        /// Subscriptions one GraphQL WebSocket may hold open.
        #[arg(long, env = "AGENT_STREAM_WS_MAX_OPERATIONS", default_value_t = 100)]
        ws_max_operations: usize,
        /// Seconds a GraphQL WebSocket may keep a write waiting on a client that reads
        /// nothing before it is closed (1013).
        #[arg(long, env = "AGENT_STREAM_WS_STALL_SECS", default_value_t = 30)]
        ws_stall_secs: u64,
        /// GraphQL WebSockets one API key may hold open.
        #[arg(long, env = "AGENT_STREAM_WS_MAX_SOCKETS_PER_KEY", default_value_t = 10_000)]
        ws_max_sockets_per_key: usize,
        /// Appends per second each tenant may sustain (0: no limit); bursts of twice that.
        #[arg(long, env = "AGENT_STREAM_APPEND_RATE", default_value_t = 10_000.0)]
        append_rate: f64,
        #[command(flatten)]
        retention: RetentionArgs,
        /// Seconds between retention sweeps (0: never).
        #[arg(long, env = "AGENT_STREAM_RETENTION_INTERVAL", default_value_t = 3600)]
        retention_interval: u64,
    },
    /// Delete finished runs past their retention (whole runs, with their events).
    Retention {
        /// List what would be deleted; delete nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        retention: RetentionArgs,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Apply pending schema migrations and exit.
    Migrate {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Manage tenants.
    Tenant {
        #[command(subcommand)]
        cmd: TenantCmd,
    },
    /// Manage API keys.
    Key {
        #[command(subcommand)]
        cmd: KeyCmd,
    },
    /// Manage analysts' read-only PostgreSQL logins.
    Analyst {
        #[command(subcommand)]
        cmd: AnalystCmd,
    },
    /// Write a run's log as JSONL (one event per line), with a progress bar on a terminal.
    Export {
        /// The run id.
        run_id: String,
        /// File to write [default: standard output].
        #[arg(long)]
        out: Option<PathBuf>,
        /// First seq to export.
        #[arg(long)]
        from_seq: Option<i64>,
        /// Last seq to export.
        #[arg(long)]
        to_seq: Option<i64>,
        /// Dialect: native, multica, chunks, hier, typed, agui or vercel.
        #[arg(long, default_value = "native")]
        format: String,
        /// API key of the run's tenant (read scope).
        #[arg(long, env = "AGENT_STREAM_KEY", hide_env_values = true)]
        key: String,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Import a JSONL export as a new run with the same log; prints the new run id.
    Import {
        /// The export file, or `-` for standard input.
        file: PathBuf,
        /// API key of the tenant to import into (write scope).
        #[arg(long, env = "AGENT_STREAM_KEY", hide_env_values = true)]
        key: String,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Ask a running service whether it is ready (`GET /readyz`): prints the answer and
    /// exits 0 when it is, 1 when not. For container health checks (the image has no curl).
    Health {
        /// The service's address; an unspecified one (0.0.0.0) is asked on loopback.
        #[arg(long, env = "AGENT_STREAM_LISTEN", default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
    },
    /// Print the GraphQL schema (SDL).
    Schema,
}

#[derive(Subcommand)]
enum AnalystCmd {
    /// Create a PostgreSQL login that reads one tenant's rows through the analyst views.
    Create {
        /// Tenant name.
        tenant: String,
        /// Role (login) name: lowercase letters, digits, `_`.
        #[arg(long)]
        role: String,
        /// Password for the login (read from the environment to keep it out of `ps`).
        #[arg(long, env = "AGENT_STREAM_ANALYST_PASSWORD", hide_env_values = true)]
        password: Option<String>,
        #[command(flatten)]
        db: DbArgs,
    },
}

#[derive(Args, Clone, Copy)]
struct RetentionArgs {
    /// Days a `done` run is kept after it ended (tenants may override).
    #[arg(long, env = "AGENT_STREAM_RETENTION_DONE_DAYS", default_value_t = 90)]
    retention_done_days: i32,
    /// Days an `aborted` or `error` run is kept after it ended (tenants may override).
    #[arg(long, env = "AGENT_STREAM_RETENTION_FAILED_DAYS", default_value_t = 30)]
    retention_failed_days: i32,
}

impl RetentionArgs {
    fn policy(self) -> anyhow::Result<crate::storage::retention::Policy> {
        anyhow::ensure!(
            self.retention_done_days > 0 && self.retention_failed_days > 0,
            "retention days must be 1 or more"
        );
        Ok(crate::storage::retention::Policy {
            done_days: self.retention_done_days,
            failed_days: self.retention_failed_days,
        })
    }
}

#[derive(Subcommand)]
enum TenantCmd {
    /// Set a tenant's retention override (omit a value to use the service default).
    Retention {
        /// Tenant name.
        name: String,
        /// Days its `done` runs are kept.
        #[arg(long)]
        done_days: Option<i32>,
        /// Days its `aborted` and `error` runs are kept.
        #[arg(long)]
        failed_days: Option<i32>,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Create a tenant; prints a new read+write key as the last line.
    Create {
        /// Tenant name: lowercase letters, digits, `-` and `_`.
        name: String,
        #[command(flatten)]
        db: DbArgs,
    },
}

#[derive(Subcommand)]
enum KeyCmd {
    /// Issue another key for a tenant; prints it as the last line.
    Create {
        /// Tenant name.
        tenant: String,
        /// Scopes, comma-separated: read, write, admin.
        #[arg(long, value_delimiter = ',', default_value = "read,write")]
        scopes: Vec<String>,
        /// A note to recognise the key by.
        #[arg(long)]
        label: Option<String>,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Revoke a key by its id (the 12 hex digits after `ask_`).
    Revoke {
        /// Key id.
        key_id: String,
        #[command(flatten)]
        db: DbArgs,
    },
}

fn init_tracing() {
    use tracing_subscriber::filter::EnvFilter;
    use tracing_subscriber::prelude::*;
    let filter = EnvFilter::try_from_env("AGENT_STREAM_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info,tokio_postgres=warn,deadpool.postgres=error"));
    let json = std::env::var("AGENT_STREAM_LOG_FORMAT").is_ok_and(|v| v == "json");
    // Spans for OpenTelemetry, when OTEL_* asks: the service's own, at info.
    let otel = match crate::telemetry::layer() {
        Ok(l) => l.map(|l| {
            use tracing_subscriber::filter::Targets;
            l.with_filter(
                Targets::new()
                    .with_target("agent_stream", tracing::Level::INFO)
                    .with_target("agent_stream_store", tracing::Level::INFO),
            )
            .boxed()
        }),
        Err(e) => {
            eprintln!("warning: OpenTelemetry tracing is off: {e:#}");
            None
        }
    };
    use std::io::IsTerminal;
    let ansi = std::io::stderr().is_terminal();
    tracing_subscriber::registry().with(layers(filter, json, otel, std::io::stderr, ansi)).init();
}

/// A layer of the service's subscriber.
type BoxedLayer = Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>;

/// The subscriber's layers: the log (to `writer`, through [`log_filter`]) and, when
/// there is one, OpenTelemetry's.
///
/// Only the layers there are: an absent OpenTelemetry layer as `Option::None` counts as
/// a layer that wants every span, and the registry then built (and entered, on every
/// SSE frame) each span the log filter refused, even at `RUST_LOG=error`.
fn layers<W>(
    filter: tracing_subscriber::filter::EnvFilter,
    json: bool,
    otel: Option<BoxedLayer>,
    writer: W,
    ansi: bool,
) -> Vec<BoxedLayer>
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    use tracing_subscriber::Layer;
    let log = tracing_subscriber::fmt::layer().with_writer(writer).with_ansi(ansi);
    let log = if json {
        log.json().with_filter(log_filter(filter)).boxed()
    } else {
        log.with_filter(log_filter(filter)).boxed()
    };
    std::iter::once(log).chain(otel).collect()
}

/// What the log layer takes: `filter`, and never the PostgreSQL driver's debug output,
/// which carries each statement's parameters (event payloads and API key hashes), nor
/// the spans only traces want ([`crate::storage::TRACES`]).
///
/// One filter made of the two, not one layer filtered twice: with nested per-layer
/// filters the registry built every span the inner filter refused.
///
/// The exclusions declare that it passes every level, so the pair's level hint is
/// `filter`'s (without a hint it would be none, i.e. TRACE): below it, `debug!` and the
/// `log` records of dependencies (the driver's, per statement) stop at a level check
/// instead of reaching the filters on every call.
fn log_filter<S>(filter: tracing_subscriber::filter::EnvFilter) -> impl tracing_subscriber::layer::Filter<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::filter::{filter_fn, FilterExt, LevelFilter};
    let kept = filter_fn(|m| {
        let parameters = m.target().starts_with("tokio_postgres") && *m.level() > tracing::Level::INFO;
        !parameters && m.target() != crate::storage::TRACES
    })
    .with_max_level_hint(LevelFilter::TRACE);
    filter.and(kept)
}

/// One `--cors-origin`: `*` (any origin) or `scheme://host[:port]`, as browsers send it
/// in `Origin`. Checked here so a typo fails at start with a message, not a panic in the
/// CORS layer or an origin that silently never matches.
fn parse_origin(s: &str) -> Result<String, String> {
    let s = s.trim();
    if s.is_empty() || s == "*" {
        return Ok(s.to_owned());
    }
    let bad = || {
        format!(
            "`{s}` is not an origin: write it as scheme://host[:port] (for example \
             https://app.example.com), or `*` for any origin"
        )
    };
    let uri: axum::http::Uri = s.parse().map_err(|_| bad())?;
    let plain_path = matches!(uri.path(), "" | "/") && uri.query().is_none() && !s.ends_with('?');
    match (uri.scheme_str(), uri.authority()) {
        (Some(scheme), Some(auth)) if plain_path && !auth.as_str().contains('@') => {
            let origin = format!("{scheme}://{auth}");
            axum::http::HeaderValue::from_str(&origin).map_err(|_| bad())?;
            Ok(origin)
        }
        _ => Err(bad()),
    }
}

fn parse_scopes(list: &[String]) -> anyhow::Result<Vec<Scope>> {
    let mut scopes = vec![];
    for s in list {
        let scope = Scope::parse(s.trim())
            .ok_or_else(|| anyhow::anyhow!("unknown scope `{s}`: use read, write or admin"))?;
        anyhow::ensure!(!scopes.contains(&scope), "scope `{s}` is listed twice");
        scopes.push(scope);
    }
    anyhow::ensure!(!scopes.is_empty(), "--scopes names no scope: give read, write or admin");
    Ok(scopes)
}

/// Runs an administrative action against the database, migrating first and stopping a
/// private cluster afterwards if this command had to start it.
async fn with_owner<T>(
    db: &DbArgs,
    f: impl AsyncFnOnce(&mut tokio_postgres::Client) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let database = Database::open(&db.choice()).await?;
    let result = async {
        database.migrate().await?;
        let mut owner = database.owner().await?;
        f(&mut owner).await
    }
    .await;
    database.close().await?;
    result
}

/// Runs a command against the service's own application core (the same code paths as
/// HTTP), on this machine's database.
async fn with_app<T>(db: &DbArgs, f: impl AsyncFnOnce(AppRef) -> anyhow::Result<T>) -> anyhow::Result<T> {
    let database = Database::open(&db.choice()).await?;
    let result = async {
        database.migrate().await?;
        let pool = crate::storage::Db::new(&crate::storage::DbConfig {
            url: database.url.clone(),
            schema: db.schema.clone(),
            max_connections: 4,
        })?;
        f(App::new(pool, Settings::default())).await
    }
    .await;
    database.close().await?;
    result
}

/// What `tenant retention` prints: the tenant's override, or that it follows the
/// service's default, in words.
fn retention_line(name: &str, done_days: Option<i32>, failed_days: Option<i32>) -> String {
    let days = |d: Option<i32>| match d {
        Some(1) => "1 day".to_owned(),
        Some(n) => format!("{n} days"),
        None => "the service's default time".to_owned(),
    };
    if done_days.is_none() && failed_days.is_none() {
        return format!("tenant `{name}` follows the service's retention defaults");
    }
    format!(
        "tenant `{name}`: done runs are kept for {} after they end, aborted and error runs for {}",
        days(done_days),
        days(failed_days)
    )
}

/// What a progress bar counts.
#[derive(Clone, Copy)]
enum Unit {
    /// Lines of a file.
    Lines,
    /// Bytes read.
    Bytes,
}

/// A rate for people: whole units a second (`1234 lines/s`), or bytes scaled
/// (`12.3 MiB/s`), never four decimals.
fn rate(per_sec: f64, unit: Unit) -> String {
    let per_sec = if per_sec.is_finite() { per_sec.max(0.0) } else { 0.0 };
    match unit {
        Unit::Lines => format!("{per_sec:.0} lines/s"),
        Unit::Bytes => {
            let mut v = per_sec;
            for prefix in ["B", "KiB", "MiB", "GiB"] {
                if v < 1024.0 {
                    return if prefix == "B" { format!("{v:.0} B/s") } else { format!("{v:.1} {prefix}/s") };
                }
                v /= 1024.0;
            }
            format!("{v:.1} TiB/s")
        }
    }
}

/// A bar on a terminal (hidden otherwise); a spinner when the total is unknown (standard input).
fn progress(total: Option<u64>, what: &str, unit: Unit) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    let pb = match total {
        Some(n) => indicatif::ProgressBar::new(n),
        None => indicatif::ProgressBar::new_spinner(),
    };
    if std::io::stderr().is_terminal() {
        let (done, of) = match unit {
            Unit::Lines => ("{human_pos}", "{human_len} lines"),
            Unit::Bytes => ("{binary_bytes}", "{binary_total_bytes}"),
        };
        let template = match total {
            Some(_) => format!("{{msg}} {{bar:40}} {done}/{of} ({{rate}}, {{eta}} left)"),
            None => format!("{{msg}} {{spinner}} {done} ({{rate}})"),
        };
        let style = indicatif::ProgressStyle::with_template(&template)
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .with_key("rate", move |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = w.write_str(&rate(s.per_sec(), unit));
            });
        pb.set_style(style);
        pb.set_message(what.to_owned());
    } else {
        pb.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    pb
}

async fn cli_export(
    app: AppRef,
    key: &str,
    run_id: &str,
    opts: crate::export::RunExport,
    out: Option<PathBuf>,
) -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt;
    let who = app.authenticate(Some(key)).await?;
    let run = app.run(&who, run_id).await?;
    opts.check_run(&run)?;
    let total =
        (opts.to_seq.unwrap_or(run.last_seq).min(run.last_seq) - opts.from_seq.unwrap_or(1) + 1).max(0);
    let pb = progress(Some(total as u64), "exporting", Unit::Lines);
    let (tx, mut rx) = tokio::sync::mpsc::channel(crate::export::CHANNEL);
    let job = tokio::spawn(crate::export::export_run(app, who, run, opts, tx));
    let mut sink: Box<dyn tokio::io::AsyncWrite + Unpin + Send> = match &out {
        Some(path) => Box::new(tokio::fs::File::create(path).await?),
        None => Box::new(tokio::io::stdout()),
    };
    while let Some(chunk) = rx.recv().await {
        sink.write_all(&chunk).await?;
        pb.inc(chunk.iter().filter(|b| **b == b'\n').count() as u64);
    }
    sink.flush().await?;
    let lines = job.await??;
    pb.finish_and_clear();
    eprintln!("exported {lines} lines{}", out.map(|p| format!(" to {}", p.display())).unwrap_or_default());
    Ok(())
}

/// Imports a file line by line: memory stays flat whatever its size.
async fn cli_import(app: AppRef, key: &str, file: &std::path::Path) -> anyhow::Result<()> {
    use crate::domain::jsonl::ExportLines;
    use crate::error::Error;
    use crate::storage::import::Imported;
    use anyhow::Context;
    use tokio::io::AsyncBufReadExt;
    let who = app.authenticate(Some(key)).await?;
    // `-` is standard input, as for most tools that read a file.
    let (input, size): (Box<dyn tokio::io::AsyncRead + Unpin + Send>, Option<u64>) = if file.as_os_str()
        == "-"
    {
        (Box::new(tokio::io::stdin()), None)
    } else {
        let f = tokio::fs::File::open(file).await.with_context(|| format!("opening {}", file.display()))?;
        let size = f.metadata().await?.len();
        (Box::new(f), Some(size))
    };
    let pb = progress(size, "importing (one transaction)", Unit::Bytes);
    let reader = LineReader {
        raw: tokio::io::BufReader::with_capacity(1 << 20, input).split(b'\n'),
        lines: ExportLines::new(app.settings.limits),
        number: 0,
        done: false,
        pb: pb.clone(),
    };
    let events = futures::stream::unfold(reader, |mut r| async move {
        if r.done {
            return None;
        }
        loop {
            let item = match r.raw.next_segment().await {
                Err(e) => Err(Error::Internal(anyhow::Error::new(e).context("reading the file"))),
                Ok(None) => {
                    r.done = true;
                    return r.lines.finish().err().map(|e| (Err(Error::Rejected(e)), r));
                }
                Ok(Some(line)) => {
                    r.number += 1;
                    r.pb.inc(line.len() as u64 + 1);
                    match r.lines.line(r.number, &line) {
                        Ok(None) => continue,
                        Ok(Some(l)) => Ok(Imported { ts: l.ts, event: l.event, line: r.number }),
                        Err(e) => Err(Error::Rejected(e)),
                    }
                }
            };
            r.done = item.is_err();
            return Some((item, r));
        }
    });
    let run = app.import_events(&who, Box::pin(events)).await?;
    pb.finish_and_clear();
    eprintln!("imported {} events", run.last_seq);
    println!("{}", run.run_id);
    Ok(())
}

/// The state of [`cli_import`]'s reading.
struct LineReader {
    raw: tokio::io::Split<tokio::io::BufReader<Box<dyn tokio::io::AsyncRead + Unpin + Send>>>,
    lines: crate::domain::jsonl::ExportLines,
    number: usize,
    done: bool,
    pb: indicatif::ProgressBar,
}

/// `agent-stream health`: `GET /readyz` on the service at `listen`, within 5 s.
async fn health(mut listen: SocketAddr) -> anyhow::Result<()> {
    use anyhow::Context;
    if listen.ip().is_unspecified() {
        listen.set_ip(if listen.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    let base = format!("http://{listen}");
    let ask = readyz(listen);
    let answer = tokio::time::timeout(std::time::Duration::from_secs(5), ask)
        .await
        .map_err(|_| anyhow::anyhow!("{base}/readyz did not answer within 5 s"))?
        .with_context(|| format!("cannot reach the service at {base}"))?;
    let (status, body) = answer;
    println!("{body}");
    if status != hyper::StatusCode::OK {
        anyhow::bail!("not ready: {base}/readyz answered {status}");
    }
    Ok(())
}

/// `GET /readyz` on `listen`: its status and body.
async fn readyz(listen: std::net::SocketAddr) -> anyhow::Result<(hyper::StatusCode, String)> {
    use http_body_util::{BodyExt, Empty};
    let tcp = tokio::net::TcpStream::connect(listen).await?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    let req = hyper::Request::get("/readyz")
        .header(hyper::header::HOST, listen.to_string())
        .body(Empty::<bytes::Bytes>::new())?;
    let answer = send.send_request(req).await?;
    let status = answer.status();
    let body = answer.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Parses the command line and runs the command; what the binary's `main` calls.
pub fn main() -> std::process::ExitCode {
    // Outside the runtime: the OTLP exporter's blocking HTTP client may not be built
    // inside one.
    init_tracing();
    // A runtime like `#[tokio::main]`'s, whose workers give idle memory back as they park.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_park(crate::alloc::collect_when_idle)
        .build();
    let code = match rt {
        Ok(rt) => rt.block_on(run_main()),
        Err(e) => {
            eprintln!("error: could not start the async runtime: {e}");
            std::process::ExitCode::FAILURE
        }
    };
    crate::telemetry::shutdown();
    code
}

async fn run_main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}` prints the cause chain on one line; no backtrace for a user's mistake.
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve {
            db,
            listen,
            pool_size,
            cors_origin,
            max_body_bytes,
            max_event_bytes,
            max_batch_events,
            append_rate,
            group_commit_lanes,
            ws_max_operations,
            ws_max_sockets_per_key,
            ws_stall_secs,
            pool_idle_secs,
            retention,
            retention_interval,
        } => {
            let settings = Settings {
                limits: Limits { max_event_bytes, max_batch_events },
                max_body_bytes,
                cors_origins: Some(cors_origin.into_iter().filter(|o| !o.is_empty()).collect()),
                append_rate: (append_rate > 0.0).then_some(crate::ratelimit::RateLimit {
                    per_sec: append_rate,
                    burst: append_rate * 2.0,
                }),
                group_commit_lanes,
                ws: crate::app::WsLimits {
                    max_operations: ws_max_operations,
                    max_sockets_per_key: ws_max_sockets_per_key,
                    stall: std::time::Duration::from_secs(ws_stall_secs.max(1)),
                },
                pool_idle: (pool_idle_secs > 0).then(|| std::time::Duration::from_secs(pool_idle_secs)),
                ..Settings::default()
            };
            let every = (retention_interval > 0).then(|| std::time::Duration::from_secs(retention_interval));
            let retention = (retention.policy()?, every);
            server::serve(ServeOptions { db: db.choice(), listen, pool_size, settings, retention }).await
        }
        Command::Migrate { db } => {
            let database = Database::open(&db.choice()).await?;
            let report = database.migrate().await;
            database.close().await?;
            let report = report?;
            println!("applied {:?}; already present {:?}", report.applied, report.skipped);
            Ok(())
        }
        Command::Retention { dry_run, retention, db } => {
            let policy = retention.policy()?;
            let report =
                with_owner(&db, async |c| Ok(crate::storage::retention::sweep(c, policy, dry_run).await?))
                    .await?;
            for r in &report.runs {
                println!(
                    "{} {} {} ended {} ({} events)",
                    r.tenant_id,
                    r.run_id,
                    r.state,
                    r.ended_at.to_rfc3339(),
                    r.events
                );
            }
            let verb = if dry_run { "would delete" } else { "deleted" };
            println!("{verb} {} runs with {} events", report.runs.len(), report.events());
            Ok(())
        }
        Command::Tenant { cmd: TenantCmd::Retention { name, done_days, failed_days, db } } => {
            anyhow::ensure!(
                done_days.is_none_or(|d| d > 0) && failed_days.is_none_or(|d| d > 0),
                "retention days must be 1 or more"
            );
            let found = with_owner(&db, async |c| {
                Ok(crate::storage::retention::set_override(c, &name, done_days, failed_days).await?)
            })
            .await?;
            anyhow::ensure!(found, "no tenant named `{name}`");
            println!("{}", retention_line(&name, done_days, failed_days));
            Ok(())
        }
        Command::Tenant { cmd: TenantCmd::Create { name, db } } => {
            let key = with_owner(&db, async |c| {
                Ok(tenants::create_tenant(c, &name, &[Scope::Read, Scope::Write]).await?)
            })
            .await?;
            println!("created tenant `{name}` ({}); its read+write API key:", key.tenant_id);
            println!("{}", key.secret);
            Ok(())
        }
        Command::Key { cmd: KeyCmd::Create { tenant, scopes, label, db } } => {
            let scopes = parse_scopes(&scopes)?;
            let key = with_owner(&db, async |c| {
                Ok(tenants::create_key(c, &tenant, &scopes, label.as_deref()).await?)
            })
            .await?;
            println!("new key {} for tenant `{tenant}`:", key.key_id);
            println!("{}", key.secret);
            Ok(())
        }
        Command::Key { cmd: KeyCmd::Revoke { key_id, db } } => {
            let revoked = with_owner(&db, async |c| Ok(tenants::revoke_key(c, &key_id).await?)).await?;
            if revoked {
                println!("revoked key {key_id}");
                Ok(())
            } else {
                anyhow::bail!("no live key with id {key_id}")
            }
        }
        Command::Analyst { cmd: AnalystCmd::Create { tenant, role, password, db } } => {
            let login = with_owner(&db, async |c| {
                Ok(tenants::create_analyst(c, &tenant, &role, password.as_deref()).await?)
            })
            .await?;
            if !login.closed.is_empty() {
                println!(
                    "revoked PUBLIC's CONNECT on {} (granted to the logins that had it), so analysts cannot connect there",
                    login.closed.join(", ")
                );
            }
            for db in &login.still_open {
                eprintln!(
                    "warning: analyst logins can still connect to database `{db}`; as its owner or a superuser, \
                     run: REVOKE CONNECT ON DATABASE \"{db}\" FROM PUBLIC (after granting CONNECT to the roles that need it)"
                );
            }
            println!("created analyst login `{}` for tenant `{tenant}`; see docs/analysts.md", login.role);
            Ok(())
        }
        Command::Export { run_id, out, from_seq, to_seq, format, key, db } => {
            let format = crate::dialect::Format::parse(Some(&format))?;
            let opts = crate::export::RunExport { from_seq, to_seq, format, ..Default::default() };
            opts.check()?;
            with_app(&db, async |app| cli_export(app, &key, &run_id, opts, out).await).await
        }
        Command::Import { file, key, db } => {
            with_app(&db, async |app| cli_import(app, &key, &file).await).await
        }
        Command::Schema => {
            print!("{}", crate::graphql::sdl());
            Ok(())
        }
        Command::Health { listen } => health(listen).await,
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_origin, rate, retention_line, Unit};

    #[test]
    fn the_log_filter_builds_no_span_it_refuses_and_never_the_drivers_parameters() {
        let _one = crate::log_capture::one_subscriber_at_a_time();
        use tracing_subscriber::filter::EnvFilter;
        use tracing_subscriber::prelude::*;
        // The service's own layers, without OpenTelemetry (as when OTEL_* is unset).
        let log = |directives: &str| {
            tracing_subscriber::registry().with(super::layers(
                EnvFilter::new(directives),
                false,
                None,
                std::io::sink,
                false,
            ))
        };
        tracing::subscriber::with_default(log("error"), || {
            // A refused span is not built at all (it used to be, and entered per frame).
            assert!(tracing::info_span!("request").is_disabled());
            assert!(tracing::enabled!(tracing::Level::ERROR));
        });
        // Below the filter's level nothing reaches a filter: the subscriber's hint is it.
        use tracing::Subscriber;
        use tracing_subscriber::filter::LevelFilter;
        assert_eq!(log("info,tokio_postgres=warn").max_level_hint(), Some(LevelFilter::INFO));
        assert_eq!(log("debug").max_level_hint(), Some(LevelFilter::DEBUG));
        tracing::subscriber::with_default(log("debug"), || {
            assert!(!tracing::info_span!("request").is_disabled());
            // The spans only traces want are not built for the log, at any level.
            assert!(tracing::info_span!(target: crate::storage::TRACES, "append").is_disabled());
            assert!(!tracing::enabled!(target: "tokio_postgres::query", tracing::Level::DEBUG));
            assert!(tracing::enabled!(target: "tokio_postgres::connection", tracing::Level::INFO));
        });
    }

    /// A log line written inside a request (an internal error's, say) carries the
    /// request span's context and none of the trace-only spans', as plain text when the
    /// log is not a terminal.
    #[test]
    fn a_log_line_has_the_requests_context_in_plain_text() {
        let _one = crate::log_capture::one_subscriber_at_a_time();
        use tracing_subscriber::filter::EnvFilter;
        use tracing_subscriber::prelude::*;
        for ansi in [false, true] {
            let buf = crate::log_capture::LogBuf::default();
            let writer = buf.clone();
            let log = tracing_subscriber::registry().with(super::layers(
                EnvFilter::new("info"),
                false,
                None,
                move || writer.clone(),
                ansi,
            ));
            tracing::subscriber::with_default(log, || {
                let request = tracing::info_span!("request", method = "POST", path = "/v1/runs/R/events");
                let _r = request.enter();
                let append = tracing::info_span!(target: crate::storage::TRACES, "append", events = 7);
                let _a = append.enter();
                tracing::error!(error = "boom", "internal error");
            });
            let text = buf.text();
            assert!(text.contains("internal error"), "{text}");
            assert!(text.contains("/v1/runs/R/events"), "the request's context: {text}");
            assert!(!text.contains("events=7") && !text.contains("append"), "a trace-only span: {text}");
            assert_eq!(text.contains('\x1b'), ansi, "escape codes only for a terminal: {text:?}");
        }
    }

    #[test]
    fn rates_have_units_and_no_noise_digits() {
        assert_eq!(rate(1234.56789, Unit::Lines), "1235 lines/s");
        assert_eq!(rate(0.0, Unit::Lines), "0 lines/s");
        assert_eq!(rate(f64::NAN, Unit::Lines), "0 lines/s");
        assert_eq!(rate(512.4, Unit::Bytes), "512 B/s");
        assert_eq!(rate(1536.0, Unit::Bytes), "1.5 KiB/s");
        assert_eq!(rate(12.345 * 1024.0 * 1024.0, Unit::Bytes), "12.3 MiB/s");
    }

    #[test]
    fn tenant_retention_says_what_it_set_in_words() {
        assert_eq!(
            retention_line("acme", None, None),
            "tenant `acme` follows the service's retention defaults"
        );
        let line = retention_line("acme", Some(7), Some(1));
        assert_eq!(
            line,
            "tenant `acme`: done runs are kept for 7 days after they end, aborted and error runs for 1 day"
        );
        let line = retention_line("acme", None, Some(3));
        assert_eq!(
            line,
            "tenant `acme`: done runs are kept for the service's default time after they end, aborted and error runs for 3 days"
        );
    }

    #[test]
    fn cors_origins_are_checked_and_star_means_any() {
        assert_eq!(parse_origin("*").as_deref(), Ok("*"));
        assert_eq!(parse_origin("https://app.example.com/").as_deref(), Ok("https://app.example.com"));
        assert_eq!(parse_origin("http://localhost:3000").as_deref(), Ok("http://localhost:3000"));
        for bad in [
            "app.example.com",
            "https://a.example/path",
            "https://a.example?x=1",
            "https://u@a.example",
            "*.example.com",
        ] {
            let e = parse_origin(bad).expect_err(bad);
            assert!(e.contains("not an origin"), "{bad}: {e}");
        }
    }
}
