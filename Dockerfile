# syntax=docker/dockerfile:1
# Build: docker build -t cds-secret-guard .
FROM rust:1.95-bookworm AS build
WORKDIR /src
# Dependencies first, in their own layer, so code changes do not rebuild them.
COPY Cargo.toml Cargo.lock ./
RUN mkdir src && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && cargo build --release --locked && rm -rf src
COPY src ./src
RUN touch src/main.rs src/lib.rs && cargo build --release --locked

# distroless/cc: glibc and CA certificates, no shell, runs as uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/cds-secret-guard /usr/local/bin/cds-secret-guard
USER 65532:65532
EXPOSE 8443 8080
ENTRYPOINT ["/usr/local/bin/cds-secret-guard"]
CMD ["serve"]
