//! `agent-stream-load <scenario>`: runs one load scenario against the release
//! `agent-stream` binary built beside this one (see the library's doc and BENCHMARKS.md).

use clap::Parser;

/// The service's allocator, so the load generator's costs are what they were in the
/// service's binary.
#[global_allocator]
static GLOBAL: agent_stream::Allocator = agent_stream::Allocator;

#[derive(Parser)]
#[command(
    version,
    about = "agent-stream's load tool: one scenario against its baseline, measured in the same run"
)]
struct Args {
    /// The scenario.
    #[arg(value_parser = scenarios())]
    scenario: String,
    /// Where the floor server listens (`floor-sse-server`, which `fanout` starts itself).
    #[arg(long, hide = true, default_value = "127.0.0.1:0")]
    listen: String,
    /// The `agent-stream` binary to measure (default: the one next to this tool, or
    /// AGENT_STREAM_BIN).
    #[arg(long, env = "AGENT_STREAM_BIN")]
    server: Option<std::path::PathBuf>,
}

/// The scenarios, and the hidden one that is `fanout`'s floor server.
fn scenarios() -> clap::builder::PossibleValuesParser {
    use clap::builder::PossibleValue;
    let visible = agent_stream_load::SCENARIOS.iter().map(|s| PossibleValue::new(*s));
    clap::builder::PossibleValuesParser::new(
        visible.chain([PossibleValue::new(agent_stream_load::FLOOR).hide(true)]),
    )
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.scenario == agent_stream_load::FLOOR {
        // Two workers, as the service has on this machine.
        return tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(agent_stream_load::floor::serve(&args.listen));
    }
    let server = match args.server {
        Some(s) => s,
        None => std::env::current_exe()?.with_file_name("agent-stream"),
    };
    if !["fold", "socket-writes"].contains(&args.scenario.as_str()) && !server.is_file() {
        anyhow::bail!(
            "no server binary at {}: build it first with `cargo build --release` (or pass --server)",
            server.display()
        );
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(agent_stream_load::run(&args.scenario, &server))
}
