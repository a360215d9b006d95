# The image the manifests run (ghcr.io/pdp-injector/pdp-injector). Build: docker build -t pdp-injector .
# The release binary of scripts/release.sh (debug info split off into pdp-injector.debug, which stays in the build
# stage: publish it from `scripts/release.sh` on the release machine) on a distroless base; runs as the nonroot
# user (65532), as the Deployment's restricted securityContext expects. (No container engine runs on the
# project's CI machines: this file is kept correct by review; the binary itself is what CI tests.)
FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY crates ./crates
COPY benches ./benches
COPY bench ./bench
# pdp-await: the helper the webhook gives classic sidecars (Kubernetes < 1.29) through an init container of this
# image; static (tools/pdp-await/.cargo/config.toml), since it runs inside the PDP's image.
COPY tools ./tools
COPY scripts/release.sh ./scripts/release.sh
# objcopy: binutils, in the rust image already.
RUN DIST=/src/dist scripts/release.sh binary

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/dist/pdp-injector /usr/local/bin/pdp-injector
COPY --from=build /src/dist/pdp-await /usr/local/bin/pdp-await
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["/usr/local/bin/pdp-injector"]
CMD ["serve"]
