# Build: docker build -t cds-secret-guard .   (BuildKit, Docker's default builder since 23.0)
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
# Cargo.toml declares the bench: cargo wants its file even to build the binary.
COPY benches ./benches
COPY src ./src
# The registry and the target directory stay in BuildKit's cache between builds: a code
# change recompiles the crate, not its dependencies. The binary leaves the cache by copy.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin cds-secret-guard \
    && cp target/release/cds-secret-guard /usr/local/bin/cds-secret-guard

# distroless/cc: glibc and CA certificates, no shell, no package manager; uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /usr/local/bin/cds-secret-guard /usr/local/bin/cds-secret-guard
USER 65532:65532
EXPOSE 8443 8080
ENTRYPOINT ["/usr/local/bin/cds-secret-guard"]
CMD ["serve"]
