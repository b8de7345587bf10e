//! A lean HTTP/1.1 client for the load tool: one connection per producer or subscriber
//! (no shared pool to lock), and no work per request beyond hyper's own, so the load
//! generator takes as little as it can of the cores it shares with the service.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;

/// One keep-alive connection to the service.
pub struct Conn {
    send: SendRequest<Full<Bytes>>,
    host: String,
}

/// A whole answer.
pub struct Answer {
    /// Its status.
    pub status: StatusCode,
    /// Its body.
    pub body: Bytes,
}

impl Answer {
    /// The body as JSON (`Null` when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_default()
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl Conn {
    /// Connects to `base` (`http://host:port`).
    pub async fn open(base: &str) -> anyhow::Result<Conn> {
        let host = base.strip_prefix("http://").unwrap_or(base).trim_end_matches('/').to_owned();
        let tcp = tokio::net::TcpStream::connect(&host).await?;
        tcp.set_nodelay(true)?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn { send, host })
    }

    /// Sends a request and returns the answer's head, its body still to read.
    pub async fn start(
        &mut self,
        method: Method,
        path: &str,
        key: Option<&str>,
        json: Option<Bytes>,
    ) -> anyhow::Result<hyper::Response<Incoming>> {
        let mut req = Request::builder().method(method).uri(path).header(hyper::header::HOST, &self.host);
        if let Some(key) = key {
            req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {key}"));
        }
        if json.is_some() {
            req = req.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        let req = req.body(Full::new(json.unwrap_or_default()))?;
        self.send.ready().await?;
        Ok(self.send.send_request(req).await?)
    }

    /// Sends a request and reads the whole answer.
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        key: Option<&str>,
        json: Option<Bytes>,
    ) -> anyhow::Result<Answer> {
        let r = self.start(method, path, key, json).await?;
        let status = r.status();
        let body = r.into_body().collect().await?.to_bytes();
        Ok(Answer { status, body })
    }

    /// `GET path`.
    pub async fn get(&mut self, path: &str, key: Option<&str>) -> anyhow::Result<Answer> {
        self.send(Method::GET, path, key, None).await
    }

    /// `POST path` with a JSON body.
    pub async fn post(&mut self, path: &str, key: &str, json: Bytes) -> anyhow::Result<Answer> {
        self.send(Method::POST, path, Some(key), Some(json)).await
    }
}

/// One cleartext HTTP/2 connection (prior knowledge) that many producers share, as a
/// client process running many runs would: each request is a stream multiplexed on it,
/// so requests that are ready together go out, and are answered, in shared writes.
#[derive(Clone)]
pub struct H2Conn {
    send: hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    base: String,
}

impl H2Conn {
    /// Connects to `base` (`http://host:port`) and opens HTTP/2 on the connection.
    pub async fn open(base: &str) -> anyhow::Result<H2Conn> {
        let base = base.trim_end_matches('/').to_owned();
        let host = base.strip_prefix("http://").unwrap_or(&base).to_owned();
        let tcp = tokio::net::TcpStream::connect(&host).await?;
        tcp.set_nodelay(true)?;
        let (send, conn) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), TokioIo::new(tcp))
                .await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(H2Conn { send, base })
    }

    /// `POST path` with a JSON body as `key`, read whole.
    pub async fn post(&mut self, path: &str, key: &str, json: Bytes) -> anyhow::Result<Answer> {
        // HTTP/2 carries the scheme and authority as pseudo-headers, taken from the URI.
        let req = Request::builder()
            .method(Method::POST)
            .uri(format!("{}{path}", self.base))
            .header(hyper::header::AUTHORIZATION, format!("Bearer {key}"))
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(json))?;
        self.send.ready().await?;
        let r = self.send.send_request(req).await?;
        let status = r.status();
        let body = r.into_body().collect().await?.to_bytes();
        Ok(Answer { status, body })
    }
}

/// The request body of a streaming append: lines as they are written.
type Lines = http_body_util::StreamBody<
    futures::channel::mpsc::Receiver<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>>,
>;

/// A streaming append (`POST /v1/runs/{run_id}/events/stream`) on a connection of its
/// own: NDJSON lines go up as they are written, acknowledgement lines come down as the
/// service commits them.
pub struct AppendStream {
    lines: futures::channel::mpsc::Sender<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>>,
    acks: AckReader,
}

/// The answer side of an [`AppendStream`], which a task of its own can read.
pub struct AckReader {
    body: Incoming,
    buf: Vec<u8>,
}

impl AppendStream {
    /// Opens the stream of `run` at `base` as `key`; fails unless the answer is 200.
    pub async fn open(base: &str, run: &str, key: &str) -> anyhow::Result<AppendStream> {
        let host = base.strip_prefix("http://").unwrap_or(base).trim_end_matches('/').to_owned();
        let tcp = tokio::net::TcpStream::connect(&host).await?;
        tcp.set_nodelay(true)?;
        let (mut send, conn) = hyper::client::conn::http1::handshake::<_, Lines>(TokioIo::new(tcp)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let (lines, rx) = futures::channel::mpsc::channel(64);
        let req = Request::builder()
            .method(Method::POST)
            .uri(format!("/v1/runs/{run}/events/stream"))
            .header(hyper::header::HOST, &host)
            .header(hyper::header::AUTHORIZATION, format!("Bearer {key}"))
            .header(hyper::header::CONTENT_TYPE, "application/x-ndjson")
            .body(http_body_util::StreamBody::new(rx))?;
        send.ready().await?;
        let r = send.send_request(req).await?;
        if r.status() != StatusCode::OK {
            let body = r.into_body().collect().await?.to_bytes();
            anyhow::bail!("streaming append refused: {}", String::from_utf8_lossy(&body));
        }
        Ok(AppendStream { lines, acks: AckReader { body: r.into_body(), buf: vec![] } })
    }

    /// Writes one line (a newline is added).
    pub async fn send(&mut self, line: &[u8]) -> anyhow::Result<()> {
        use futures::SinkExt;
        let mut b = Vec::with_capacity(line.len() + 1);
        b.extend_from_slice(line);
        b.push(b'\n');
        self.lines.send(Ok(hyper::body::Frame::data(Bytes::from(b)))).await?;
        Ok(())
    }

    /// Splits the stream into its writing half (dropping it ends the body) and its
    /// answer.
    pub fn split(
        self,
    ) -> (
        futures::channel::mpsc::Sender<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>>,
        AckReader,
    ) {
        (self.lines, self.acks)
    }

    /// The next answer line.
    pub async fn next(&mut self) -> anyhow::Result<Option<serde_json::Value>> {
        self.acks.next().await
    }
}

impl AckReader {
    /// The next answer line as JSON; `None` at the end of the answer.
    pub async fn next(&mut self) -> anyhow::Result<Option<serde_json::Value>> {
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return Ok(Some(serde_json::from_slice(&line)?));
            }
            match self.body.frame().await {
                Some(f) => {
                    if let Ok(data) = f?.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                None => return Ok(None),
            }
        }
    }
}

/// A line for [`AppendStream`] as a frame of the request body.
pub fn frame(line: &[u8]) -> Result<hyper::body::Frame<Bytes>, std::convert::Infallible> {
    let mut b = Vec::with_capacity(line.len() + 1);
    b.extend_from_slice(line);
    b.push(b'\n');
    Ok(hyper::body::Frame::data(Bytes::from(b)))
}
