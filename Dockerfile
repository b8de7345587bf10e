# agent-stream container image.
#
# DATABASE_URL must be set when running this image, e.g.
#   docker run -e DATABASE_URL=postgres://user:pass@db:5432/agent_stream -p 8080:8080 agent-stream
# The image has no PostgreSQL server binaries, so the embedded default (a private
# cluster started when DATABASE_URL is unset) is not available inside it.
# Administrative commands run the same way, e.g.
#   docker run --rm -e DATABASE_URL=... agent-stream tenant create acme

FROM rust:1-bookworm AS build
WORKDIR /src
# Cargo.toml declares [[bench]] validate, so benches/ must be present for the manifest to
# load; tests/ is only auto-discovered and is not needed to build the binary.
# sql/ is embedded into the binary at compile time (include_str!).
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY sql ./sql
COPY graphql ./graphql
COPY benches ./benches
RUN cargo build --release --locked --bin agent-stream

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin agent-stream
COPY --from=build /src/target/release/agent-stream /usr/local/bin/agent-stream
USER agent-stream
ENV AGENT_STREAM_LISTEN=0.0.0.0:8080
EXPOSE 8080
ENTRYPOINT ["agent-stream"]
CMD ["serve"]
