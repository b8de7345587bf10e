//! Wiring a service together: resolve the database (given, or the embedded default),
//! migrate, make sure the dev tenant exists, serve HTTP until a signal, stop cleanly.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;

use crate::app::{App, Settings};
use crate::auth::Scope;
use crate::storage::embedded::{default_data_dir, Embedded, Supervisor};
use crate::storage::{db, migrate, tenants, Db, DbConfig};

/// Where the database comes from.
#[derive(Debug, Clone)]
pub struct DbChoice {
    /// `DATABASE_URL`; `None` selects the embedded default.
    pub url: Option<String>,
    /// Data directory of the embedded default.
    pub data_dir: Option<PathBuf>,
    /// Schema holding the tables.
    pub schema: String,
}

/// A reachable database, and the private cluster behind it when embedded.
pub struct Database {
    /// Connection string for the owner.
    pub url: String,
    /// Schema in use.
    pub schema: String,
    /// The private cluster, when one is in use (administrative commands).
    pub embedded: Option<Embedded>,
    /// The private cluster kept running, when one is in use (`serve`).
    pub supervisor: Option<Supervisor>,
}

impl Database {
    /// Connects to the given URL or starts/attaches to the private cluster.
    pub async fn open(choice: &DbChoice) -> anyhow::Result<Database> {
        match &choice.url {
            Some(url) => Ok(Database::given(url, choice)),
            None => {
                let dir = choice.data_dir.clone().unwrap_or_else(default_data_dir);
                let emb = Embedded::start(&dir).await?;
                Ok(Database {
                    url: emb.url(),
                    schema: choice.schema.clone(),
                    embedded: Some(emb),
                    supervisor: None,
                })
            }
        }
    }

    /// As [`Database::open`], with the private cluster kept running by a
    /// [`Supervisor`] (restarted if it dies) for as long as the service runs.
    pub async fn open_supervised(choice: &DbChoice) -> anyhow::Result<Database> {
        match &choice.url {
            Some(url) => Ok(Database::given(url, choice)),
            None => {
                let dir = choice.data_dir.clone().unwrap_or_else(default_data_dir);
                let sup = Embedded::start_supervised(&dir).await?;
                Ok(Database {
                    url: sup.url().to_owned(),
                    schema: choice.schema.clone(),
                    embedded: None,
                    supervisor: Some(sup),
                })
            }
        }
    }

    fn given(url: &str, choice: &DbChoice) -> Database {
        Database { url: url.to_owned(), schema: choice.schema.clone(), embedded: None, supervisor: None }
    }

    /// The private cluster's data directory, when one is in use.
    pub fn pgdata(&self) -> Option<&std::path::Path> {
        match (&self.embedded, &self.supervisor) {
            (Some(e), _) => Some(&e.pgdata),
            (_, Some(s)) => Some(s.pgdata()),
            _ => None,
        }
    }

    /// Stops the private cluster if this process started it.
    pub async fn close(self) -> anyhow::Result<()> {
        if let Some(e) = self.embedded {
            e.stop().await?;
        }
        if let Some(s) = self.supervisor {
            s.stop().await?;
        }
        Ok(())
    }

    /// Applies pending migrations.
    pub async fn migrate(&self) -> anyhow::Result<migrate::Report> {
        Ok(migrate::migrate(&self.url, &self.schema).await?)
    }

    /// An owner connection for administration.
    pub async fn owner(&self) -> anyhow::Result<tokio_postgres::Client> {
        Ok(db::connect_owner(&self.url, &self.schema).await?)
    }
}

/// Options of `agent-stream serve`.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Database selection.
    pub db: DbChoice,
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Pool size.
    pub pool_size: usize,
    /// Limits and CORS.
    pub settings: Settings,
    /// Default retention, and how often the sweep runs (`None`: never).
    pub retention: (crate::storage::retention::Policy, Option<std::time::Duration>),
}

/// Runs the service until Ctrl-C or SIGTERM.
pub async fn serve(opts: ServeOptions) -> anyhow::Result<()> {
    let database = Database::open_supervised(&opts.db).await?;
    let result = serve_on(&database, &opts).await;
    let closed = database.close().await;
    result?;
    closed
}

async fn serve_on(database: &Database, opts: &ServeOptions) -> anyhow::Result<()> {
    let report = database.migrate().await.context("migrating the database")?;
    if !report.applied.is_empty() {
        tracing::info!(applied = ?report.applied, "migrations applied");
    }
    let mut settings = opts.settings.clone();
    if let Some(pgdata) = database.pgdata() {
        announce_dev_tenant(database, pgdata).await?;
        if settings.cors_origins.as_ref().is_some_and(|o| o.is_empty()) {
            // The embedded default is a developer's machine: let local frontends in.
            settings.cors_origins = None;
        }
    }
    let db = Db::new(&DbConfig {
        url: database.url.clone(),
        schema: database.schema.clone(),
        max_connections: opts.pool_size,
    })?;
    db.check().await.context("connecting as the service role")?;
    let app = App::new(db, settings);
    if let (policy, Some(every)) = opts.retention {
        tokio::spawn(retention_loop(database.url.clone(), database.schema.clone(), policy, every));
    }
    let listener = listen(opts.listen).with_context(|| format!("binding {}", opts.listen))?;
    let addr = listener.local_addr()?;
    println!("agent-stream listening on http://{addr} (GraphiQL at http://{addr}/graphql)");
    let draining = app.clone();
    let stop = async move {
        shutdown_signal().await;
        draining.shut_down();
    };
    let stall = app.settings.ws.stall;
    axum::serve(streaming(listener, stall), per_connection(crate::http::router(app.clone())))
        .with_graceful_shutdown(stop)
        .await?;
    if !app.sockets_closed(Duration::from_secs(2)).await {
        tracing::warn!("some WebSocket connections did not close within 2 s");
    }
    app.live.stop_listening();
    tracing::info!("shut down");
    Ok(())
}

/// Connections the kernel may hold for the service to accept (capped by the kernel at
/// `net.core.somaxconn`, 4,096 by default). tokio binds with the standard library's 128:
/// 1,000 SSE subscribers connecting at once overflowed it thousands of times per run
/// (`TcpExtListenOverflows`), every overflow a handshake left to the client's
/// retransmission (a second or more), and now and then a connection reset
/// (docs/benchmarks-log.md, 2026-11-29 19:10). Reconnect storms after a deploy or a
/// network cut look like that.
pub const LISTEN_BACKLOG: u32 = 4096;

/// A listener on `addr` with [`LISTEN_BACKLOG`] (and `SO_REUSEADDR`, as tokio's own).
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket =
        if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// The service every connection gets: `router`, its routes made ready once, shared.
///
/// Given a `Router` itself, `axum::serve` rebuilds the routes for each connection
/// (`Router::with_state`, which clones every route's stack of layers when the router is
/// shared) and drops them when it closes: a connection that made one request cost the
/// server 117-131 µs of CPU against 21-24 µs for a request on an open one, and each
/// open connection held ~64 KiB of routes (10,000 SSE subscribers: 94.5 KiB each
/// against 25.5 now; docs/benchmarks-log.md, 2026-11-29 19:10). Built once here, each
/// connection clones an `Arc`.
pub fn per_connection(router: axum::Router) -> axum::routing::IntoMakeService<axum::Router> {
    router.with_state(()).into_make_service()
}

/// Unsent bytes a connection's socket may queue before it stops taking more.
pub const NOTSENT_LOWAT: u32 = 16 * 1024;

/// The listener with every accepted connection tuned for streaming:
/// - Nagle's algorithm off. Streams write one small frame per event: with Nagle on, a
///   frame written while the previous one is unacknowledged waits for the ACK, which
///   the client may delay by up to 40 ms.
/// - `TCP_NOTSENT_LOWAT` at [`NOTSENT_LOWAT`]: the kernel holds at most that much not
///   yet sent, instead of megabytes of send buffer. A stream therefore learns that its
///   client stopped reading while the frames it would queue are still its own to shed
///   (seed 004 R4), and a stuck client costs little kernel memory. Bytes in flight are
///   not limited, so throughput over long links is not either.
/// - `TCP_USER_TIMEOUT` at `stall`: a client that takes nothing for that long (its
///   receive window stays shut, or it is gone) has its connection dropped by the
///   kernel, so a stuck SSE reader does not hold its page and buffers for ever; it
///   resumes from its last id like any cut stream. (A GraphQL WebSocket is closed with
///   1013 after the same time by its own loop, which can still say why.)
pub fn streaming(
    listener: TcpListener,
    stall: std::time::Duration,
) -> impl axum::serve::Listener<Io = tokio::net::TcpStream, Addr = SocketAddr> {
    use axum::serve::ListenerExt;
    let stall_ms = u32::try_from(stall.as_millis()).unwrap_or(u32::MAX);
    listener.tap_io(move |tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not turn Nagle off on a connection");
        }
        if let Err(e) = set_tcp_option(tcp, TcpOption::NotsentLowat, NOTSENT_LOWAT) {
            tracing::debug!(error = %e, "could not set TCP_NOTSENT_LOWAT on a connection");
        }
        if let Err(e) = set_tcp_option(tcp, TcpOption::UserTimeout, stall_ms) {
            tracing::debug!(error = %e, "could not set TCP_USER_TIMEOUT on a connection");
        }
    })
}

/// [`streaming`] with the default stall time (30 s), for tests and benches.
pub fn no_delay(
    listener: TcpListener,
) -> impl axum::serve::Listener<Io = tokio::net::TcpStream, Addr = SocketAddr> {
    streaming(listener, crate::app::WsLimits::default().stall)
}

/// The TCP options set by hand.
#[derive(Clone, Copy)]
enum TcpOption {
    NotsentLowat,
    UserTimeout,
}

/// Sets a TCP option (Linux). `nix` and `socket2` do not wrap `TCP_NOTSENT_LOWAT`, so
/// these are the `setsockopt` calls made by hand.
#[cfg(target_os = "linux")]
fn set_tcp_option(tcp: &tokio::net::TcpStream, option: TcpOption, value: u32) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let name = match option {
        TcpOption::NotsentLowat => libc::TCP_NOTSENT_LOWAT,
        TcpOption::UserTimeout => libc::TCP_USER_TIMEOUT,
    };
    let value = libc::c_int::try_from(value).unwrap_or(libc::c_int::MAX);
    // SAFETY: the fd belongs to a live socket borrowed for the call, and the option
    // value is a c_int of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            tcp.as_raw_fd(),
            libc::IPPROTO_TCP,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn set_tcp_option(_: &tokio::net::TcpStream, _: TcpOption, _: u32) -> std::io::Result<()> {
    Ok(())
}

/// On first start of the embedded default, creates the `dev` tenant and prints its key
/// (also saved, readable only by the owner, next to the cluster).
async fn announce_dev_tenant(database: &Database, pgdata: &std::path::Path) -> anyhow::Result<()> {
    let mut owner = database.owner().await?;
    let key_file = pgdata.with_file_name("dev-key");
    if tenants::tenant_id(&owner, "dev").await?.is_some() {
        println!("dev tenant: key saved in {}", key_file.display());
        return Ok(());
    }
    let key = tenants::create_tenant(&mut owner, "dev", &[Scope::Read, Scope::Write, Scope::Admin]).await?;
    write_private(&key_file, &key.secret)?;
    println!("created tenant `dev`; its API key (also saved in {}):", key_file.display());
    println!("{}", key.secret);
    Ok(())
}

fn write_private(path: &std::path::Path, contents: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    writeln!(f, "{contents}")?;
    Ok(())
}

/// The periodic retention sweep (the only deleting path), on its own owner connection.
async fn retention_loop(
    url: String,
    schema: String,
    policy: crate::storage::retention::Policy,
    every: std::time::Duration,
) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let result = async {
            let mut owner = crate::storage::db::connect_owner(&url, &schema).await?;
            crate::storage::retention::sweep(&mut owner, policy, false).await
        }
        .await;
        match result {
            Ok(r) if !r.runs.is_empty() => {
                tracing::info!(
                    runs = r.runs.len(),
                    events = r.events(),
                    "retention sweep deleted expired runs"
                )
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "retention sweep failed; retrying at the next interval"),
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutdown signal received; draining");
}

#[cfg(test)]
mod tests {
    /// A burst of connections larger than the standard library's backlog (128) is held
    /// for accepting, not dropped: 400 clients connect while nothing accepts, and all 400
    /// are then accepted. With a backlog of 128 the kernel drops the handshakes past it
    /// and about 129 are.
    #[tokio::test]
    async fn a_burst_of_connections_waits_in_the_backlog() {
        use std::time::Duration;
        let listener = super::listen("127.0.0.1:0".parse().expect("addr")).expect("listen");
        let addr = listener.local_addr().expect("addr");
        // A handshake the kernel dropped is retried by the client after a second and
        // more: 3 s tells a held connection from a dropped one.
        let connect =
            move || tokio::time::timeout(Duration::from_secs(3), tokio::net::TcpStream::connect(addr));
        let clients: Vec<_> = (0..400).map(|_| tokio::spawn(connect())).collect();
        let mut held = Vec::with_capacity(clients.len());
        for c in clients {
            if let Ok(Ok(tcp)) = c.await.expect("task") {
                held.push(tcp);
            }
        }
        assert_eq!(held.len(), 400, "every connection of the burst is established within 3 s");
        let mut accepted = Vec::new();
        while let Ok(Ok((tcp, _))) = tokio::time::timeout(Duration::from_millis(500), listener.accept()).await
        {
            accepted.push(tcp);
        }
        assert_eq!(accepted.len(), held.len(), "every connection of the burst is accepted");
    }
}
