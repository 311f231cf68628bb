# syntax=docker/dockerfile:1
#
# One image with every command: server, processor, sweeper, paycli and
# healthcheck, each a static binary. docker-compose.yml runs each service
# from it with its own command.
#
#   docker build -t payments .
#   docker run --rm payments server migrate        # needs DATABASE_URL

# Build: Go 1.26, no cgo, so the binaries need no C library at run time.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ENV CGO_ENABLED=0
RUN go build -trimpath -ldflags="-s -w" -o /out/ \
      ./cmd/server ./cmd/processor ./cmd/sweeper ./cmd/paycli ./cmd/healthcheck

# Run: distroless static has CA certificates and a non-root user, and no
# shell or package manager to attack. The binaries are all it holds.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER nonroot:nonroot
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
  CMD ["/usr/local/bin/healthcheck", "http://127.0.0.1:8080/healthz"]
CMD ["server"]
