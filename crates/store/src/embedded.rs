//! The embedded default: a private PostgreSQL cluster for when `DATABASE_URL` is unset.
//!
//! It uses the machine's own PostgreSQL binaries (on PATH, or under the Debian and
//! Homebrew locations), keeps its data under one directory, and listens only on a Unix
//! socket inside that directory, so it never collides with a server on port 5432 and
//! only its owner can reach it.
//!
//! PostgreSQL refuses to run as root. When we are root, the cluster runs as the
//! unprivileged `postgres` user instead, and the default data directory moves from
//! root's home (which that user cannot enter) to `/var/lib/agent-stream`.

use std::os::unix::fs::{chown, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{anyhow, bail, Context};
use tokio::process::Command;

/// Name of the database created inside the private cluster.
pub const DATABASE: &str = "agent_stream";

/// What to tell a user whose machine has no PostgreSQL server binaries.
pub const INSTALL_HINT: &str =
    "PostgreSQL server binaries (initdb, pg_ctl, postgres) were not found on PATH \
or under /usr/lib/postgresql/*/bin. Install them — Debian/Ubuntu: `apt-get install postgresql`; \
Fedora: `dnf install postgresql-server`; macOS: `brew install postgresql@16` — \
or point agent-stream at an existing server with DATABASE_URL=postgres://user@host/db.";

/// A private cluster: where it lives and how to reach it.
#[derive(Debug)]
pub struct Embedded {
    /// The cluster's data directory (also its socket directory).
    pub pgdata: PathBuf,
    bin: PathBuf,
    run_as: Option<nix::unistd::User>,
    started_here: bool,
}

/// Where the embedded cluster lives unless `--data-dir` says otherwise.
pub fn default_data_dir() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        PathBuf::from("/var/lib/agent-stream")
    } else {
        dirs::data_dir()
            .or_else(|| dirs::home_dir().map(|h| h.join(".local/share")))
            .unwrap_or_else(|| PathBuf::from("."))
            .join("agent-stream")
    }
}

/// Finds the directory holding `initdb`, `pg_ctl` and `postgres`: on PATH, else in the
/// usual install locations.
pub fn find_bin_dir() -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let extra = ["/usr/local/pgsql/bin", "/opt/homebrew/bin", "/usr/local/opt/postgresql/bin"].map(Path::new);
    find_bin_dir_in(&path, Path::new("/usr/lib/postgresql"), &extra)
}

/// [`find_bin_dir`] with every place it looks given (for tests).
pub fn find_bin_dir_in(
    path: &std::ffi::OsStr,
    debian_root: &Path,
    extra: &[&Path],
) -> anyhow::Result<PathBuf> {
    let has_all = |d: &Path| ["initdb", "pg_ctl", "postgres"].iter().all(|b| d.join(b).is_file());
    for dir in std::env::split_paths(path) {
        let initdb = dir.join("initdb");
        if initdb.is_file() {
            // Follow symlinks (e.g. /usr/local/bin/initdb -> /usr/lib/postgresql/15/bin)
            // so pg_ctl and postgres come from the same installation.
            let real = std::fs::canonicalize(&initdb).unwrap_or(initdb);
            if let Some(d) = real.parent().filter(|d| has_all(d)) {
                return Ok(d.to_path_buf());
            }
            if has_all(&dir) {
                return Ok(dir);
            }
        }
    }
    // Debian installs one directory per major version; prefer the newest.
    let mut candidates: Vec<(u32, PathBuf)> = std::fs::read_dir(debian_root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            Some((v, e.path().join("bin")))
        })
        .collect();
    candidates.sort();
    for dir in extra {
        candidates.insert(0, (0, dir.to_path_buf()));
    }
    candidates.into_iter().rev().map(|(_, d)| d).find(|d| has_all(d)).ok_or_else(|| anyhow!(INSTALL_HINT))
}

impl Embedded {
    /// Starts (initialising on first use) the cluster under `data_dir`, or attaches to
    /// it when it is already running, and makes sure the database exists.
    pub async fn start(data_dir: &Path) -> anyhow::Result<Embedded> {
        Embedded::prepare(data_dir).await?.start_if_stopped().await
    }

    /// As [`Embedded::start`], and keeps the cluster running: see [`Supervisor`]. When
    /// this process starts the server, the postmaster is its child, so its exit is
    /// seen at once, with its status.
    pub async fn start_supervised(data_dir: &Path) -> anyhow::Result<Supervisor> {
        let mut this = Embedded::prepare(data_dir).await?;
        let child = if this.postmaster_pid().is_some() {
            None
        } else {
            let child = this.spawn_postmaster().await.context("could not start the private PostgreSQL")?;
            this.started_here = true;
            Some(child)
        };
        this.ensure_database().await?;
        Ok(Supervisor::new(this, child))
    }

    /// Finds the binaries and initialises the data directory on first use.
    async fn prepare(data_dir: &Path) -> anyhow::Result<Embedded> {
        let bin = find_bin_dir()?;
        let run_as = if nix::unistd::geteuid().is_root() {
            Some(nix::unistd::User::from_name("postgres").ok().flatten().ok_or_else(|| {
                anyhow!(
                    "PostgreSQL refuses to run as root, and there is no unprivileged `postgres` user to run the \
                     private cluster as. Create one (`useradd --system postgres`), run agent-stream as a normal \
                     user, or set DATABASE_URL."
                )
            })?)
        } else {
            None
        };
        std::fs::create_dir_all(data_dir).with_context(|| format!("creating {}", data_dir.display()))?;
        let data_dir = std::fs::canonicalize(data_dir)?;
        let pgdata = data_dir.join("pg");
        let this = Embedded { pgdata, bin, run_as, started_here: false };
        this.check_reachable(&data_dir)?;
        this.init_if_needed().await?;
        Ok(this)
    }

    /// The postmaster's pid, when one is running on this data directory.
    pub fn postmaster_pid(&self) -> Option<i32> {
        let text = std::fs::read_to_string(self.pgdata.join("postmaster.pid")).ok()?;
        let pid: i32 = text.lines().next()?.trim().parse().ok()?;
        // Signal 0: is there such a process (an error other than "no such process"
        // means there is one we may not signal).
        match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
            Err(nix::errno::Errno::ESRCH) => None,
            _ => Some(pid),
        }
    }

    /// Starts `postgres` as a child of this process, in a process group of its own (so
    /// a Ctrl-C at the terminal reaches only us, and we stop it after draining), its
    /// output appended to `server.log`; returns once it accepts connections.
    async fn spawn_postmaster(&self) -> anyhow::Result<tokio::process::Child> {
        let log_path = self.pgdata.join("server.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        if let Some(u) = &self.run_as {
            chown(&log_path, Some(u.uid.as_raw()), Some(u.gid.as_raw()))?;
        }
        let mut child = self
            .cmd("postgres")
            .arg("-D")
            .arg(&self.pgdata)
            .process_group(0)
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("running postgres")?;
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "postgres exited at start ({status}); the end of {}:\n{}",
                    log_path.display(),
                    self.log_tail(10)
                );
            }
            if self.accepts_connections().await {
                return Ok(child);
            }
            if tokio::time::Instant::now() > deadline {
                let _ = child.start_kill();
                bail!(
                    "postgres did not accept connections within 60 s; the end of {}:\n{}",
                    log_path.display(),
                    self.log_tail(10)
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// True when the server answers on its socket (not still starting or recovering).
    async fn accepts_connections(&self) -> bool {
        let url = format!(
            "host='{}' port=5432 user=postgres dbname=postgres connect_timeout=2",
            self.pgdata.display()
        );
        tokio_postgres::connect(&url, tokio_postgres::NoTls).await.is_ok()
    }

    /// The last `n` lines of `server.log`.
    fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(self.pgdata.join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().rev().take(n).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// The connection string for the private database.
    pub fn url(&self) -> String {
        format!("host='{}' port=5432 user=postgres dbname={DATABASE}", self.pgdata.display())
    }

    /// True when this process started the server (and so should stop it).
    pub fn started_here(&self) -> bool {
        self.started_here
    }

    /// Restarts the server (fast shutdown: open connections are cut). Fault tests use
    /// it to check that nothing is lost when the database goes away mid-stream.
    pub async fn restart(&self) -> anyhow::Result<()> {
        self.pg_ctl(&["-m", "fast", "restart"]).await
    }

    /// Stops the server if this process started it.
    pub async fn stop(&self) -> anyhow::Result<()> {
        if !self.started_here {
            return Ok(());
        }
        self.pg_ctl(&["-m", "fast", "stop"]).await
    }

    /// Runs `pg_ctl <args>` on the cluster, waiting up to 60 s, logging to `server.log`.
    async fn pg_ctl(&self, args: &[&str]) -> anyhow::Result<()> {
        let log = self.pgdata.join("server.log");
        let out = self
            .cmd("pg_ctl")
            .arg("-D")
            .arg(&self.pgdata)
            .arg("-l")
            .arg(&log)
            .args(["-w", "-t", "60"])
            .args(args)
            .output()
            .await
            .with_context(|| format!("running pg_ctl {}", args.join(" ")))?;
        if !out.status.success() {
            let tail = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(10).collect();
            bail!(
                "pg_ctl {} failed for {}: {}\n{}",
                args.join(" "),
                self.pgdata.display(),
                String::from_utf8_lossy(&out.stderr).trim(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        Ok(())
    }

    fn cmd(&self, name: &str) -> Command {
        let mut c = Command::new(self.bin.join(name));
        // The cluster user may not be able to enter our working directory.
        c.current_dir("/").stdin(Stdio::null()).kill_on_drop(false);
        if let Some(u) = &self.run_as {
            c.uid(u.uid.as_raw()).gid(u.gid.as_raw());
            c.env("HOME", &u.dir).env("USER", &u.name);
        }
        c
    }

    /// The cluster user must be able to walk down to the data directory.
    fn check_reachable(&self, data_dir: &Path) -> anyhow::Result<()> {
        let Some(user) = &self.run_as else {
            return Ok(());
        };
        chown(data_dir, Some(user.uid.as_raw()), Some(user.gid.as_raw()))
            .with_context(|| format!("handing {} to the postgres user", data_dir.display()))?;
        for dir in data_dir.ancestors().skip(1) {
            let mode = std::fs::metadata(dir)?.permissions().mode();
            if mode & 0o001 == 0 {
                bail!(
                    "the private cluster runs as the `postgres` user (PostgreSQL refuses root), which cannot enter {} \
                     (mode {:o}). Choose a data directory it can reach, e.g. --data-dir /var/lib/agent-stream",
                    dir.display(),
                    mode & 0o777
                );
            }
        }
        Ok(())
    }

    async fn init_if_needed(&self) -> anyhow::Result<()> {
        if self.pgdata.join("PG_VERSION").is_file() {
            return Ok(());
        }
        std::fs::create_dir_all(&self.pgdata)?;
        std::fs::set_permissions(&self.pgdata, std::fs::Permissions::from_mode(0o700))?;
        if let Some(u) = &self.run_as {
            chown(&self.pgdata, Some(u.uid.as_raw()), Some(u.gid.as_raw()))?;
        }
        let out = self
            .cmd("initdb")
            .arg("-D")
            .arg(&self.pgdata)
            .args(["-U", "postgres", "--auth=trust", "--encoding=UTF8", "--no-locale", "--no-instructions"])
            .output()
            .await
            .context("running initdb")?;
        if !out.status.success() {
            bail!(
                "initdb failed for {}: {}",
                self.pgdata.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        // Socket only, in the data directory: no port to collide with, no network exposure.
        let conf = format!(
            "\n# agent-stream embedded default\nlisten_addresses = ''\nunix_socket_directories = '{}'\n\
             max_connections = 200\nshared_buffers = 128MB\nfsync = on\n",
            self.pgdata.display()
        );
        let conf_path = self.pgdata.join("postgresql.conf");
        let mut existing = std::fs::read_to_string(&conf_path)?;
        existing.push_str(&conf);
        std::fs::write(&conf_path, existing)?;
        Ok(())
    }

    async fn start_if_stopped(mut self) -> anyhow::Result<Embedded> {
        // pg_ctl start: the server outlives this command, for the admin commands that
        // attach to it or stop it after; `serve` supervises its own instead.
        let status = self.cmd("pg_ctl").arg("-D").arg(&self.pgdata).arg("status").output().await?;
        if !status.status.success() {
            self.pg_ctl(&["start"]).await.context("could not start the private PostgreSQL")?;
            self.started_here = true;
        }
        self.ensure_database().await?;
        Ok(self)
    }

    async fn ensure_database(&self) -> anyhow::Result<()> {
        let url = format!("host='{}' port=5432 user=postgres dbname=postgres", self.pgdata.display());
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .with_context(|| format!("connecting to the private cluster in {}", self.pgdata.display()))?;
        tokio::spawn(conn);
        let exists = client.query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&DATABASE]).await?;
        if exists.is_none() {
            if let Err(e) = client.batch_execute(&format!("CREATE DATABASE {DATABASE}")).await {
                // Another process may have created it between our check and now.
                if e.code() != Some(&tokio_postgres::error::SqlState::DUPLICATE_DATABASE) {
                    return Err(e.into());
                }
            }
        }
        Ok(())
    }
}

/// Keeps the embedded default's PostgreSQL running while `serve` runs.
///
/// If the server dies (crash, OOM kill, someone stops it), the supervisor says so in
/// the log, with the exit status when the postmaster is its child, starts it again
/// (retrying with backoff while the old one's processes linger), and says when it is
/// back. The service needs nothing else to recover: the pool drops closed connections
/// and opens new ones, the LISTEN connection reconnects and makes every subscriber
/// re-read after its cursor, and `/readyz` answers 503 while the database does not.
pub struct Supervisor {
    embedded: std::sync::Arc<tokio::sync::Mutex<Embedded>>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    /// Where the data is and how to reach it (fixed for the supervisor's life).
    pgdata: PathBuf,
    url: String,
}

/// How often an attached server (one this process did not start) is checked.
const ATTACHED_POLL: std::time::Duration = std::time::Duration::from_millis(500);

impl Supervisor {
    fn new(embedded: Embedded, child: Option<tokio::process::Child>) -> Supervisor {
        let (pgdata, url) = (embedded.pgdata.clone(), embedded.url());
        let embedded = std::sync::Arc::new(tokio::sync::Mutex::new(embedded));
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(supervise(embedded.clone(), child, stopping));
        Supervisor { embedded, stop, task, pgdata, url }
    }

    /// The connection string for the private database.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The cluster's data directory.
    pub fn pgdata(&self) -> &Path {
        &self.pgdata
    }

    /// Stops supervising and stops the server if this process started it (or started
    /// it again after it died).
    pub async fn stop(self) -> anyhow::Result<()> {
        self.stop.send_replace(true);
        let _ = self.task.await;
        let embedded = self.embedded.lock().await;
        embedded.stop().await
    }
}

async fn supervise(
    embedded: std::sync::Arc<tokio::sync::Mutex<Embedded>>,
    mut child: Option<tokio::process::Child>,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let why = match child.as_mut() {
            Some(c) => tokio::select! {
                status = c.wait() => match status {
                    Ok(s) => format!("exit status: {s}"),
                    Err(e) => format!("its exit status could not be read: {e}"),
                },
                _ = stopping.wait_for(|s| *s) => return,
            },
            None => {
                let pid = embedded.lock().await.postmaster_pid();
                let gone = async {
                    loop {
                        tokio::time::sleep(ATTACHED_POLL).await;
                        if embedded.lock().await.postmaster_pid().is_none() {
                            return;
                        }
                    }
                };
                tokio::select! {
                    _ = gone => match pid {
                        Some(pid) => format!("its postmaster, pid {pid}, is gone"),
                        None => "no postmaster is running".to_owned(),
                    },
                    _ = stopping.wait_for(|s| *s) => return,
                }
            }
        };
        if *stopping.borrow() {
            return;
        }
        let pgdata = embedded.lock().await.pgdata.display().to_string();
        tracing::warn!("the embedded PostgreSQL in {pgdata} stopped ({why}); restarting it");
        let down = std::time::Instant::now();
        let mut backoff = std::time::Duration::from_millis(200);
        child = loop {
            // Another process (an admin command, a second `serve`) may have started it.
            let mut e = embedded.lock().await;
            if e.postmaster_pid().is_some() && e.accepts_connections().await {
                tracing::info!(
                    "the embedded PostgreSQL is running again (started by another process); reconnecting"
                );
                break None;
            }
            match e.spawn_postmaster().await {
                Ok(c) => {
                    e.started_here = true;
                    tracing::info!(
                        "the embedded PostgreSQL restarted after {:.1} s down; reconnecting the pool and the listener",
                        down.elapsed().as_secs_f64()
                    );
                    break Some(c);
                }
                Err(err) => {
                    drop(e);
                    tracing::warn!(
                        "restarting the embedded PostgreSQL failed; trying again in {:.1} s: {err:#}",
                        backoff.as_secs_f64()
                    );
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = stopping.wait_for(|s| *s) => return,
                    }
                    backoff = (backoff * 2).min(std::time::Duration::from_secs(10));
                }
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_binaries_the_error_says_what_to_install() {
        let empty = std::env::temp_dir().join(format!("agent-stream-no-pg-{}", std::process::id()));
        std::fs::create_dir_all(&empty).unwrap();
        let r = find_bin_dir_in(empty.as_os_str(), &empty.join("missing"), &[]);
        let _ = std::fs::remove_dir_all(&empty);
        let msg = r.expect_err("nothing to find").to_string();
        assert!(msg.contains("apt-get install postgresql"), "{msg}");
        assert!(msg.contains("DATABASE_URL"), "{msg}");
    }

    #[test]
    fn binaries_are_found_through_a_symlink_on_path() {
        let Ok(real) = find_bin_dir() else { return };
        let dir = std::env::temp_dir().join(format!("agent-stream-pg-link-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let _ = std::fs::remove_file(dir.join("initdb"));
        std::os::unix::fs::symlink(real.join("initdb"), dir.join("initdb")).unwrap();
        let found = find_bin_dir_in(dir.as_os_str(), Path::new("/nonexistent"), &[]);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(found.unwrap(), std::fs::canonicalize(&real).unwrap());
    }
}
