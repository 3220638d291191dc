#!/usr/bin/env bash
# Runs a real single-node Apache Kafka broker (KRaft) from Maven Central jars,
# on loopback, for the test suite. No Docker, no Kafka install.
#
#   scripts/kafka.sh fetch          download the pinned broker into the cache
#   scripts/kafka.sh start [DIR]    format storage in DIR, start, wait for metadata;
#                                   prints the bootstrap address. Restarting a DIR
#                                   that was stopped with "stop --keep" reuses its
#                                   port and data.
#   scripts/kafka.sh stop [--keep] [DIR]   stop cleanly (SIGTERM), delete DIR unless --keep
#   scripts/kafka.sh brokers [DIR]  print the bootstrap address
#
# With CDC_KAFKA_SECURE_PEM (a PEM file: the server's key and certificate)
# and CDC_KAFKA_SCRAM (user:password), start also opens a SASL_SSL listener
# (SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN for that user) and writes its
# address to DIR/secure_brokers. The tests that need it set both. With
# CDC_KAFKA_PROXIED=host:port it opens one more plaintext listener,
# advertised at that address, and writes its own to DIR/proxied_listener:
# a network fault proxy in front of it sees every connection a client makes.
#
# Needs Java 17+ and Maven. The jars are cached in $CDC_KAFKA_CACHE
# (default ~/.cache/outbox-cdc), so only the first fetch downloads.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$here/kafka/pom.xml")
cache=${CDC_KAFKA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/outbox-cdc}/kafka-$version
default_dir=${TMPDIR:-/tmp}/outbox-cdc-kafka

die() { echo "kafka.sh: $*" >&2; exit 1; }

need_java() {
  command -v java >/dev/null || die "java not found; install OpenJDK 17+ (apt-get install openjdk-17-jre-headless)"
  local v
  v=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
  [ "${v:-0}" -ge 17 ] || die "Kafka $version needs Java 17+, found ${v:-unknown}"
}

fetch() {
  if [ -f "$cache/.complete" ]; then return 0; fi
  command -v mvn >/dev/null || die "mvn not found; install Maven (apt-get install maven)"
  echo "kafka.sh: fetching Apache Kafka $version from Maven Central into $cache" >&2
  rm -rf "$cache.tmp"
  mvn -q -B -f "$here/kafka/pom.xml" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$cache.tmp/libs" >&2
  ls "$cache.tmp/libs"/kafka_2.13-"$version".jar >/dev/null || die "broker jar missing after fetch"
  rm -rf "$cache" && mv "$cache.tmp" "$cache" && touch "$cache/.complete"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

brokers() { cat "${1:-$default_dir}/brokers"; }

start() {
  local dir=${1:-$default_dir}
  need_java
  fetch
  if [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
    die "a broker is already running from $dir (pid $(cat "$dir/pid")); stop it first"
  fi
  mkdir -p "$dir"
  if [ ! -f "$dir/server.properties" ]; then
    local port cport
    port=$(free_port); cport=$(free_port)
    local listeners="PLAINTEXT://127.0.0.1:$port" protocols="CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT" secure="" scram=()
    if [ -n "${CDC_KAFKA_SECURE_PEM:-}" ]; then
      local sport user pass
      sport=$(free_port)
      user=${CDC_KAFKA_SCRAM%%:*}; pass=${CDC_KAFKA_SCRAM#*:}
      listeners="$listeners,SASL_SSL://127.0.0.1:$sport"
      protocols="$protocols,SASL_SSL:SASL_SSL"
      secure="sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512,PLAIN
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$user=\"$pass\";
ssl.keystore.type=PEM
ssl.keystore.location=$CDC_KAFKA_SECURE_PEM"
      scram=(--add-scram "SCRAM-SHA-256=[name=$user,password=$pass]" --add-scram "SCRAM-SHA-512=[name=$user,password=$pass]")
      echo "127.0.0.1:$sport" > "$dir/secure_brokers"
    fi
    # CDC_KAFKA_PROXIED=host:port: one more listener, advertised at that
    # address, where a test puts a network fault proxy (toxiproxy) in front
    # of it; the listener's own address goes to $dir/proxied_listener.
    local advertised="$listeners"
    if [ -n "${CDC_KAFKA_PROXIED:-}" ]; then
      local xport
      xport=$(free_port)
      listeners="$listeners,PROXIED://127.0.0.1:$xport"
      advertised="$advertised,PROXIED://$CDC_KAFKA_PROXIED"
      protocols="$protocols,PROXIED:PLAINTEXT"
      echo "127.0.0.1:$xport" > "$dir/proxied_listener"
    fi
    cat > "$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=$listeners,CONTROLLER://127.0.0.1:$cport
advertised.listeners=$advertised
controller.listener.names=CONTROLLER
listener.security.protocol.map=$protocols
inter.broker.listener.name=PLAINTEXT
$secure
log.dirs=$dir/data
num.partitions=4
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
PROPS
    echo "127.0.0.1:$port" > "$dir/brokers"
    java -cp "$cache/libs/*" kafka.tools.StorageTool format \
      -t "$(java -cp "$cache/libs/*" kafka.tools.StorageTool random-uuid)" \
      -c "$dir/server.properties" "${scram[@]}" >"$dir/format.log" 2>&1 || { cat "$dir/format.log" >&2; die "storage format failed"; }
  fi
  local t0=$(date +%s%N)
  mkdir -p "$dir/logs"
  nohup java -Xmx512m -Xms256m -XX:+UseSerialGC -Xlog:gc:file="$dir/logs/gc.log":uptime \
    -Dkafka.logs.dir="$dir/logs" -Dlog4j2.configurationFile="file:$here/kafka/log4j2.properties" \
    -cp "$cache/libs/*" kafka.Kafka "$dir/server.properties" >"$dir/logs/stdout.log" 2>&1 &
  echo $! > "$dir/pid"
  # Ready means a real client gets metadata, not that the port is open.
  if ! (cd "$here/.." && go run ./scripts/kafkawait -brokers "$(brokers "$dir")" -timeout 120s); then
    tail -30 "$dir/logs/server.log" "$dir/logs/stdout.log" >&2 || true
    stop "$dir"
    die "broker did not become ready"
  fi
  echo "kafka.sh: Apache Kafka $version ready at $(brokers "$dir") in $(( ($(date +%s%N) - t0) / 1000000 )) ms" >&2
  brokers "$dir"
}

stop() {
  local keep=0
  if [ "${1:-}" = "--keep" ]; then keep=1; shift; fi
  local dir=${1:-$default_dir}
  if [ -f "$dir/pid" ]; then
    local pid
    pid=$(cat "$dir/pid")
    if kill -TERM "$pid" 2>/dev/null; then
      for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$dir/pid"
  fi
  if [ "$keep" = 0 ]; then rm -rf "$dir"; fi
}

case "${1:-}" in
  fetch) fetch ;;
  start) shift; start "$@" ;;
  stop) shift; stop "$@" ;;
  brokers) shift; brokers "$@" ;;
  *) sed -n '2,16p' "$0" >&2; exit 2 ;;
esac
