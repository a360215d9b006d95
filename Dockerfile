# The image the manifests run (ghcr.io/pdp-injector/pdp-injector). Build: docker build -t pdp-injector .
# Static-enough release binary on a distroless base; runs as the nonroot user (65532), as the Deployment's
# restricted securityContext expects. (No container engine runs on the project's CI machines: this file is
# checked for syntax by hadolint-free review only; the binary itself is what CI tests.)
FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
COPY bench ./bench
RUN cargo build --release --locked --bin pdp-injector

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/pdp-injector /usr/local/bin/pdp-injector
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["/usr/local/bin/pdp-injector"]
CMD ["serve"]
