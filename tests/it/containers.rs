//! The container files, checked as far as a machine without Docker can: the compose
//! file parses as YAML and wires the service to PostgreSQL 15 with a health check on
//! each; the Dockerfile pins its base images, caches dependencies in a layer of their
//! own and has a HEALTHCHECK; and the health check's command works against a real
//! service and fails without one.

use std::path::Path;

use yaml_rust2::{Yaml, YamlLoader};

use crate::common::TestApp;

fn repo(file: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).expect(file)
}

/// The words of a health check's `test` (either form compose accepts).
fn health_test(service: &Yaml) -> Vec<String> {
    match &service["healthcheck"]["test"] {
        Yaml::Array(a) => a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect(),
        Yaml::String(s) => s.split_whitespace().map(str::to_owned).collect(),
        other => panic!("healthcheck.test: {other:?}"),
    }
}

#[test]
fn the_compose_file_runs_the_service_beside_postgres_15_with_health_checks() {
    let docs = YamlLoader::load_from_str(&repo("docker-compose.yml")).expect("docker-compose.yml is YAML");
    let compose = &docs[0];
    let pg = &compose["services"]["postgres"];
    let svc = &compose["services"]["agent-stream"];
    assert!(!pg.is_badvalue() && !svc.is_badvalue(), "two services: postgres and agent-stream");

    // PostgreSQL 15, pinned to a minor release, healthy when it accepts connections.
    let image = pg["image"].as_str().expect("postgres image");
    let version = image.strip_prefix("postgres:15.").expect("PostgreSQL 15");
    assert!(version.split(['.', '-']).next().is_some_and(|m| m.parse::<u32>().is_ok()), "pinned: {image}");
    assert_eq!(health_test(pg)[0], "CMD-SHELL");
    assert!(health_test(pg)[1].starts_with("pg_isready"), "{:?}", health_test(pg));

    // The service: built here, started once PostgreSQL is healthy, reachable, healthy
    // when /readyz says so.
    assert_eq!(svc["build"].as_str(), Some("."));
    assert_eq!(svc["depends_on"]["postgres"]["condition"].as_str(), Some("service_healthy"));
    assert_eq!(health_test(svc), ["CMD", "agent-stream", "health"]);
    assert_eq!(svc["environment"]["AGENT_STREAM_LISTEN"].as_str(), Some("0.0.0.0:8080"));
    let ports: Vec<&str> = svc["ports"].as_vec().expect("ports").iter().filter_map(Yaml::as_str).collect();
    assert!(ports.iter().any(|p| p.ends_with(":8080")), "{ports:?}");

    // DATABASE_URL names the postgres service and its user, password and database, in
    // a form the service reads.
    let url = svc["environment"]["DATABASE_URL"].as_str().expect("DATABASE_URL");
    let target = agent_stream::storage::db::target(url).expect("a DATABASE_URL the service reads");
    let env = &pg["environment"];
    assert_eq!(target.config.get_user(), env["POSTGRES_USER"].as_str());
    assert_eq!(target.config.get_password(), env["POSTGRES_PASSWORD"].as_str().map(str::as_bytes));
    assert_eq!(target.config.get_dbname(), env["POSTGRES_DB"].as_str());
    assert_eq!(target.config.get_hosts(), [tokio_postgres::config::Host::Tcp("postgres".into())]);
    assert_eq!(target.config.get_ports(), [5432]);
    assert!(compose["volumes"]["pgdata"].as_hash().is_some() || compose["volumes"]["pgdata"].is_null());
}

#[test]
fn the_dockerfile_pins_its_images_caches_dependencies_and_checks_health() {
    let dockerfile = repo("Dockerfile");
    let lines: Vec<&str> = dockerfile.lines().map(str::trim).filter(|l| !l.starts_with('#')).collect();
    let froms: Vec<&str> = lines.iter().filter_map(|l| l.strip_prefix("FROM ")).collect();
    assert_eq!(froms.len(), 2, "a build stage and a runtime stage: {froms:?}");
    for from in &froms {
        let image = from.split_whitespace().next().unwrap_or_default();
        let tag = image.split_once(':').map(|(_, t)| t).unwrap_or("latest");
        let pinned = tag.split(['.', '-']).take(2).all(|p| p.parse::<u32>().is_ok());
        assert!(pinned, "{image}: pinned to a version with a minor release");
    }
    // The dependency layer: the manifest and lockfile are copied and built before the
    // sources are.
    let pos =
        |needle: &str| lines.iter().position(|l| l.starts_with(needle)).unwrap_or_else(|| panic!("{needle}"));
    let manifest = pos("COPY Cargo.toml Cargo.lock");
    let sources = pos("COPY src ");
    let deps_build = lines.iter().position(|l| l.contains("cargo build")).expect("cargo build");
    assert!(
        manifest < deps_build && deps_build < sources,
        "dependencies are built before the sources arrive"
    );
    assert!(lines[sources..].iter().any(|l| l.contains("cargo build --release --locked")));
    // Everything the build copies exists.
    for l in lines.iter().filter(|l| l.starts_with("COPY ") && !l.contains("--from")) {
        let words: Vec<&str> = l.split_whitespace().collect();
        for src in &words[1..words.len() - 1] {
            assert!(Path::new(env!("CARGO_MANIFEST_DIR")).join(src).exists(), "COPY {src}: missing");
        }
    }
    let health = lines.iter().find(|l| l.starts_with("HEALTHCHECK")).expect("a HEALTHCHECK");
    assert!(health.ends_with(r#"CMD ["agent-stream", "health"]"#), "{health}");
}

/// The health check's command: 0 against a ready service, 1 with a reason otherwise.
#[tokio::test]
async fn agent_stream_health_answers_for_readyz() {
    let t = TestApp::new().await;
    let addr = t.base.strip_prefix("http://").expect("base").to_owned();
    let mut ready = None;
    for _ in 0..100 {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_agent-stream"))
            .args(["health", "--listen", &addr])
            .output()
            .await
            .expect("run agent-stream health");
        if out.status.success() {
            ready = Some(String::from_utf8_lossy(&out.stdout).into_owned());
            break;
        }
        // The listener may still be connecting.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let ready = ready.expect("agent-stream health succeeds against a ready service");
    assert!(ready.contains(r#""ready":true"#), "{ready}");

    let closed = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a port");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_agent-stream"))
        .args(["health", "--listen", &closed.to_string()])
        .output()
        .await
        .expect("run agent-stream health");
    assert_eq!(out.status.code(), Some(1), "nothing listens there");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach the service"), "{err}");
}
