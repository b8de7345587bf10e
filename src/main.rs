//! The `agent-stream` binary: the allocator and the command line ([`agent_stream::cli`]).

/// The service's allocator (see `agent_stream::alloc`); `TUNE` sets its options at load.
#[global_allocator]
static GLOBAL: agent_stream::Allocator = agent_stream::Allocator;
#[cfg(target_os = "linux")]
#[used]
static TUNE: &extern "C" fn() = &agent_stream::alloc::TUNE;

fn main() -> std::process::ExitCode {
    agent_stream::cli::main()
}
