//! A real `agent-stream serve` process on a test's schema: for what needs a process of
//! its own (signals, restarts on the same port, its memory), where `TestApp`'s
//! in-process server will not do. One helper for every such test.

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::process::{Child, Command};

use crate::common::TestApp;

/// An `agent-stream serve` process (killed on drop) on a port it keeps across
/// restarts, so clients reconnect to the URL they were given.
pub struct Serve {
    child: Option<Child>,
    port: u16,
    schema: String,
    url: String,
    extra: Vec<String>,
    /// `http://127.0.0.1:<port>`
    pub base: String,
}

/// A port free now (the kernel picks it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl Serve {
    /// Starts on a free port with `extra` arguments and waits until it is ready.
    pub async fn start(t: &TestApp, extra: &[&str]) -> Serve {
        Serve::start_on(t, free_port(), extra).await
    }

    /// Starts on `port` with `extra` arguments and waits until it is ready.
    pub async fn start_on(t: &TestApp, port: u16, extra: &[&str]) -> Serve {
        let mut s = Serve {
            child: None,
            port,
            schema: t.db.schema.clone(),
            url: t.db.url.clone(),
            extra: extra.iter().map(|a| (*a).to_owned()).collect(),
            base: format!("http://127.0.0.1:{port}"),
        };
        s.restart().await;
        s
    }

    /// Starts the process (again, after `kill` or `stop`) and waits until `/readyz`
    /// answers 200. A port just given up can still be taken for a moment: the process
    /// then exits, and it is started again.
    pub async fn restart(&mut self) {
        for _ in 0..5 {
            let child = Command::new(env!("CARGO_BIN_EXE_agent-stream"))
                .args(["serve", "--listen", &format!("127.0.0.1:{}", self.port), "--schema", &self.schema])
                .args(["--retention-interval", "0"])
                .args(&self.extra)
                .env("DATABASE_URL", &self.url)
                .env("RUST_LOG", "warn")
                .envs(std::env::vars().filter(|(k, _)| k.starts_with("MIMALLOC_")))
                .stdout(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("spawn agent-stream");
            self.child = Some(child);
            for _ in 0..200 {
                let ready = reqwest::get(format!("{}/readyz", self.base)).await;
                if ready.is_ok_and(|r| r.status().is_success()) {
                    return;
                }
                if let Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if let Some(mut c) = self.child.take() {
                let _ = c.kill().await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        panic!("the server did not start on port {}", self.port);
    }

    /// The running process's id.
    pub fn pid(&self) -> nix::unistd::Pid {
        let child = self.child.as_ref().expect("the process is running");
        nix::unistd::Pid::from_raw(child.id().expect("pid") as i32)
    }

    /// Sends `s` and returns at once.
    pub fn signal(&self, s: Signal) {
        nix::sys::signal::kill(self.pid(), s).expect("signal");
    }

    /// Waits up to `limit` for the process to exit by itself; its status if it did.
    pub async fn exited(&mut self, limit: Duration) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        tokio::time::timeout(limit, child.wait()).await.ok()?.ok()
    }

    /// SIGTERM: the service drains and ends its streams cleanly, then exits (up to 30 s).
    pub async fn stop(&mut self) {
        if self.child.is_some() {
            self.signal(Signal::SIGTERM);
            let _ = self.exited(Duration::from_secs(30)).await;
        }
    }

    /// SIGKILL: no shutdown, no close frames; the kernel resets the sockets.
    pub async fn kill(&mut self) {
        if self.child.is_some() {
            self.signal(Signal::SIGKILL);
            let _ = self.exited(Duration::from_secs(30)).await;
        }
    }

    /// Resident memory of the process, KiB.
    pub fn rss_kib(&self) -> u64 {
        self.status_kib("VmRSS:")
    }

    /// Resident anonymous memory (heap, stacks), KiB: what requests can make grow. The
    /// rest of RSS is the binary's own pages, which the first call of a code path
    /// (an error path, say) brings in once, shared and reclaimable.
    pub fn anon_kib(&self) -> u64 {
        self.status_kib("RssAnon:")
    }

    /// Resident memory (KiB) once it is at most `limit`, or after 20 tries a second or
    /// so apart; with the (RSS, anonymous) samples taken. Light traffic meanwhile, as a
    /// server sees: workers wake, take back what other threads freed for them, and give
    /// it to the OS when they idle again (a worker that parked right after a burst and
    /// slept since never would).
    pub async fn rss_settling(&self, limit: u64) -> (u64, Vec<(u64, u64)>) {
        let mut samples = vec![];
        let mut rss = self.rss_kib();
        for _ in 0..20 {
            for _ in 0..3 {
                let _ = reqwest::get(format!("{}/healthz", self.base)).await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            rss = self.rss_kib();
            samples.push((rss, self.anon_kib()));
            if rss <= limit {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        (rss, samples)
    }

    /// Live subscribers the server counts, over every transport.
    pub async fn subscribers(&self) -> f64 {
        let m = reqwest::get(format!("{}/metrics", self.base))
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text");
        assert!(m.contains("agent_stream_subscribers{"), "{m}");
        // The gauge has a series per transport.
        m.lines()
            .filter(|l| l.starts_with("agent_stream_subscribers{"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    }

    /// Waits (up to 30 s) for the subscriber gauge to reach 0: stall timers fire late
    /// on a busy machine, and the kernel's zero-window probes back off. Returns the
    /// subscribers left and how long it took.
    pub async fn subscribers_gone(&self) -> (f64, Duration) {
        let started = std::time::Instant::now();
        let mut left = self.subscribers().await;
        while left > 0.0 && started.elapsed() < Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_millis(500)).await;
            left = self.subscribers().await;
        }
        (left, started.elapsed())
    }

    fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }
}
