# agent-stream container image.
#
# DATABASE_URL must be set when running this image, e.g.
#   docker run -e DATABASE_URL='postgres://user:pass@db:5432/agent_stream?sslmode=verify-full&sslrootcert=/ca.pem' \
#       -p 8080:8080 agent-stream
# The image has no PostgreSQL server binaries, so the embedded default (a private
# cluster started when DATABASE_URL is unset) is not available inside it; see
# docker-compose.yml for the service with PostgreSQL 15 beside it.
# Administrative commands run the same way, e.g.
#   docker run --rm -e DATABASE_URL=... agent-stream tenant create acme

# Pinned: the toolchain the project is built and tested with, and Debian 12 as on the
# machines it is tested on.
FROM rust:1.95.0-slim-bookworm AS build
WORKDIR /src
# Dependencies first, in a layer of their own that only the manifests and Cargo.lock
# invalidate: the workspace's manifests with empty sources build every dependency, and
# a change to the code then rebuilds only our crates. (Stubs for every target the
# manifests declare: cargo refuses a workspace with a missing one.)
COPY Cargo.toml Cargo.lock ./
COPY crates/core/Cargo.toml crates/core/
COPY crates/store/Cargo.toml crates/store/
COPY crates/live/Cargo.toml crates/live/
COPY crates/load/Cargo.toml crates/load/
RUN mkdir -p src crates/load/benches \
    && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && for c in core store live load; do mkdir -p "crates/$c/src" && touch "crates/$c/src/lib.rs"; done \
    && echo 'fn main() {}' > crates/load/src/main.rs && echo 'fn main() {}' > build.rs \
    && for b in validate ingest fold fanout; do echo 'fn main() {}' > "crates/load/benches/$b.rs"; done \
    && cargo build --release --locked -p agent-stream --bin agent-stream \
    && rm -rf src crates/*/src crates/load/benches build.rs
# The crates. sql/, graphql/ and src/graphql/assets/ are embedded into the binary at
# compile time (include_str!, include_bytes!); build.rs generates the gRPC code from
# proto/ (protox: no protoc needed). The sources are touched so that cargo
# does not take the stub build's output for theirs.
COPY src ./src
COPY crates ./crates
COPY sql ./sql
COPY graphql ./graphql
COPY build.rs ./
COPY proto ./proto
RUN touch src/main.rs src/lib.rs crates/*/src/lib.rs \
    && cargo build --release --locked -p agent-stream --bin agent-stream

FROM debian:12.11-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin agent-stream
COPY --from=build /src/target/release/agent-stream /usr/local/bin/agent-stream
USER agent-stream
ENV AGENT_STREAM_LISTEN=0.0.0.0:8080
EXPOSE 8080
# Ready means the database answers and the LISTEN connection is up (GET /readyz);
# `agent-stream health` asks it, as the image has no curl.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 CMD ["agent-stream", "health"]
ENTRYPOINT ["agent-stream"]
CMD ["serve"]
