//! Wiring a service together: resolve the database (given, or the embedded default),
//! migrate, make sure the dev tenant exists, serve HTTP until a signal, stop cleanly.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
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
    serve_http(streaming(listener, stall), crate::http::router(app.clone()), stop).await;
    if !app.sockets_closed(Duration::from_secs(2)).await {
        tracing::warn!("some WebSocket connections did not close within 2 s");
    }
    app.live.stop_listening();
    tracing::info!("shut down");
    Ok(())
}

/// Serves `router` on `listener` until `stop` resolves, then stops accepting, asks every
/// open connection to close once its requests are answered, and returns when all have
/// (streams end on their own when the app shuts down: see `App::shut_down`).
///
/// Our own accept loop over hyper-util rather than `axum::serve`: axum's wraps every
/// connection in a `select!` that polls its shutdown signal (one `Notify` for all
/// connections, whose waiting poll takes its mutex) on every poll of the connection.
/// Here a connection registers its waker once and checks a flag per poll: 1,130-1,330
/// fewer instructions a streamed line with its delivery (1.9%), 2.1% fewer an append
/// delivered to 8 subscribers (docs/benchmarks-log.md, 2026-12-06 23:20).
pub async fn serve_http<L>(mut listener: L, router: axum::Router, stop: impl Future<Output = ()>)
where
    L: axum::serve::Listener<Io = tokio::net::TcpStream, Addr = SocketAddr>,
{
    // The routes made ready once, each connection cloning an `Arc`. Given a `Router`
    // itself, `axum::serve` rebuilt them for each connection (`Router::with_state`,
    // which clones every route's stack of layers) and dropped them when it closed: a
    // connection that made one request cost the server 117-131 µs of CPU against 21-24
    // µs for a request on an open one, and each open connection held ~64 KiB of routes
    // (docs/benchmarks-log.md, 2026-11-29 19:10).
    let router: axum::Router = router.with_state(());
    let drain = Arc::new(Drain::default());
    // Each connection holds a receiver; `closed` resolves when the last is dropped.
    let (open_tx, open_rx) = tokio::sync::watch::channel(());
    let mut stop = pin!(stop);
    loop {
        let (io, _) = tokio::select! {
            biased;
            () = &mut stop => break,
            accepted = listener.accept() => accepted,
        };
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let (drain, open) = (drain.clone(), open_rx.clone());
        tokio::spawn(async move {
            let mut builder = Builder::new(hyper_util::rt::TokioExecutor::new());
            // HTTP/2 WebSockets (RFC 8441) need the CONNECT protocol, as axum::serve enables.
            builder.http2().enable_connect_protocol();
            let conn = builder.serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(io), service);
            let conn = pin!(conn);
            let drained = Drained::new(conn, drain, |c| c.graceful_shutdown());
            if let Err(e) = drained.await {
                tracing::trace!(error = %e, "connection ended with an error");
            }
            drop(open);
        });
    }
    drop(listener);
    drop(open_rx);
    drain.close();
    open_tx.closed().await;
}

type Builder = hyper_util::server::conn::auto::Builder<hyper_util::rt::TokioExecutor>;

/// The open connections' wakers, woken once when the server stops.
#[derive(Default)]
struct Drain {
    closing: AtomicBool,
    wakers: Mutex<(u64, HashMap<u64, Waker>)>,
}

impl Drain {
    /// Flags every connection to close and wakes each so that it sees the flag.
    fn close(&self) {
        self.closing.store(true, Ordering::Release);
        let wakers = self.wakers.lock().unwrap_or_else(|p| p.into_inner());
        for w in wakers.1.values() {
            w.wake_by_ref();
        }
    }

    /// Registers (or replaces) a connection's waker under `id`, or under a new id.
    fn register(&self, id: Option<u64>, waker: &Waker) -> u64 {
        let mut wakers = self.wakers.lock().unwrap_or_else(|p| p.into_inner());
        let id = id.unwrap_or_else(|| {
            wakers.0 += 1;
            wakers.0
        });
        wakers.1.insert(id, waker.clone());
        id
    }

    fn forget(&self, id: u64) {
        self.wakers.lock().unwrap_or_else(|p| p.into_inner()).1.remove(&id);
    }
}

/// A connection that closes gracefully once its server stops.
struct Drained<'a, C> {
    conn: Pin<&'a mut C>,
    drain: Arc<Drain>,
    /// The waker registered with `drain` (re-registered only should the task's change).
    waker: Option<(u64, Waker)>,
    /// Asks the connection to close once its requests are answered (taken when used).
    shut_down: Option<fn(Pin<&mut C>)>,
}

impl<'a, C> Drained<'a, C> {
    fn new(conn: Pin<&'a mut C>, drain: Arc<Drain>, shut_down: fn(Pin<&mut C>)) -> Self {
        Drained { conn, drain, waker: None, shut_down: Some(shut_down) }
    }
}

impl<C: Future> Future for Drained<'_, C> {
    type Output = C::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<C::Output> {
        let this = &mut *self;
        match &this.waker {
            Some((_, w)) if w.will_wake(cx.waker()) => {}
            other => {
                let id = this.drain.register(other.as_ref().map(|(id, _)| *id), cx.waker());
                this.waker = Some((id, cx.waker().clone()));
            }
        }
        // Checked after registering: `close` sets the flag before it wakes, so a
        // connection registered after the wake-ups still sees it here.
        if let Some(shut_down) = this.shut_down {
            if this.drain.closing.load(Ordering::Acquire) {
                this.shut_down = None;
                shut_down(this.conn.as_mut());
            }
        }
        this.conn.as_mut().poll(cx)
    }
}

impl<C> Drop for Drained<'_, C> {
    fn drop(&mut self) {
        if let Some((id, _)) = self.waker.take() {
            self.drain.forget(id);
        }
    }
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

    /// Stopping `serve_http`: no new connection is accepted, an idle keep-alive
    /// connection is closed at once (it is woken for that, though nothing arrives on
    /// it), a request in flight is still answered, and the server returns once that
    /// connection has closed.
    #[tokio::test]
    async fn a_stop_closes_idle_connections_and_answers_the_request_in_flight() {
        use std::time::Duration;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let release = std::sync::Arc::new(tokio::sync::Notify::new());
        let held = release.clone();
        let router = axum::Router::new().route("/fast", axum::routing::get(|| async { "ok" })).route(
            "/slow",
            axum::routing::get(move || async move {
                held.notified().await;
                "done"
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(super::serve_http(super::no_delay(listener), router, async {
            let _ = stopped.await;
        }));
        // Reads until `end` (or end of stream, or 5 s): what arrived.
        async fn read_until(tcp: &mut tokio::net::TcpStream, end: &str) -> String {
            let mut got = Vec::new();
            let mut buf = [0u8; 1024];
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while !String::from_utf8_lossy(&got).ends_with(end) {
                match tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
                    Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
                    _ => break,
                }
            }
            String::from_utf8_lossy(&got).into_owned()
        }
        let mut idle = tokio::net::TcpStream::connect(addr).await.expect("connect");
        idle.write_all(b"GET /fast HTTP/1.1\r\nhost: x\r\n\r\n").await.expect("write");
        assert!(read_until(&mut idle, "ok").await.starts_with("HTTP/1.1 200"), "answered before the stop");
        let mut busy = tokio::net::TcpStream::connect(addr).await.expect("connect");
        busy.write_all(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n").await.expect("write");
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop.send(()).expect("the server is running");
        // The idle connection is closed: its read ends without a byte.
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(0))), "the idle connection is closed at the stop: {read:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "no connection is accepted after the stop"
        );
        assert!(!server.is_finished(), "the server waits for the request in flight");
        release.notify_one();
        let answer = read_until(&mut busy, "done").await;
        assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("done"), "{answer}");
        let ended = tokio::time::timeout(Duration::from_secs(5), server).await;
        assert!(matches!(ended, Ok(Ok(()))), "the server returns once its last connection closed");
    }
}
