#!/usr/bin/env bash
# Pins the base images of Dockerfile and docker/release.Dockerfile by digest:
# each `FROM image:tag` (or `image:tag@sha256:old`) becomes
# `image:tag@sha256:<the digest the registry serves for tag now>`, so a
# build pulls exactly the image that was reviewed. The tag stays for the
# reader; Docker uses the digest. Needs a registry: run it where docker
# buildx can reach Docker Hub and gcr.io, review the diff, and commit it.
#
#   ./scripts/pin-images.sh          rewrite the files
#   ./scripts/pin-images.sh --check  fail if a base image is not pinned
set -euo pipefail
cd "$(dirname "$0")/.."
files=(Dockerfile docker/release.Dockerfile)

if [ "${1:-}" = "--check" ]; then
  if grep -nE '^FROM [^ @]+( |$)' "${files[@]}"; then
    echo "pin-images: the base images above are not pinned by digest: run ./scripts/pin-images.sh" >&2
    exit 1
  fi
  exit 0
fi

command -v docker >/dev/null || { echo "pin-images: needs docker (buildx) to ask the registry for digests" >&2; exit 1; }
for f in "${files[@]}"; do
  for ref in $(sed -nE 's/^FROM ([^ ]+).*/\1/p' "$f" | sort -u); do
    image=${ref%@*}
    digest=$(docker buildx imagetools inspect "$image" --format '{{json .Manifest.Digest}}' | tr -d '"')
    case "$digest" in sha256:*) ;; *) echo "pin-images: no digest for $image" >&2; exit 1 ;; esac
    sed -i "s|^FROM $ref\b|FROM $image@$digest|" "$f"
    echo "pin-images: $f: $image@$digest"
  done
done
