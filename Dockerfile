# Build: docker build -t cds-secret-guard .   (BuildKit, Docker's default builder since 23.0)
# Every base image is a build argument, so that a mirror can stand in for its registry:
#   --build-arg BUILD_IMAGE=mirror.example/library/rust:1.95-bookworm
#   --build-arg RUNTIME_IMAGE=mirror.example/distroless/cc-debian12:nonroot
# RUST_VERSION is the one place that names the Rust the image builds with.
ARG RUST_VERSION=1.95
ARG BUILD_IMAGE=rust:${RUST_VERSION}-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM ${BUILD_IMAGE} AS build
# The commit `--version` names (.git is not in the build's context).
ARG GIT_COMMIT=unknown
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
# Cargo.toml declares the bench: cargo wants its file even to build the binary.
COPY benches ./benches
# The test kit is a member of the workspace: cargo reads its manifest, never builds it.
COPY testkit ./testkit
COPY src ./src
# The registry and the target directory stay in BuildKit's cache between builds: a code
# change recompiles the crate, not its dependencies. The binary leaves the cache by copy.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    CDS_GUARD_COMMIT="${GIT_COMMIT}" cargo build --release --locked --bin cds-secret-guard \
    && cp target/release/cds-secret-guard /usr/local/bin/cds-secret-guard

# distroless/cc: glibc and CA certificates, no shell, no package manager; uid 65532.
FROM ${RUNTIME_IMAGE}
COPY --from=build /usr/local/bin/cds-secret-guard /usr/local/bin/cds-secret-guard
USER 65532:65532
EXPOSE 8443 8080
ENTRYPOINT ["/usr/local/bin/cds-secret-guard"]
CMD ["serve"]
