# The release image: goreleaser builds cdc for each platform and puts it
# next to this file. The same base and user as ../Dockerfile, which builds
# from source for docker compose.
FROM gcr.io/distroless/static-debian12:nonroot
COPY cdc /usr/local/bin/cdc
USER nonroot
ENTRYPOINT ["/usr/local/bin/cdc"]
CMD ["run", "--config", "/etc/cdc/cdc.yaml"]
