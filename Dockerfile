# One image with every binary the cluster and docker-compose.yaml run (operator, worker,
# discovery, localproxyd); each Deployment or service picks its binary with `command`, so
# the image has no entrypoint. cmd/devstack is a development tool and is not built here.
#
#   docker build -t ghcr.io/proxyfleet/proxyfleet:v0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 -t ... .   # cross-compiles, no emulation

FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src
# Modules first: this layer is rebuilt only when go.mod or go.sum change.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG TARGETOS
ARG TARGETARCH
# Static binaries (distroless/static has no libc); -trimpath keeps build paths out of them.
RUN --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w" -o /out/ \
      ./cmd/operator ./cmd/worker ./cmd/discovery ./cmd/localproxyd

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/operator /out/worker /out/discovery /out/localproxyd /usr/local/bin/
# The nonroot user of distroless, numerically, so runAsNonRoot can check it.
USER 65532:65532
