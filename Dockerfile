# Build stage: the whole workspace in release mode.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release -p shepherd-workers --bin shepherd

# Runtime stage: just the binary and the TLS roots it needs for the real API.
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 shepherd
COPY --from=build /src/target/release/shepherd /usr/local/bin/shepherd
USER shepherd
ENTRYPOINT ["/usr/local/bin/shepherd"]
