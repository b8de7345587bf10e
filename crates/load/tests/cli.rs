//! The load tool's command line.

/// A scenario the tool does not know is refused with the list of those it does, before
/// anything is measured or written.
#[test]
fn an_unknown_scenario_is_refused_with_the_list() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agent-stream-load"))
        .arg("ingestt")
        .output()
        .expect("agent-stream-load runs");
    assert_eq!(out.status.code(), Some(2), "a usage error");
    let err = String::from_utf8_lossy(&out.stderr);
    for name in agent_stream_load::SCENARIOS {
        assert!(err.contains(name), "{name} listed: {err}");
    }
}

/// Without a server binary beside it, the tool says how to build one.
#[test]
fn a_missing_server_binary_is_named() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agent-stream-load"))
        .args(["ingest", "--server", "/nonexistent/agent-stream"])
        .output()
        .expect("agent-stream-load runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cargo build --release"), "{err}");
}
