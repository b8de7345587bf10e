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
