# Small multi-stage image of the connector: a static Go binary on distroless.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=docker
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/cdc ./cmd/cdc

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/cdc /usr/local/bin/cdc
USER nonroot
ENTRYPOINT ["/usr/local/bin/cdc"]
CMD ["run", "--config", "/etc/cdc/cdc.yaml"]
