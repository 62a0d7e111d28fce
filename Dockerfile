# kvindexd container image: a static, pure-Go binary (CGO_ENABLED=0; the ZMQ
# transport is pure Go too) on an empty base, running as a non-root user.
#
#   make image                      # docker, podman or buildah, whichever works
#   docker build -t kvindexd:dev .
#   docker buildx build --platform linux/amd64,linux/arm64 -t REPO/kvindexd:TAG --push .
#
# Probes: GET /healthz (alive) and GET /readyz (ready) on the HTTP port; the
# image has no HEALTHCHECK (Kubernetes probes them, and an empty image has no
# shell or curl to run one). deploy/deploy_test.go lints this file.

# The builder runs on the build machine's platform and cross-compiles.
FROM --platform=$BUILDPLATFORM golang:1.26.8-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG TARGETOS=linux
ARG TARGETARCH=amd64
# What `kvindexd version`, kvindexd_build_info and /v1/status report
# (make image passes git describe and the commit, as make build stamps them):
#   docker build --build-arg VERSION=v1.2.3 --build-arg COMMIT=$(git rev-parse HEAD) .
# Stripped (-s -w) and without local paths (-trimpath).
ARG VERSION=devel
ARG COMMIT=unknown
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w -X main.version=$VERSION -X main.commit=$COMMIT" -o /out/kvindexd ./cmd/kvindexd \
 && mkdir -p /out/data

FROM scratch
# CA certificates for rediss:// (TLS) index URLs.
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/kvindexd /kvindexd
# A writable directory for snapshots (mount a volume over it).
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
# gRPC, HTTP (scores, /metrics, /healthz, /readyz, status page), ZMQ bind.
EXPOSE 50051 8080 5557
ENTRYPOINT ["/kvindexd"]
CMD ["serve"]
