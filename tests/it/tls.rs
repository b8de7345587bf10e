//! TLS to PostgreSQL as libpq reads it (`sslmode`, `sslrootcert`), against a private
//! cluster with `ssl=on`, a certificate authority made by the test, and a `pg_hba.conf`
//! that admits TCP clients only over TLS.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_stream::storage::embedded::Embedded;
use agent_stream::storage::{db, migrate, tenants, Db, DbConfig};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};
use serde_json::{json, Value};

/// A certificate authority: its certificate (PEM) and what signs with it.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("CA key");
        Ca { issuer: CertifiedIssuer::self_signed(params, key).expect("CA certificate") }
    }

    /// A server certificate for `names` and its key, both PEM.
    fn server(&self, names: &[&str]) -> (String, String) {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("params");
        params.distinguished_name.push(DnType::CommonName, "agent-stream test server");
        let key = KeyPair::generate().expect("server key");
        let cert = params.signed_by(&key, &self.issuer).expect("server certificate");
        (cert.pem(), key.serialize_pem())
    }

    fn write(&self, path: &Path) {
        std::fs::write(path, self.issuer.pem()).expect("write CA");
    }
}

/// A private cluster listening on 127.0.0.1:`port` with `ssl=on`: TCP clients must use
/// TLS (`hostssl` only). Its certificate names `localhost`, not `127.0.0.1`.
struct TlsCluster {
    pg: Embedded,
    dir: PathBuf,
    port: u16,
}

impl TlsCluster {
    async fn start(ca: &Ca, tag: &str) -> TlsCluster {
        agent_stream::storage::embedded::find_bin_dir()
            .expect("the TLS tests need the PostgreSQL server binaries (initdb, pg_ctl)");
        // Under /tmp so the unprivileged cluster user can reach it when we run as root.
        let dir = std::env::temp_dir().join(format!("agent-stream-tls-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let pg = Embedded::start(&dir).await.expect("private cluster");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("free port");
        let (cert, key) = ca.server(&["localhost"]);
        let owner = std::fs::metadata(&pg.pgdata).expect("pgdata");
        for (name, body) in [("server.crt", cert), ("server.key", key)] {
            let path = pg.pgdata.join(name);
            std::fs::write(&path, body).expect("write certificate");
            use std::os::unix::fs::{MetadataExt, PermissionsExt};
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
            std::os::unix::fs::chown(&path, Some(owner.uid()), Some(owner.gid())).expect("chown");
        }
        // Only TLS over TCP; the Unix socket (which pg_ctl and the set-up use) stays open.
        std::fs::write(
            pg.pgdata.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostssl all all ::1/128 trust\n",
        )
        .expect("pg_hba.conf");
        let c = db::connect(&pg.url()).await.expect("socket connection");
        // One statement per call: ALTER SYSTEM refuses the implicit transaction of a batch.
        for setting in [
            "ssl = on".to_owned(),
            "ssl_cert_file = 'server.crt'".to_owned(),
            "ssl_key_file = 'server.key'".to_owned(),
            "listen_addresses = '127.0.0.1'".to_owned(),
            format!("port = {port}"),
        ] {
            c.batch_execute(&format!("ALTER SYSTEM SET {setting}")).await.expect("configure TLS");
        }
        drop(c);
        pg.restart().await.expect("restart with TLS");
        TlsCluster { pg, dir, port }
    }

    /// A URL to this cluster's `agent_stream` database over TCP with `params`.
    fn url(&self, host: &str, params: &str) -> String {
        format!("postgres://postgres@{host}:{}/agent_stream?connect_timeout=5&{params}", self.port)
    }

    async fn stop(self) {
        let _ = self.pg.stop().await;
    }
}

impl Drop for TlsCluster {
    /// After a failed assertion too: an immediate shutdown (SIGQUIT to the postmaster),
    /// then the directory goes. After [`TlsCluster::stop`] the server is already gone.
    fn drop(&mut self) {
        if let Some(pid) = self.pg.postmaster_pid() {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGQUIT);
            for _ in 0..100 {
                if self.pg.postmaster_pid().is_none() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Connects with `url` and asks the server whether this session is encrypted.
async fn session_ssl(url: &str) -> Result<bool, String> {
    let c = db::connect(url).await.map_err(|e| format!("{e:#}"))?;
    let row = c
        .query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[])
        .await
        .map_err(|e| e.to_string())?;
    Ok(row.get(0))
}

#[tokio::test]
async fn sslmode_and_sslrootcert_behave_as_in_libpq() {
    let ca = Ca::new("agent-stream test CA");
    let other = Ca::new("someone else's CA");
    let cluster = TlsCluster::start(&ca, "modes").await;
    let certs = cluster.dir.join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    let (good, wrong) = (certs.join("ca.pem"), certs.join("other.pem"));
    ca.write(&good);
    other.write(&wrong);
    let (good, wrong) = (good.display().to_string(), wrong.display().to_string());

    // verify-full: the chain and the name. `localhost` is in the certificate.
    let full = cluster.url("localhost", &format!("sslmode=verify-full&sslrootcert={good}"));
    assert_eq!(session_ssl(&full).await, Ok(true), "verify-full with the right CA and host");
    // The certificate does not name 127.0.0.1: verify-full refuses, verify-ca does not.
    let e = session_ssl(&cluster.url("127.0.0.1", &format!("sslmode=verify-full&sslrootcert={good}")))
        .await
        .expect_err("wrong host");
    assert!(e.contains("certificate") && e.contains("not valid for name"), "{e}");
    eprintln!("verify-full, wrong host: {e}");
    let ca_only = cluster.url("127.0.0.1", &format!("sslmode=verify-ca&sslrootcert={good}"));
    assert_eq!(session_ssl(&ca_only).await, Ok(true), "verify-ca ignores the name");
    // A CA that did not sign the server's certificate: refused by both.
    for mode in ["verify-full", "verify-ca"] {
        let e = session_ssl(&cluster.url("localhost", &format!("sslmode={mode}&sslrootcert={wrong}")))
            .await
            .expect_err("wrong CA");
        assert!(e.contains("certificate") && e.contains("UnknownIssuer"), "{mode}: {e}");
        eprintln!("{mode}, wrong CA: {e}");
    }
    // require: encryption only; with a root certificate, libpq checks the chain too.
    assert_eq!(session_ssl(&cluster.url("127.0.0.1", "sslmode=require")).await, Ok(true));
    let e = session_ssl(&cluster.url("127.0.0.1", &format!("sslmode=require&sslrootcert={wrong}")))
        .await
        .expect_err("require with a root certificate checks the chain");
    assert!(e.contains("UnknownIssuer"), "{e}");
    // prefer (the default) takes TLS when offered; disable does not, and this server's
    // pg_hba.conf turns plain TCP away.
    assert_eq!(session_ssl(&cluster.url("127.0.0.1", "")).await, Ok(true), "prefer is the default");
    let e = session_ssl(&cluster.url("127.0.0.1", "sslmode=disable")).await.expect_err("plain refused");
    assert!(e.contains("no encryption"), "{e}");
    // A key=value string reads the same keys.
    let kv = format!(
        "host=localhost port={} user=postgres dbname=agent_stream sslmode=verify-full sslrootcert='{good}'",
        cluster.port
    );
    assert_eq!(session_ssl(&kv).await, Ok(true));
    // verify-* without any root certificate is refused before connecting, with the way out.
    let e =
        format!("{:#}", db::connect(&cluster.url("localhost", "sslmode=verify-full")).await.err().unwrap());
    if !dirs_root_crt_exists() {
        assert!(e.contains("root certificate file") && e.contains("sslrootcert=system"), "{e}");
    }
    cluster.stop().await;
}

fn dirs_root_crt_exists() -> bool {
    std::env::var_os("HOME").is_some_and(|h| Path::new(&h).join(".postgresql/root.crt").exists())
}

/// The whole service over verify-full: migrations (owner connection), the pool (service
/// role), the LISTEN connection and live delivery. The server admits TCP only with TLS,
/// so each of them had to use it.
#[tokio::test]
async fn the_service_runs_over_verify_full() {
    let ca = Ca::new("agent-stream test CA");
    let cluster = TlsCluster::start(&ca, "service").await;
    let pem = cluster.dir.join("ca.pem");
    ca.write(&pem);
    let url = cluster.url("localhost", &format!("sslmode=verify-full&sslrootcert={}", pem.display()));
    let schema = "tls";
    migrate::migrate(&url, schema).await.expect("migrate over TLS");
    let mut owner = db::connect_owner(&url, schema).await.expect("owner over TLS");
    let key = tenants::create_tenant(
        &mut owner,
        "tls",
        &[agent_stream::auth::Scope::Read, agent_stream::auth::Scope::Write],
    )
    .await
    .expect("tenant")
    .secret;
    let pool =
        Db::new(&DbConfig { url: url.clone(), schema: schema.into(), max_connections: 4 }).expect("pool");
    let app = agent_stream::app::App::new(pool, Default::default());
    let (base, _) = crate::common::serve_app("127.0.0.1:0", app).await;
    let http = reqwest::Client::new();
    let mut ready = None;
    for _ in 0..100 {
        let r = http.get(format!("{base}/readyz")).send().await.expect("readyz");
        if r.status() == 200 {
            ready = Some(r.json::<Value>().await.expect("json"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(ready, Some(json!({"ready": true, "database": true, "listener": true})));
    let run: Value =
        http.post(format!("{base}/v1/runs")).bearer_auth(&key).send().await.unwrap().json().await.unwrap();
    let run = run["run_id"].as_str().expect("run id").to_owned();
    let r = http
        .post(format!("{base}/v1/runs/{run}/events"))
        .bearer_auth(&key)
        .json(&json!([{"type": "run.lifecycle", "payload": {"state": "running"}}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    // Every client connection of the service is encrypted, the listener among them.
    let rows = owner
        .query(
            "SELECT a.application_name, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
             WHERE a.datname = 'agent_stream' AND a.backend_type = 'client backend'",
            &[],
        )
        .await
        .expect("activity");
    let seen: Vec<(String, bool)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert!(seen.iter().all(|(_, ssl)| *ssl), "{seen:?}");
    assert!(seen.iter().any(|(name, _)| name.starts_with("agent-stream listen")), "{seen:?}");
    drop(owner);
    cluster.stop().await;
}
