//! Generates the gRPC profile's code from `proto/` with protox, a pure-Rust protobuf
//! compiler, so building needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["agent/v1/agent_stream.proto"], ["proto"])?;
    // The client is for tests and other Rust callers; it connects through any tower
    // service (tonic's transport is a dev-dependency only).
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .build_transport(false)
        .compile_fds(fds)?;
    Ok(())
}
