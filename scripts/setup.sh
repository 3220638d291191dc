#!/usr/bin/env bash
# Installs what building, testing and the demo need on a Debian/Ubuntu
# machine: the PostgreSQL server binaries (initdb, pg_ctl, pg_recvlogical)
# and the Go modules; without --base, also Java, Maven and the Kafka broker
# jars of make test-kafka and make bench. Go itself must already be
# installed (go.mod names the version). Safe to run again, and quick: it
# skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

have_pg() {
  command -v initdb >/dev/null 2>&1 && return 0
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1
}

if ! command -v go >/dev/null 2>&1; then
  echo "setup: Go is not installed; install Go $(sed -n 's/^go //p' go.mod) or newer from https://go.dev/dl" >&2
  exit 1
fi

if have_pg; then
  echo "setup: PostgreSQL server binaries found"
else
  echo "setup: installing PostgreSQL server binaries (apt-get install postgresql)"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql postgresql-contrib >/dev/null
  # The Debian package starts a cluster of its own; the tests and the demo
  # start their own servers on free ports and do not need it.
  $SUDO service postgresql stop >/dev/null 2>&1 || true
  have_pg || { echo "setup: PostgreSQL installed but initdb not found" >&2; exit 1; }
fi

# make demo and make test need no more than that: the Go modules.
if [ "${1:-}" = "--base" ]; then
  go mod download
  exit 0
fi

# Java 17+ and Maven run the real Kafka broker of `make test-kafka`.
if ! command -v java >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1; then
  echo "setup: installing Java and Maven (for the real Kafka broker in make test-kafka)"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openjdk-17-jre-headless maven >/dev/null
fi
# unzip and xz unpack the PostgreSQL builds of make test-pg (scripts/pgbin.sh).
if ! command -v unzip >/dev/null 2>&1 || ! command -v xz >/dev/null 2>&1; then
  echo "setup: installing unzip and xz-utils (for make test-pg)"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq unzip xz-utils >/dev/null
fi
if ! command -v python3 >/dev/null 2>&1; then
  echo "setup: python3 is needed by scripts/kafka.sh to pick free ports; install it (apt-get install python3)" >&2
  exit 1
fi
echo "setup: fetching the Apache Kafka broker jars (cached)"
./scripts/kafka.sh fetch

echo "setup: downloading Go modules"
go mod download
# make bench's plotter, the tests' container starter, the network fault
# suite and the Helm chart and compose checks are modules of their own
# (scripts/benchplot, scripts/containers, scripts/netchaos, deploy/check),
# outside the connector's requirements.
(cd scripts/benchplot && go mod download)
(cd scripts/containers && go mod download)
(cd scripts/netchaos && go mod download)
(cd deploy/check && go mod download)
echo "setup: done"
