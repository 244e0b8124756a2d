# Build: docker build -t cds-secret-guard .   (BuildKit, Docker's default builder since 23.0)
# For linux/amd64 and linux/arm64: --platform linux/arm64 (or both, with buildx). The build
# stage runs on the builder's platform and cross-compiles; nothing is emulated.
# Every base image is a build argument, so that a mirror can stand in for its registry:
#   --build-arg BUILD_IMAGE=mirror.example/library/rust:1.95-bookworm
#   --build-arg RUNTIME_IMAGE=mirror.example/distroless/cc-debian12:nonroot
# RUST_VERSION is the one place that names the Rust the image builds with.
ARG RUST_VERSION=1.95
ARG BUILD_IMAGE=rust:${RUST_VERSION}-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM --platform=$BUILDPLATFORM ${BUILD_IMAGE} AS build
# The platform the image is for; the build stage runs on the builder's.
ARG TARGETARCH
# The target's Rust standard library, and Debian's cross compiler when the builder's
# architecture is another (ring and jemalloc compile C for the target).
RUN set -eu; \
    case "$TARGETARCH" in \
    amd64) target=x86_64-unknown-linux-gnu gnu=x86_64-linux-gnu ;; \
    arm64) target=aarch64-unknown-linux-gnu gnu=aarch64-linux-gnu ;; \
    *) echo "no build for $TARGETARCH" >&2; exit 1 ;; \
    esac; \
    if [ "$(dpkg --print-architecture)" != "$TARGETARCH" ]; then \
        apt-get update -qq; \
        apt-get install -y -qq --no-install-recommends "gcc-$(echo $gnu | tr _ -)" "libc6-dev-$TARGETARCH-cross" >/dev/null; \
        rm -rf /var/lib/apt/lists/*; \
    fi; \
    [ -d "$(rustc --print sysroot)/lib/rustlib/$target" ] || rustup target add "$target"; \
    printf '%s %s\n' "$target" "$gnu" >/target
# The commit `--version` names (.git is not in the build's context).
ARG GIT_COMMIT=unknown
WORKDIR /src
# What .dockerignore lets into the context: the manifests, the lock file and the sources.
COPY . ./
# The registry and the target directory stay in BuildKit's cache between builds: a code
# change recompiles the crate, not its dependencies. The binary leaves the cache by copy.
# No build path in the binary: the crates' sources are named from the registry's root and
# the repository's, so that a build anywhere gives the same bytes.
ENV RUSTFLAGS="--remap-path-prefix=/usr/local/cargo/registry/src=/crates --remap-path-prefix=/src=/cds-secret-guard"
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    read -r target gnu </target \
    && if [ "$target" != "$(rustc -vV | sed -n 's/^host: //p')" ]; then \
        triple=$(echo "$target" | tr a-z- A-Z_); \
        export "CARGO_TARGET_${triple}_LINKER=$gnu-gcc" "CC_$(echo "$target" | tr - _)=$gnu-gcc" \
            "AR_$(echo "$target" | tr - _)=$gnu-ar"; \
    fi \
    && CDS_GUARD_COMMIT="${GIT_COMMIT}" cargo build --release --locked --bin cds-secret-guard --target "$target" \
    && cp "target/$target/release/cds-secret-guard" /usr/local/bin/cds-secret-guard

# distroless/cc: glibc and CA certificates, no shell, no package manager; uid 65532.
FROM ${RUNTIME_IMAGE}
COPY --from=build /usr/local/bin/cds-secret-guard /usr/local/bin/cds-secret-guard
USER 65532:65532
EXPOSE 8443 8080
ENTRYPOINT ["/usr/local/bin/cds-secret-guard"]
CMD ["serve"]
