//! Pieces the load tool and the criterion benches share: a separate `agent-stream
//! serve` process to measure, its `/proc` readings, percentiles, a bare SSE reader and
//! the bare NOTIFY → LISTEN baseline.

use std::time::{Duration, Instant};

use super::http::Conn;

/// A release `agent-stream serve` on a free port over `schema` of `url`.
pub struct Server {
    /// The process (killed on drop).
    pub child: tokio::process::Child,
    /// Its pid.
    pub pid: u32,
    /// `http://127.0.0.1:<port>`
    pub base: String,
}

/// Starts `bin serve` with `extra` flags and waits until it answers `/healthz`.
/// `AGENT_STREAM_BIN` runs another build of the binary instead (an A/B of two commits).
pub async fn serve(bin: &std::path::Path, url: &str, schema: &str, extra: &[&str]) -> Server {
    let bin = std::env::var_os("AGENT_STREAM_BIN").map_or_else(|| bin.to_owned(), std::path::PathBuf::from);
    start(&bin, |c, listen| {
        c.args(["serve", "--listen", listen, "--schema", schema])
            .args(extra)
            .env("DATABASE_URL", url)
            .env("RUST_LOG", "error")
            .stdout(std::process::Stdio::null());
    })
    .await
}

/// The [`floor`](crate::floor) server, a process of this tool's own binary, on a free
/// port; answers like [`serve`]'s once it is listening.
pub async fn floor() -> Server {
    let exe = std::env::current_exe().expect("this tool's path");
    start(&exe, |c, listen| {
        c.args([crate::FLOOR, "--listen", listen]);
    })
    .await
}

/// Starts `bin` on a free port (`args` gets the command and `127.0.0.1:<port>`) and
/// waits, up to 10 s, until it answers `/healthz`.
async fn start(bin: &std::path::Path, args: impl FnOnce(&mut tokio::process::Command, &str)) -> Server {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let mut command = tokio::process::Command::new(bin);
    args(&mut command, &format!("127.0.0.1:{port}"));
    let child =
        command.kill_on_drop(true).spawn().unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
    let pid = child.id().expect("pid");
    let base = format!("http://127.0.0.1:{port}");
    for _ in 0..200 {
        if let Ok(mut c) = Conn::open(&base).await {
            if c.get("/healthz", None).await.is_ok_and(|a| a.status.is_success()) {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Server { child, pid, base }
}

/// A connection to `url` whose driver runs on its own task.
pub async fn connect(url: &str) -> tokio_postgres::Client {
    // The service's own connect, so the baseline speaks the same TLS as the service.
    agent_stream::storage::db::connect(url).await.expect("connect")
}

/// Runs `sql` (a `COPY ... FROM STDIN`) with `data` in COPY's text format and returns
/// the number of rows it wrote.
pub async fn copy_in(c: &tokio_postgres::Client, sql: &str, data: String) -> u64 {
    use futures::SinkExt;
    let sink = c.copy_in::<_, bytes::Bytes>(sql).await.expect("copy");
    futures::pin_mut!(sink);
    sink.send(bytes::Bytes::from(data)).await.expect("copy data");
    sink.finish().await.expect("copy finish")
}

/// Creates a run over HTTP (`POST /v1/runs`), checks the 201 and returns its id.
pub async fn create_run(http: &mut Conn, key: &str) -> String {
    let r = http.send(hyper::Method::POST, "/v1/runs", Some(key), None).await.expect("create run");
    assert_eq!(r.status, hyper::StatusCode::CREATED, "create run: {}", r.text());
    r.json()["run_id"].as_str().expect("run_id").to_owned()
}

/// The WebSocket clients' settings: a 16 KiB read buffer. tungstenite zeroes its whole
/// read buffer, 128 KiB by default, on every read: at 1,000 subscribers that memset was
/// 45% of this tool's CPU (19% of the machine), on the cores the server under test
/// shares (docs/benchmarks-log.md, 2026-12-02 19:00). 16 KiB still takes a wake-up's
/// frames in a read or two.
fn client_config() -> tokio_tungstenite::tungstenite::protocol::WebSocketConfig {
    tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default().read_buffer_size(16 * 1024)
}

/// A `graphql-transport-ws` socket to the server at `addr`, acknowledged for `key`.
pub async fn graphql_ws(
    addr: &str,
    key: &str,
) -> Result<
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    String,
> {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Message};
    let mut req = format!("ws://{addr}/graphql/ws").into_client_request().map_err(|e| e.to_string())?;
    req.headers_mut().insert("sec-websocket-protocol", "graphql-transport-ws".parse().expect("header"));
    let (mut ws, _) = tokio_tungstenite::connect_async_with_config(req, Some(client_config()), false)
        .await
        .map_err(|e| e.to_string())?;
    let init =
        serde_json::json!({"type": "connection_init", "payload": {"authorization": format!("Bearer {key}")}});
    ws.send(Message::text(init.to_string())).await.map_err(|e| e.to_string())?;
    match ws.next().await {
        Some(Ok(Message::Text(t))) if t.contains("connection_ack") => Ok(ws),
        other => Err(format!("no connection_ack: {other:?}")),
    }
}

/// A subscriber of seed 004's WebSocket profile for `run`, every event in full, read
/// with [`client_config`] as [`graphql_ws`] is.
pub async fn profile_ws(
    addr: &str,
    key: &str,
    run: &str,
) -> Result<
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    String,
> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let url = format!("ws://{addr}/v1/agent/runs/{run}/stream?detail=full");
    let mut req = url.into_client_request().map_err(|e| e.to_string())?;
    let h = req.headers_mut();
    h.insert("sec-websocket-protocol", "koder-agent-stream-v1".parse().expect("header"));
    h.insert("authorization", format!("Bearer {key}").parse().map_err(|_| "a key fit for a header")?);
    let (ws, _) = tokio_tungstenite::connect_async_with_config(req, Some(client_config()), false)
        .await
        .map_err(|e| e.to_string())?;
    Ok(ws)
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS:`, `VmHWM:`), in KiB.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The `p` quantile of `v` (sorted in place); NaN when empty.
pub fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// Raises this process's open-file limit to its hard limit, for scenarios that hold
/// a socket per subscriber (1,000 and more); left as it is where it cannot be raised.
pub fn raise_open_files() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

/// A `/proc/<pid>/stat` line's command name and CPU seconds: (its own user + system,
/// that of its children it has reaped).
fn stat_cpu(stat: &str) -> Option<(&str, f64, f64)> {
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    let fields: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime, stime, cutime, cstime, in clock ticks of 1/100 s
    Some((stat.get(open + 1..close)?, (ticks(11) + ticks(12)) / 100.0, (ticks(13) + ticks(14)) / 100.0))
}

/// User + system CPU seconds a process has used.
pub fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat_cpu(&stat).map_or(0.0, |(_, own, _)| own)
}

/// CPU seconds used so far by every process on this machine named `postgres` (the
/// database's backends and helpers); a backend that has exited counts through its
/// parent's reaped-children time.
pub fn postgres_cpu_secs() -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc") else { return 0.0 };
    let mut secs = 0.0;
    for entry in dir.flatten() {
        if !entry.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        if let Some(("postgres", own, reaped)) = stat_cpu(&stat) {
            secs += own + reaped;
        }
    }
    secs
}

/// Seconds the threads of `pid` have spent runnable but waiting for a core, so far
/// (the second field of each thread's `/proc/<pid>/task/<tid>/schedstat`, in ns); 0 when
/// the kernel keeps no scheduler statistics. A thread that has exited no longer counts.
pub fn runqueue_wait_secs(pid: u32) -> f64 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0.0 };
    dir.flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().nth(1)?.parse::<f64>().ok())
        .sum::<f64>()
        / 1e9
}

/// Cores used over a window by the database, this load tool and the measured server.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cores {
    /// Every `postgres` process.
    pub postgres: f64,
    /// This process (the producers and readers).
    pub load: f64,
    /// The server measured (0 without one).
    pub server: f64,
    /// The server's threads' time runnable but not on a core, in cores (its seconds of
    /// waiting a second): how much of its time the machine's other processes take. A
    /// wait is paid per wake-up, so it costs latency in proportion to how many turns a
    /// delivery needs, not to this figure alone.
    pub server_waiting: f64,
}

impl Cores {
    /// Microseconds of CPU per item at `rate` items per second: (database, load tool,
    /// server).
    pub fn per_item_us(&self, rate: f64) -> (f64, f64, f64) {
        let us = |cores: f64| cores * 1e6 / rate.max(f64::MIN_POSITIVE);
        (us(self.postgres), us(self.load), us(self.server))
    }
}

/// Reads [`Cores`] from when it was started.
pub struct CpuMeter {
    t0: Instant,
    postgres: f64,
    load: f64,
    /// The server's pid, CPU seconds and run-queue wait at the start.
    server: Option<(u32, f64, f64)>,
}

impl CpuMeter {
    /// Starts measuring, with the server `pid` if there is one.
    pub fn start(server: Option<u32>) -> CpuMeter {
        CpuMeter {
            t0: Instant::now(),
            postgres: postgres_cpu_secs(),
            load: cpu_secs(std::process::id()),
            server: server.map(|pid| (pid, cpu_secs(pid), runqueue_wait_secs(pid))),
        }
    }

    /// Cores used since the start.
    pub fn cores(&self) -> Cores {
        let secs = self.t0.elapsed().as_secs_f64().max(f64::MIN_POSITIVE);
        Cores {
            postgres: (postgres_cpu_secs() - self.postgres) / secs,
            load: (cpu_secs(std::process::id()) - self.load) / secs,
            server: self.server.map_or(0.0, |(pid, at, _)| (cpu_secs(pid) - at) / secs),
            server_waiting: self.server.map_or(0.0, |(pid, _, w)| (runqueue_wait_secs(pid) - w) / secs),
        }
    }
}

/// A sample's value in Prometheus text (`name value`); 0 when absent.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok()).unwrap_or(0.0)
}

/// The cumulative buckets of one series of a Prometheus histogram (`name` without
/// `_bucket`, `label` such as `transport="sse"`): (upper bound, count), in order.
pub fn buckets(text: &str, name: &str, label: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{");
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(&prefix)?;
            let (labels, value) = rest.split_once("} ")?;
            if !labels.contains(label) {
                return None;
            }
            let le = labels.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, value.trim().parse().ok()?))
        })
        .collect()
}

/// The upper bound of the bucket holding quantile `p` of what a histogram counted
/// between two samples of its buckets (see [`buckets`]); NaN when it counted nothing.
pub fn bucket_quantile(before: &[(f64, f64)], after: &[(f64, f64)], p: f64) -> f64 {
    let counts: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, n)| (*le, n - before.iter().find(|(l, _)| l == le).map_or(0.0, |b| b.1)))
        .collect();
    let total = counts.last().map_or(0.0, |c| c.1);
    if total <= 0.0 {
        return f64::NAN;
    }
    counts.iter().find(|(_, n)| *n >= p * total).map_or(f64::INFINITY, |c| c.0)
}

/// One sample of the server's `/metrics`, read over `http` (see [`metric`]).
pub async fn scrape(http: &mut Conn, name: &str) -> f64 {
    metric(&http.get("/metrics", None).await.expect("metrics").text(), name)
}

/// A bare SSE reader on one TCP connection: it sends the GET, checks the answer is 200,
/// decodes the chunked body and hands out each frame's `id:`. The measuring side
/// should cost as little as it can: an HTTP client library adds a task hand-off and
/// a copy per chunk to every receipt it times.
pub struct SseReader(Records);

/// An answer's body on a bare connection, read as records that each end with a separator
/// (SSE frames, NDJSON lines); chunked or not.
struct Records {
    stream: tokio::net::TcpStream,
    raw: Vec<u8>,
    body: Vec<u8>,
    chunks: Dechunker,
    chunked: bool,
}

impl Records {
    /// The body after an answer's head: `raw` holds what was read past it.
    fn new(stream: tokio::net::TcpStream, raw: Vec<u8>, chunked: bool) -> Records {
        Records { stream, raw, body: Vec::with_capacity(16 * 1024), chunks: Dechunker::default(), chunked }
    }

    /// Reads until a record ending in `sep` completes for which `each` says it took
    /// something (or the body ends), handing `each` every record completed (without its
    /// separator); false once the body ended. Cancel-safe: what was read and not yet a
    /// whole record stays for the next call.
    async fn read(&mut self, sep: &[u8], mut each: impl FnMut(&[u8]) -> bool) -> std::io::Result<bool> {
        use tokio::io::AsyncReadExt;
        // A SIMD search, not `windows(..).position(..)`: that compared each position with
        // a call to memcmp, 31% of the tool's CPU with 1,000 SSE readers, on the two
        // cores the server under test shares with it.
        let finder = memchr::memmem::Finder::new(sep);
        loop {
            // Bytes left over (after the head, or a chunk cut by a read) go first; what
            // they cannot complete waits for the next read.
            if self.chunked {
                self.chunks.feed(&mut self.raw, &mut self.body);
            } else {
                self.body.append(&mut self.raw);
            }
            let (mut start, mut took) = (0, false);
            while let Some(i) = finder.find(&self.body[start..]) {
                took |= each(&self.body[start..start + i]);
                start += i + sep.len();
            }
            self.body.drain(..start);
            if self.chunks.ended() {
                return Ok(false);
            }
            if took {
                return Ok(true);
            }
            if self.stream.read_buf(&mut self.raw).await? == 0 {
                return Ok(false);
            }
        }
    }
}

/// Decodes an HTTP/1.1 chunked body as its bytes come: [`Dechunker::feed`] moves what
/// the bytes read so far complete into the body and leaves the rest for the next read.
#[derive(Default)]
pub struct Dechunker(Chunk);

#[derive(Default)]
enum Chunk {
    #[default]
    Size,
    Data(usize),
    Crlf,
    End,
}

impl Dechunker {
    /// Decodes what `raw` holds into `body`, draining what it used from `raw`.
    pub fn feed(&mut self, raw: &mut Vec<u8>, body: &mut Vec<u8>) {
        let mut at = 0;
        loop {
            let rest = &raw[at..];
            match self.0 {
                Chunk::Size => {
                    let Some(i) = rest.windows(2).position(|w| w == b"\r\n") else { break };
                    let line = String::from_utf8_lossy(&rest[..i]);
                    let size =
                        usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16).unwrap_or(0);
                    self.0 = if size == 0 { Chunk::End } else { Chunk::Data(size) };
                    at += i + 2;
                }
                Chunk::Data(n) => {
                    if rest.is_empty() {
                        break;
                    }
                    let k = n.min(rest.len());
                    body.extend_from_slice(&rest[..k]);
                    at += k;
                    self.0 = if k == n { Chunk::Crlf } else { Chunk::Data(n - k) };
                }
                Chunk::Crlf => {
                    if rest.len() < 2 {
                        break;
                    }
                    at += 2;
                    self.0 = Chunk::Size;
                }
                Chunk::End => break,
            }
        }
        raw.drain(..at);
    }

    /// Whether the last chunk (size 0, or a size that does not parse) has come.
    pub fn ended(&self) -> bool {
        matches!(self.0, Chunk::End)
    }
}

/// A connection to `addr` (`host:port`) with Nagle off, as every client here has it.
async fn connect_tcp(addr: &str) -> std::io::Result<tokio::net::TcpStream> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Reads from `stream` into `raw` until an answer's head is whole; its length.
async fn read_head(stream: &mut tokio::net::TcpStream, raw: &mut Vec<u8>) -> std::io::Result<usize> {
    use tokio::io::AsyncReadExt;
    loop {
        if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            return Ok(i + 4);
        }
        if stream.read_buf(raw).await? == 0 {
            return Err(std::io::Error::other("connection closed before the response head"));
        }
    }
}

/// Sends `request` (a whole HTTP/1.1 request head, and no body) to `addr`, reads the
/// answer's head and checks it is 200: the connection, the bytes read past the head,
/// and whether the body is chunked.
async fn open_200(addr: &str, request: &str) -> std::io::Result<(tokio::net::TcpStream, Vec<u8>, bool)> {
    use tokio::io::AsyncWriteExt;
    let mut stream = connect_tcp(addr).await?;
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::with_capacity(16 * 1024);
    let head_end = read_head(&mut stream, &mut raw).await?;
    let head = String::from_utf8_lossy(&raw[..head_end]).to_ascii_lowercase();
    if !head.starts_with("http/1.1 200") {
        let body = String::from_utf8_lossy(&raw[head_end..]).into_owned();
        return Err(std::io::Error::other(format!("not 200: {} {body}", head.lines().next().unwrap_or(""))));
    }
    let chunked = head.contains("transfer-encoding: chunked");
    raw.drain(..head_end);
    Ok((stream, raw, chunked))
}

impl SseReader {
    /// Opens `path` (with its query) on `addr` (`host:port`) with a bearer `key`.
    pub async fn open(addr: &str, path: &str, key: &str) -> std::io::Result<SseReader> {
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\nAccept: text/event-stream\r\n\r\n"
        );
        let (stream, raw, chunked) = open_200(addr, &req).await?;
        Ok(SseReader(Records::new(stream, raw, chunked)))
    }

    /// Reads until at least one frame completes (or the stream ends) and appends the
    /// ids of the frames completed to `ids`; false once the stream ended.
    pub async fn read_ids(&mut self, ids: &mut Vec<i64>) -> std::io::Result<bool> {
        self.0
            .read(b"\n\n", |frame| {
                let id: Option<i64> = frame
                    .split(|b| *b == b'\n')
                    .find_map(|l| l.strip_prefix(b"id:"))
                    // A dialect's id may go on past the seq (`S.K`, `S:R1,R2`).
                    .and_then(|v| {
                        let v = std::str::from_utf8(v).ok()?.trim();
                        v[..v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len())].parse().ok()
                    });
                ids.extend(id);
                id.is_some()
            })
            .await
    }
}

/// A streaming append (`POST /v1/runs/{run_id}/events/stream`) on a bare TCP
/// connection, written and read by the one task that owns it. The measuring side should
/// cost as little as it can, as [`SseReader`]: through hyper's client each line crossed a
/// channel to the connection's task and each acknowledgement came back through it to
/// another, and many-runs' load tool took half a core next to the service (and 91% of
/// one next to the floor), on the two cores the service needs.
pub struct BareAppend {
    answer: Records,
    out: Vec<u8>,
}

/// One answer line of a streaming append.
#[derive(Debug, PartialEq)]
pub enum AckLine {
    /// A committed group.
    Committed {
        /// The seq of its first event.
        first_seq: i64,
        /// The number of its first line in the body, from 1.
        first_line: u64,
        /// How many lines it held.
        count: u64,
    },
    /// `{"done":…}`: the body ended and everything in it committed.
    Done,
    /// Anything else (an error line), as it came.
    Other(String),
}

/// The fields of an answer line that [`AckLine`] tells apart.
#[derive(serde::Deserialize)]
struct AckFields {
    first_seq: Option<i64>,
    first_line: Option<u64>,
    count: Option<u64>,
    done: Option<serde::de::IgnoredAny>,
}

impl AckLine {
    /// Reads one answer line (without its newline).
    pub fn parse(line: &[u8]) -> AckLine {
        match serde_json::from_slice::<AckFields>(line) {
            Ok(AckFields {
                first_seq: Some(first_seq),
                first_line: Some(first_line),
                count: Some(count),
                ..
            }) => AckLine::Committed { first_seq, first_line, count },
            Ok(AckFields { done: Some(_), .. }) => AckLine::Done,
            _ => AckLine::Other(String::from_utf8_lossy(line).into_owned()),
        }
    }
}

impl BareAppend {
    /// Opens the streaming append of `run` on `addr` (`host:port`) as `key`; fails unless
    /// the answer is 200.
    pub async fn open(addr: &str, run: &str, key: &str) -> std::io::Result<BareAppend> {
        let req = format!(
            "POST /v1/runs/{run}/events/stream HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\n\
             Content-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
        let (stream, raw, chunked) = open_200(addr, &req).await?;
        Ok(BareAppend { answer: Records::new(stream, raw, chunked), out: Vec::new() })
    }

    /// Writes `line` and a newline as one chunk of the body.
    pub async fn write_line(&mut self, line: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        use tokio::io::AsyncWriteExt;
        self.out.clear();
        write!(self.out, "{:x}\r\n", line.len() + 1)?;
        self.out.extend_from_slice(line);
        self.out.extend_from_slice(b"\n\r\n");
        self.answer.stream.write_all(&self.out).await
    }

    /// Ends the body (its last, empty chunk); the answer goes on until what was sent
    /// has committed.
    pub async fn finish(&mut self) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        self.answer.stream.write_all(b"0\r\n\r\n").await
    }

    /// Reads until at least one answer line completes (or the answer ends) and appends
    /// the lines completed to `acks`; false once the answer ended. Cancel-safe: what was
    /// read and not yet a whole line stays for the next call.
    pub async fn read_acks(&mut self, acks: &mut Vec<AckLine>) -> std::io::Result<bool> {
        self.answer
            .read(b"\n", |line| {
                acks.push(AckLine::parse(line));
                true
            })
            .await
    }
}

/// One keep-alive HTTP/1.1 connection for requests with a body, written and read by
/// the task that sends them: as [`BareAppend`], the measuring side costs as little as
/// it can. Through hyper's client each request and each answer crossed a channel between
/// the producer's task and the connection's, and ingest-single's 64 producers took 37-40
/// µs of CPU an append, a third of what the 2× target leaves all three processes.
pub struct BareConn {
    addr: String,
    stream: Option<tokio::net::TcpStream>,
    raw: Vec<u8>,
    out: Vec<u8>,
}

impl BareConn {
    /// A connection to `base` (`http://host:port`), opened by the first request.
    pub fn new(base: &str) -> BareConn {
        let addr = base.strip_prefix("http://").unwrap_or(base).trim_end_matches('/').to_owned();
        BareConn { addr, stream: None, raw: Vec::with_capacity(4096), out: Vec::with_capacity(1024) }
    }

    /// Opens a connection now (before the first request, or after a broken one); whether
    /// it opened.
    pub async fn reopen(&mut self) -> bool {
        self.raw.clear();
        self.stream = connect_tcp(&self.addr).await.ok();
        self.stream.is_some()
    }

    /// `POST path` with a JSON body as `key`, its answer read whole. A broken connection
    /// is an error, and the next request opens a new one.
    pub async fn post(&mut self, path: &str, key: &str, json: &[u8]) -> std::io::Result<super::http::Answer> {
        let r = self.exchange(path, key, json).await;
        if r.is_err() {
            self.stream = None;
        }
        r
    }

    async fn exchange(&mut self, path: &str, key: &str, json: &[u8]) -> std::io::Result<super::http::Answer> {
        use std::io::Write;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let stream = match &mut self.stream {
            Some(s) => s,
            None => {
                self.raw.clear();
                self.stream.insert(connect_tcp(&self.addr).await?)
            }
        };
        self.out.clear();
        write!(
            self.out,
            "POST {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {key}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.addr,
            json.len()
        )?;
        self.out.extend_from_slice(json);
        stream.write_all(&self.out).await?;
        let head_end = read_head(stream, &mut self.raw).await?;
        let closed = || std::io::Error::other("connection closed before the whole answer");
        let head = String::from_utf8_lossy(&self.raw[..head_end]).to_ascii_lowercase();
        let status = head
            .strip_prefix("http/1.")
            .and_then(|h| h.split_whitespace().nth(1))
            .and_then(|c| c.parse::<u16>().ok())
            .and_then(|c| hyper::StatusCode::from_u16(c).ok())
            .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {head}")))?;
        let header = |name: &str| {
            head.lines()
                .find_map(|l| l.strip_prefix(name).map(|v| v.trim_start_matches(':').trim().to_owned()))
        };
        self.raw.drain(..head_end);
        let body = if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            let (mut chunks, mut body) = (Dechunker::default(), Vec::new());
            loop {
                chunks.feed(&mut self.raw, &mut body);
                // The body ends with the last chunk's CRLF (no trailers are sent), which
                // may come in a read of its own: left unread, it would open the next answer.
                if chunks.ended() && self.raw.len() >= 2 {
                    self.raw.drain(..2);
                    break body;
                }
                if stream.read_buf(&mut self.raw).await? == 0 {
                    return Err(closed());
                }
            }
        } else {
            let len: usize = header("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
            while self.raw.len() < len {
                if stream.read_buf(&mut self.raw).await? == 0 {
                    return Err(closed());
                }
            }
            self.raw.drain(..len).collect()
        };
        if header("connection").is_some_and(|v| v == "close") {
            self.stream = None;
        }
        Ok(super::http::Answer { status, body: bytes::Bytes::from(body) })
    }
}

/// Bare NOTIFY → LISTEN latencies (ms): `n` notifications from one connection to a
/// listening one, `spacing` apart, each timed from send (an autocommit statement, so
/// its commit) to receipt.
pub async fn bare_notify(url: &str, n: usize, spacing: Duration) -> Vec<f64> {
    use futures::StreamExt;
    let base = std::time::Instant::now();
    let micros_since = |b: std::time::Instant| b.elapsed().as_micros() as u64;
    let (listener, mut conn) = agent_stream::storage::db::connect_raw(url, None).await.expect("connect");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut msgs = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(m)) = msgs.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m {
                let _ = tx.send((micros_since(base), n.payload().to_owned()));
            }
        }
    });
    // A channel of this process's own: two load runs against one database (or a stray
    // notifier) would otherwise read each other's clocks, and a payload from another
    // clock can lie after this one's receipt.
    let channel = format!("bench_fanout_{}", std::process::id());
    listener.batch_execute(&format!("LISTEN {channel}")).await.expect("listen");
    let sender = connect(url).await;
    let mut lat = vec![];
    for _ in 0..n {
        let sent = micros_since(base);
        sender.execute("SELECT pg_notify($1, $2)", &[&channel, &sent.to_string()]).await.expect("notify");
        let (got, payload) = rx.recv().await.expect("notification");
        let sent: u64 = payload.parse().expect("payload");
        lat.push(got.saturating_sub(sent) as f64 / 1000.0);
        tokio::time::sleep(spacing).await;
    }
    lat
}

/// The fold benches' mixes: "chatty" is 85% streamed deltas, like a real agent run;
/// "mixed" has every kind of event frequent (the property tests' generator), the harder
/// case for the fold. Each pair is (name, percent of deltas).
pub const FOLD_MIXES: [(&str, u32); 2] = [("chatty", 85), ("mixed", 0)];

/// A stored generated run of `n` events with `delta_pct` percent deltas (fixed seed).
pub fn fold_log(n: usize, delta_pct: u32) -> Vec<agent_stream::domain::Event> {
    agent_stream_core::testkit::stored(&agent_stream_core::testkit::generated_run_mix(42, n, delta_pct))
}

/// The fold's floor: a loop that only touches every event (a match on its type).
pub fn touch(events: &[agent_stream::domain::Event]) -> usize {
    events.iter().filter(|e| matches!(e.body, agent_stream::domain::EventBody::TextDelta(_))).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answer_lines_of_a_streaming_append_are_told_apart() {
        // The shapes `POST /v1/runs/{run_id}/events/stream` documents.
        let ack =
            br#"{"first_seq":12,"last_seq":14,"count":3,"first_line":4,"last_line":6,"replayed":false}"#;
        assert_eq!(AckLine::parse(ack), AckLine::Committed { first_seq: 12, first_line: 4, count: 3 });
        assert_eq!(AckLine::parse(br#"{"done":{"lines":6,"events":6}}"#), AckLine::Done);
        let error = r#"{"error":{"code":"EVENT-INVALID","message":"no type","line":7}}"#;
        assert_eq!(AckLine::parse(error.as_bytes()), AckLine::Other(error.to_owned()));
        assert_eq!(AckLine::parse(b"not json"), AckLine::Other("not json".to_owned()));
    }

    #[test]
    fn the_meter_counts_a_busy_process_named_postgres_and_nothing_else() {
        // `yes` under the name `postgres`: a process that burns a core, as a backend would.
        let dir = std::env::temp_dir().join(format!("cpu-meter-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let busy = dir.join("postgres");
        std::fs::copy("/usr/bin/yes", &busy).expect("copy yes");
        let idle = CpuMeter::start(None);
        std::thread::sleep(Duration::from_millis(300));
        let before = idle.cores();
        let meter = CpuMeter::start(None);
        let mut child =
            std::process::Command::new(&busy).stdout(std::process::Stdio::null()).spawn().expect("spawn");
        std::thread::sleep(Duration::from_millis(500));
        let during = meter.cores();
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            during.postgres > before.postgres + 0.3,
            "a busy `postgres` adds most of a core: {during:?} against {before:?} without it"
        );
        assert!(during.load < 0.3, "this test sleeps: {during:?}");
        assert_eq!(during.server, 0.0);
        let (pg, _, _) = Cores { postgres: 0.5, ..Cores::default() }.per_item_us(10_000.0);
        assert_eq!(pg, 50.0, "half a core over 10,000 rows/s is 50 µs a row");
    }

    #[test]
    fn run_queue_wait_shows_more_busy_processes_than_cores() {
        // One busy process more than there are cores: together they wait about a core's
        // worth of time for one, which the per-thread scheduler statistics show.
        let n = std::thread::available_parallelism().map_or(2, |n| n.get()) + 1;
        let mut kids: Vec<_> = (0..n)
            .map(|_| {
                std::process::Command::new("yes").stdout(std::process::Stdio::null()).spawn().expect("spawn")
            })
            .collect();
        let waited =
            |kids: &[std::process::Child]| kids.iter().map(|k| runqueue_wait_secs(k.id())).sum::<f64>();
        let before = waited(&kids);
        std::thread::sleep(Duration::from_millis(600));
        let wait = waited(&kids) - before;
        for k in &mut kids {
            let _ = k.kill();
            let _ = k.wait();
        }
        assert!(wait > 0.15, "{n} busy processes waited {wait:.3} s for a core in 0.6 s");
        assert!(wait < 0.6 * n as f64, "no process waits longer than the window: {wait:.3} s");
        assert_eq!(runqueue_wait_secs(u32::MAX), 0.0, "no such process");
    }

    #[test]
    fn a_histograms_quantile_between_two_samples_is_its_buckets_bound() {
        let sample = |n: [f64; 4]| {
            let names = ["0.001", "0.002", "0.004", "+Inf"];
            let mut text = String::from("# HELP x\nother_bucket{le=\"0.001\"} 99\n");
            for (le, n) in names.iter().zip(n) {
                text.push_str(&format!("lat_bucket{{transport=\"sse\",le=\"{le}\"}} {n}\n"));
                text.push_str(&format!("lat_bucket{{transport=\"ws\",le=\"{le}\"}} 7\n"));
            }
            buckets(&text, "lat", "transport=\"sse\"")
        };
        let before = sample([10.0, 10.0, 10.0, 10.0]);
        assert_eq!(before.len(), 4);
        // Between the samples: 90 under 1 ms, 9 more under 2 ms, 1 under 4 ms.
        let after = sample([100.0, 109.0, 110.0, 110.0]);
        assert_eq!(bucket_quantile(&before, &after, 0.5), 0.001);
        assert_eq!(bucket_quantile(&before, &after, 0.95), 0.002);
        assert_eq!(bucket_quantile(&before, &after, 1.0), 0.004);
        assert!(bucket_quantile(&before, &before, 0.5).is_nan(), "nothing counted");
    }

    #[tokio::test]
    async fn an_sse_reader_finds_every_frame_whatever_the_reads_and_chunks_cut() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("port");
        // Frames cut inside a chunk's size line, between the two newlines that end a
        // frame, and inside an `id:` line; a comment frame without an id; a dialect's
        // id that goes on past the seq; two frames in one chunk.
        let body: &[&[u8]] = &[
            b"id: 1\ndata: {}\n\n",
            b": keep-alive\n\n",
            b"id: 2\nevent: x\ndata: {\"a\":1}\n\nid: 3.1\ndata: {}\n\n",
            b"id: 4\ndata: {}\n\n",
        ];
        let mut wire =
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                .to_vec();
        for frame in body {
            wire.extend_from_slice(format!("{:x}\r\n", frame.len()).as_bytes());
            wire.extend_from_slice(frame);
            wire.extend_from_slice(b"\r\n");
        }
        wire.extend_from_slice(b"0\r\n\r\n");
        let text = String::from_utf8(wire.clone()).expect("ascii");
        let cuts = [
            text.find("data: {}\n\n").expect("first frame") + 9,
            text.find(&format!("\r\n{:x}\r\n", body[2].len())).expect("the third size line") + 3,
            text.find("id: 3").expect("third id") + 2,
        ];
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await.expect("the request");
            let mut from = 0;
            for at in cuts.into_iter().chain([wire.len()]) {
                s.write_all(&wire[from..at]).await.expect("write");
                s.flush().await.expect("flush");
                from = at;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        let mut reader = SseReader::open(&addr.to_string(), "/s", "k").await.expect("open");
        let mut ids = Vec::new();
        while reader.read_ids(&mut ids).await.expect("read") {}
        assert_eq!(ids, [1, 2, 3, 4]);
        server.await.expect("the server wrote it all");
    }

    #[tokio::test]
    async fn a_bare_connection_reads_a_chunked_answer_split_anywhere_and_the_next_on_the_same_socket() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("port");
        // One connection, two requests: the first answered chunked in pieces (the last
        // chunk's CRLF alone in the last one), the second with a length, then closed.
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut got = Vec::new();
            let mut requests = 0;
            let mut buf = [0u8; 4096];
            while requests < 2 {
                let n = s.read(&mut buf).await.expect("read");
                assert!(n > 0, "the client closed early");
                got.extend_from_slice(&buf[..n]);
                // Each request here carries the 2-byte body `{}` after its head.
                while let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                    if got.len() < i + 6 {
                        break;
                    }
                    got.drain(..i + 6);
                    requests += 1;
                    let pieces: &[&[u8]] = if requests == 1 {
                        &[
                            b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
                            b"lo\r\n6\r\n world\r",
                            b"\n0\r\n",
                            b"\r\n",
                        ]
                    } else {
                        &[b"HTTP/1.1 404 Not Found\r\nContent-Length: 4\r\nConnection: close\r\n\r\nnope"]
                    };
                    for p in pieces {
                        s.write_all(p).await.expect("write");
                        s.flush().await.expect("flush");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
        });
        let mut conn = BareConn::new(&format!("http://{addr}"));
        let a = conn.post("/x", "k", b"{}").await.expect("the chunked answer");
        assert_eq!((a.status.as_u16(), &a.body[..]), (201, &b"hello world"[..]));
        let b = conn.post("/x", "k", b"{}").await.expect("the next answer on the same connection");
        assert_eq!((b.status.as_u16(), &b.body[..]), (404, &b"nope"[..]));
        assert!(conn.stream.is_none(), "`Connection: close` drops the connection");
        server.await.expect("the server saw both requests on one connection");
    }
}
