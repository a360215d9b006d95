# The image the manifests run (ghcr.io/pdp-injector/pdp-injector). Build: docker build -t pdp-injector .
# Static-enough release binary on a distroless base; runs as the nonroot user (65532), as the Deployment's
# restricted securityContext expects. (No container engine runs on the project's CI machines: this file is
# checked for syntax by hadolint-free review only; the binary itself is what CI tests.)
FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY crates ./crates
COPY benches ./benches
COPY bench ./bench
RUN cargo build --release --locked --bin pdp-injector
# pdp-await: the helper the webhook gives classic sidecars (Kubernetes < 1.29) through an init container of this
# image; static (tools/pdp-await/.cargo/config.toml), since it runs inside the PDP's image.
COPY tools ./tools
RUN cd tools/pdp-await && cargo build --release --locked

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/pdp-injector /usr/local/bin/pdp-injector
COPY --from=build /src/tools/pdp-await/target/release/pdp-await /usr/local/bin/pdp-await
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["/usr/local/bin/pdp-injector"]
CMD ["serve"]
