# The README's commands. Each target sets up what it needs (scripts/setup.sh:
# PostgreSQL server binaries and Go modules; Java, Maven and the Kafka jars
# for the real-broker targets), quickly when that is already done. No Docker.

GO       ?= go
BIN      ?= bin/cdc
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

.PHONY: setup setup-base build demo test test-kafka test-registry test-pg test-failover test-replica chaos soak bench-network bench-network-run kafka-start kafka-stop test-short fuzz bench vet clean

setup:            ## install everything: PostgreSQL server binaries, Go modules, Java, Maven, the Kafka jars
	@./scripts/setup.sh

setup-base:       # what make demo and make test need: PostgreSQL server binaries and Go modules
	@./scripts/setup.sh --base

build:            ## build bin/cdc
	$(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o $(BIN) ./cmd/cdc

demo: setup-base ## see it work: throwaway Postgres, embedded Kafka, an order service
	$(GO) run ./cmd/cdc demo $(DEMO_ARGS)

test: setup-base vet ## unit and integration tests (real Postgres, in-process Kafka), the Helm chart and the compose file
	@$(GO) run ./scripts/testbackend
	GO=$(GO) ./scripts/gotest.sh -race -count=1 -timeout 20m ./...
	cd deploy/check && $(GO) test -count=1 ./...
	@# A count, not a duration: Go 1.26's fuzz coordinator can report its own
	@# -fuzztime deadline as a failure (go.dev/issue/75804, fixed in 1.27).
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime 500000x ./internal/decode
	$(GO) test -run '^$$' -fuzz FuzzReadJSON -fuzztime 100000x ./internal/expr
	@# An input of FuzzEval runs for up to a cost limit's worth; minimizing
	@# each new one for the default 60 s stalled a run a minute at a time.
	$(GO) test -run '^$$' -fuzz FuzzEval -fuzztime 2000x -fuzzminimizetime 10x ./internal/exprcost

# The whole suite against a real Apache Kafka broker (scripts/kafka.sh), plus
# the tests only a real broker can answer (-tags realkafka).
test-kafka: setup ## integration tests against a real Apache Kafka broker
	./scripts/kafka.sh fetch
	@dir=$$(mktemp -d -t cdc-kafka-XXXXXX); \
	trap './scripts/kafka.sh stop '"$$dir" EXIT; \
	brokers=$$(./scripts/kafka.sh start "$$dir") || exit 1; \
	echo "test-kafka: Apache Kafka at $$brokers"; \
	CDC_TEST_KAFKA_BROKERS=$$brokers $(GO) run ./scripts/testbackend; \
	CDC_TEST_KAFKA_BROKERS=$$brokers CDC_TEST_KAFKA_DIR=$$dir \
	  GO=$(GO) ./scripts/gotest.sh -tags realkafka -count=1 -timeout 20m ./...

# The Schema Registry tests against a real registry you run, instead of
# srfake (testregistry.New): Apicurio's /apis/ccompat/v7, Confluent's,
# Karapace or Redpanda. None can be installed on the project's machines
# (docs/config.md, "Apicurio Registry"), so CI runs them on srfake; the
# tests that take the registry down or answer in its place stay on srfake.
# Subjects are named after each test, so a registry used before is fine.
REGISTRY_URL ?=
REGISTRY_TESTS ?= ^(TestAvro|TestInvalidIsAnEventError|TestSchemaEvolvedWhileStreaming|TestJSONSchema|TestProtobuf|TestSubjectsKeysAndAutoRegister|TestCacheIsBounded|TestSchemaFormatsEndToEnd|TestCheckSchemaSubjects|TestReplayEncodesTheSame|TestParkedKeyOnSchema|TestDecodesWhatTheConnectorEncodes|TestExamples)$$
test-registry: setup-base ## the Schema Registry tests against a registry you run: make test-registry REGISTRY_URL=http://127.0.0.1:8080/apis/ccompat/v7
	@[ -n "$(REGISTRY_URL)" ] || { echo "test-registry: set REGISTRY_URL to a Confluent-compatible registry's API, e.g. Apicurio's in-memory one (docker run -p 8080:8080 apicurio/apicurio-registry:3.3.3) at http://127.0.0.1:8080/apis/ccompat/v7" >&2; exit 2; }
	CDC_TEST_REGISTRY_URL=$(REGISTRY_URL) $(GO) test -count=1 -timeout 20m -run '$(REGISTRY_TESTS)' \
	  ./internal/schema ./internal/pipeline ./examples/consumer/registry ./cmd/cdc

# The suite on another PostgreSQL major, 14 to 18, with server binaries
# scripts/pgbin.sh fetches from Maven Central. Below 15 the three tests that
# find a commit record with pg_walinspect (15+) are left out, by name. Only
# the packages whose tests start a server (they import internal/testenv):
# the others ran in make test, and a server's major changes nothing of them.
PG ?= 18
test-pg: setup     ## the suite on PostgreSQL $(PG) (14 to 18), e.g. make test-pg PG=14
	@bin=$$(./scripts/pgbin.sh $(PG)) || exit 1; \
	skip=""; if [ $(PG) -lt 15 ]; then skip='^(TestPartitionFaultHoldsConfirmedPosition|TestPoisonEventStops|TestDeadLetterPolicy|TestMovedIntoSchema|TestExpressionFailureStops|TestSchemaRegistryDown|TestRegistryWaitExactlyOnce)$$'; fi; \
	echo "test-pg: PostgreSQL $(PG) from $$bin"; \
	pkgs=$$($(GO) list -f '{{.ImportPath}} {{join .TestImports " "}} {{join .XTestImports " "}}' ./... | awk '/internal\/testenv( |$$)/ {print $$1}'); \
	[ -n "$$pkgs" ] || { echo "test-pg: no package's tests start a server" >&2; exit 1; }; \
	CDC_PG_BIN=$$bin GO=$(GO) ./scripts/gotest.sh -count=1 -timeout 20m -skip "$$skip" -- $$pkgs

# Failover to a promoted standby with failover slots (PostgreSQL 17+,
# internal/pipeline/failover_test.go, -tags failover).
FAILOVER_PG ?= 17
test-failover: setup ## a primary -> standby failover with failover slots, on PostgreSQL $(FAILOVER_PG)
	@bin=$$(./scripts/pgbin.sh $(FAILOVER_PG)) || exit 1; \
	echo "test-failover: PostgreSQL $(FAILOVER_PG) from $$bin"; \
	CDC_PG_BIN=$$bin $(GO) test -tags failover -run '^TestFailover' -count=1 -v -timeout 10m ./internal/pipeline > "$${TMPDIR:-/tmp}/cdc-failover.log" 2>&1; rc=$$?; \
	grep -E '^(--- |ok|FAIL)|failover_test.go' "$${TMPDIR:-/tmp}/cdc-failover.log"; \
	[ $$rc = 0 ] || tail -60 "$${TMPDIR:-/tmp}/cdc-failover.log"; exit $$rc

# Streaming from a hot standby, with postgres.primary_url, and its
# promotion (PostgreSQL 16+, internal/pipeline/replica_test.go, -tags
# replica). CI runs 16 and 17.
REPLICA_PG ?= 16
test-replica: setup ## streaming from a hot standby and its promotion, on PostgreSQL $(REPLICA_PG) (16+)
	@bin=$$(./scripts/pgbin.sh $(REPLICA_PG)) || exit 1; \
	echo "test-replica: PostgreSQL $(REPLICA_PG) from $$bin"; \
	CDC_PG_BIN=$$bin $(GO) test -tags replica -run '^TestReplica(CLI)?$$' -count=1 -v -timeout 20m ./internal/pipeline ./cmd/cdc > "$${TMPDIR:-/tmp}/cdc-replica.log" 2>&1; rc=$$?; \
	grep -E '^(--- |    --- |        --- |ok|FAIL)|(replica|examples)_test.go' "$${TMPDIR:-/tmp}/cdc-replica.log"; \
	[ $$rc = 0 ] || tail -80 "$${TMPDIR:-/tmp}/cdc-replica.log"; exit $$rc

# The fault suite (cmd/cdc/chaos_test.go, -tags chaos) on a real broker:
# every event counted through faults. CI runs a short version.
CHAOS_KILLS ?= 37
CHAOS_RATE  ?= 1000
CHAOS_OUTAGE ?= 60s
NET_FAULT    ?= 60s
# The table-life nemesis: TABLELIFE of random changes in each delivery
# mode; TABLELIFE_EACH=all makes each change once instead (CI).
TABLELIFE      ?= 3m
TABLELIFE_EACH ?=
# The parts of the fault suite to run, in this order (CI runs them in two
# groups side by side).
CHAOS_PARTS ?= kill deploy network tablelife promotion detours
# The detours' model (internal/pipeline, TestDetourModel): steps a mode,
# seeded (DETOUR_SEED replays one; "" draws it).
DETOUR_STEPS ?= 300
DETOUR_SEED  ?=
chaos: setup      ## fault suite on a real broker: kill -9 loops in both delivery modes, a broker outage, network faults (latency, black holes, resets, a slow link), the table-life nemesis with retention on and a standby promoted under load, counting lost, duplicated, reordered and early-deleted events
	@part() { case " $(CHAOS_PARTS) " in *" $$1 "*) return 0;; esac; return 1; }; \
	dir=$$(mktemp -d -t cdc-kafka-XXXXXX); \
	trap './scripts/kafka.sh stop '"$$dir" EXIT; \
	if part kill || part deploy || part promotion || part detours; then \
	brokers=$$(./scripts/kafka.sh start "$$dir") || exit 1; \
	echo "chaos: Apache Kafka at $$brokers, $(CHAOS_KILLS) kills, writers at $(CHAOS_RATE) events/s, a $(CHAOS_OUTAGE) broker outage"; \
	fi; \
	if part kill; then \
	CDC_TEST_KAFKA_BROKERS=$$brokers CDC_CHAOS_KILLS=$(CHAOS_KILLS) CDC_CHAOS_RATE=$(CHAOS_RATE) CDC_CHAOS_OUTAGE=$(CHAOS_OUTAGE) \
	  $(GO) test -tags chaos -run '^TestChaos' -count=1 -v -timeout 60m ./cmd/cdc > "$$dir/chaos.log" 2>&1; rc=$$?; \
	grep -E '^(--- |ok|FAIL)|chaos(_memory|_park)?_test.go' "$$dir/chaos.log"; \
	[ $$rc = 0 ] || { tail -60 "$$dir/chaos.log"; exit $$rc; }; \
	fi; \
	if part deploy; then \
	echo "chaos: deployment scenarios on the real broker (replicas started together with a backfill, a restore in exactly-once mode, a takeover as the least-privileged role)"; \
	CDC_TEST_KAFKA_BROKERS=$$brokers $(GO) test -run '^(TestReplicasStartTogether|TestRestoreFromBackup|TestStandbyLeavesABusyHolder)$$' -count=1 -v -timeout 20m ./internal/pipeline > "$$dir/deploy.log" 2>&1 && \
	CDC_TEST_KAFKA_BROKERS=$$brokers $(GO) test -run '^TestStandbyTakesOverAFrozenHolder$$' -count=1 -v -timeout 10m ./cmd/cdc >> "$$dir/deploy.log" 2>&1; rc=$$?; \
	grep -E '^(--- |ok|FAIL)|(deploy|history|standby)_test.go' "$$dir/deploy.log"; \
	[ $$rc = 0 ] || { tail -60 "$$dir/deploy.log"; exit $$rc; }; \
	fi; \
	if part network; then \
	echo "chaos: a network between the parts (scripts/netchaos: toxiproxy in front of Postgres and a broker of its own): latency, $(NET_FAULT) black holes, resets, a slow link"; \
	(cd scripts/netchaos && CDC_NET_FAULT=$(NET_FAULT) $(GO) test -run '^TestNetwork' -count=1 -v -timeout 60m .) > "$$dir/network.log" 2>&1; rc=$$?; \
	grep -E '^(--- |    --- |ok|FAIL)|network_test.go' "$$dir/network.log"; \
	[ $$rc = 0 ] || { tail -60 "$$dir/network.log"; exit $$rc; }; \
	fi; \
	if part tablelife; then \
	echo "chaos: the table-life nemesis (scripts/netchaos, TestTableLife): renames, swaps, recreates, a table out of the publication and back, partitions attached with rows and detached, publish_via_partition_root off, kill -9, with retention on; $(if $(TABLELIFE_EACH),each change once,$(TABLELIFE) of random changes) in each delivery mode"; \
	(cd scripts/netchaos && CDC_TABLELIFE=$(TABLELIFE) CDC_TABLELIFE_EACH=$(TABLELIFE_EACH) CDC_SOAK_OUT="$$dir/tablelife" \
	  $(GO) test -run '^TestTableLife$$' -count=1 -v -timeout 60m .) > "$$dir/tablelife.log" 2>&1; rc=$$?; \
	grep -E '^(--- |    --- |ok|FAIL)|tablelife_test.go' "$$dir/tablelife.log" | cut -c1-300; \
	[ $$rc = 0 ] || { tail -60 "$$dir/tablelife.log"; exit $$rc; }; \
	fi; \
	if part promotion; then \
	echo "chaos: a hot standby the connector streams from is promoted under a writer, in both delivery modes (PostgreSQL $(REPLICA_PG))"; \
	pgbin=$$(./scripts/pgbin.sh $(REPLICA_PG)) || exit 1; \
	CDC_PG_BIN=$$pgbin CDC_TEST_KAFKA_BROKERS=$$brokers $(GO) test -tags replica -run '^TestReplica$$/promotion' -count=1 -v -timeout 20m ./internal/pipeline > "$$dir/promotion.log" 2>&1; rc=$$?; \
	grep -E '^(--- |    --- |        --- |ok|FAIL)|replica_test.go' "$$dir/promotion.log"; \
	[ $$rc = 0 ] || { tail -60 "$$dir/promotion.log"; exit $$rc; }; \
	fi; \
	if part detours; then \
	echo "chaos: the detours' model on the real broker: $(DETOUR_STEPS) random steps of parkings, redrives and restarts in each delivery mode"; \
	CDC_TEST_KAFKA_BROKERS=$$brokers CDC_MODEL_STEPS=$(DETOUR_STEPS) CDC_MODEL_SEED=$(DETOUR_SEED) \
	  $(GO) test -run '^TestDetourModel$$' -count=1 -v -timeout 60m ./internal/pipeline > "$$dir/detours.log" 2>&1; rc=$$?; \
	grep -E '^(--- |    --- |ok|FAIL)|TestDetourModel: seed|detour_model_test.go:[0-9]+: seed' "$$dir/detours.log" | cut -c1-600; \
	[ $$rc = 0 ] || { tail -60 "$$dir/detours.log"; exit $$rc; }; \
	fi

# make soak: 8 writers, two replicas and a nemesis picking a fault every
# 20-60 s, for SOAK in each delivery mode of SOAK_MODES, on a real broker
# (scripts/netchaos, TestSoak); then the table-life nemesis for SOAK in each
# mode (TestTableLife). Into SOAK_OUT: each run's history, report and plot
# (docs/operations.md, "Soak"). CI runs 90 s of each in each mode.
SOAK       ?= 1h
SOAK_MODES ?= at-least-once exactly-once
SOAK_RATE  ?= 400
# How long the table-life nemesis runs after the soak, in each mode ("":
# not at all; CI runs make chaos's each-change-once form instead).
SOAK_TABLELIFE ?= $(SOAK)
SOAK_OUT   ?= $(or $(TMPDIR),/tmp)/cdc-soak
soak: setup       ## a long randomized soak: writers, two replicas, a nemesis; a checker, a report and a plot per delivery mode
	@out=$(abspath $(SOAK_OUT)); mkdir -p "$$out"; \
	echo "soak: $(SOAK) in each of $(SOAK_MODES), $(SOAK_RATE) events/s; history, reports and plots in $$out"; \
	(cd scripts/netchaos && CDC_SOAK=$(SOAK) CDC_SOAK_MODES="$(SOAK_MODES)" CDC_SOAK_RATE=$(SOAK_RATE) CDC_SOAK_OUT="$$out" \
	  $(GO) test -run '^TestSoak$$' -count=1 -v -timeout 12h .) > "$$out/soak.log" 2>&1; rc=$$?; \
	grep -E '^(--- |    --- |ok|FAIL)|soak_test.go' "$$out/soak.log"; \
	[ $$rc = 0 ] || { tail -80 "$$out/soak.log"; exit $$rc; }; \
	if [ -n "$(SOAK_TABLELIFE)" ]; then \
	echo "soak: the table-life nemesis, $(SOAK_TABLELIFE) in each of $(SOAK_MODES)"; \
	(cd scripts/netchaos && CDC_TABLELIFE=$(SOAK_TABLELIFE) CDC_TABLELIFE_MODES="$(SOAK_MODES)" CDC_SOAK_OUT="$$out" \
	  $(GO) test -run '^TestTableLife$$' -count=1 -v -timeout 12h .) > "$$out/tablelife.log" 2>&1; rc=$$?; \
	grep -E '^(--- |    --- |ok|FAIL)|tablelife_test.go' "$$out/tablelife.log" | cut -c1-300; \
	fi; \
	for h in $(foreach m,$(SOAK_MODES),$(m) tablelife-$(m)); do \
	  [ ! -s "$$out/history-$$h.jsonl" ] || (cd scripts/benchplot && $(GO) run . soak "$$out/history-$$h.jsonl" "$$out/soak-$$h.png") || rc=1; \
	done; \
	[ $$rc = 0 ] || tail -80 "$$out/tablelife.log" 2>/dev/null; exit $$rc

kafka-start:      ## start a real broker for manual use; prints its address
	./scripts/kafka.sh start

kafka-stop:
	./scripts/kafka.sh stop

test-short:       ## unit tests only
	$(GO) test -short -count=1 ./...

fuzz:             ## fuzz what reads hostile input: the pgoutput decoder (2,000,000 inputs), the expressions' payload reader and their cost bounds, and the backfill's --where check
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime 2000000x ./internal/decode
	$(GO) test -run '^$$' -fuzz FuzzReadJSON -fuzztime 1000000x ./internal/expr
	$(GO) test -run '^$$' -fuzz FuzzEval -fuzztime 100000x -fuzzminimizetime 10x ./internal/exprcost
	$(GO) test -run '^$$' -fuzz FuzzCheck -fuzztime 1000000x ./internal/sqlwhere

# make bench: what users see, on a real Apache Kafka broker, next to
# pg_recvlogical on the same backlog (docs/benchmarks.md). Each run appends
# its figures to $(BENCH_DIR)/results.jsonl; scripts/benchplot (a module of
# its own, so that its plotting library is no requirement of the connector's)
# draws the plots there. CI runs a short version into a scratch directory.
BENCH_DIR   ?= docs/bench
BENCH_COUNT ?= 3
BENCH_ONLY  ?= BenchmarkStartup|BenchmarkDrain|BenchmarkPayload|BenchmarkLatency|BenchmarkSweep|BenchmarkReplay|BenchmarkBackfill|BenchmarkExactlyOnce|BenchmarkSchema|BenchmarkExpressions|BenchmarkParked

bench: setup     ## start-up, drain, payload sizes, latency, a rate sweep, replay and backfill on a real broker vs pg_recvlogical (3 paired runs); plots in docs/bench
	./scripts/kafka.sh fetch
	mkdir -p $(BENCH_DIR) && rm -f $(BENCH_DIR)/results.jsonl
	$(GO) test -run '^$$' -bench BenchmarkHotPath -benchmem -count $(BENCH_COUNT) ./internal/relay
	@dir=$$(mktemp -d -t cdc-kafka-XXXXXX); \
	trap './scripts/kafka.sh stop '"$$dir" EXIT; \
	brokers=$$(./scripts/kafka.sh start "$$dir") || exit 1; \
	echo "bench: Apache Kafka at $$brokers"; \
	echo "bench: warming the broker's JVM and its transaction coordinator (not recorded)"; \
	CDC_TEST_KAFKA_BROKERS=$$brokers CDC_BENCH_EVENTS=20000 \
	  $(GO) test -run '^$$' -bench 'BenchmarkDrain/tx=1000' -benchtime 1x -count 1 ./internal/pipeline >/dev/null || exit 1; \
	CDC_TEST_KAFKA_BROKERS=$$brokers CDC_BENCH_EVENTS=20000 \
	  $(GO) test -run '^$$' -bench 'BenchmarkExactlyOnce' -benchtime 1x -count 1 ./internal/pipeline >/dev/null || exit 1; \
	CDC_TEST_KAFKA_BROKERS=$$brokers CDC_TEST_KAFKA_DIR=$$dir CDC_BENCH_OUT=$(abspath $(BENCH_DIR))/results.jsonl \
	  $(GO) test -run '^$$' -bench '$(BENCH_ONLY)' -benchtime 1x -count $(BENCH_COUNT) -timeout 60m ./internal/pipeline
	$(MAKE) --no-print-directory bench-network-run
	cd scripts/benchplot && $(GO) run . $(abspath $(BENCH_DIR))/results.jsonl $(abspath $(BENCH_DIR))

# make bench-network: the drain and the 20k events/s latency run in both
# delivery modes, with the connector reaching a broker of its own through
# scripts/netchaos's netproxy, which adds NET_LATENCIES ms each way (0 is the
# proxy alone); the bench's own clients reach the broker directly. make
# bench runs it too, into the same results.
NET_LATENCIES ?= 0 2 20
NET_BENCH     ?= BenchmarkNetwork
bench-network: setup ## the drain and the latency run with 0, 2 and 20 ms between the connector and the broker
	mkdir -p $(BENCH_DIR)
	$(MAKE) --no-print-directory bench-network-run

bench-network-run:
	@dir=$$(mktemp -d -t cdc-kafka-XXXXXX); px=; \
	trap '[ -n "$$px" ] && kill $$px 2>/dev/null; ./scripts/kafka.sh stop '"$$dir" EXIT; \
	port=$$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'); \
	brokers=$$(CDC_KAFKA_PROXIED=127.0.0.1:$$port ./scripts/kafka.sh start "$$dir") || exit 1; \
	(cd scripts/netchaos && $(GO) build -o "$$dir/netproxy" ./cmd/netproxy) || exit 1; \
	echo "bench-network: Apache Kafka at $$brokers; the connector through 127.0.0.1:$$port"; \
	for ms in $(NET_LATENCIES); do \
	  "$$dir/netproxy" -listen 127.0.0.1:$$port -to "$$(cat "$$dir/proxied_listener")" -latency $${ms}ms & px=$$!; \
	  if [ "$$ms" = "$(firstword $(NET_LATENCIES))" ]; then \
	    echo "bench-network: warming the broker (not recorded)"; \
	    CDC_TEST_KAFKA_BROKERS=$$brokers CDC_BENCH_CONNECTOR_BROKERS=127.0.0.1:$$port CDC_BENCH_EVENTS=20000 \
	      $(GO) test -run '^$$' -bench 'BenchmarkNetwork/drain' -benchtime 1x -count 1 ./internal/pipeline >/dev/null || exit 1; \
	  fi; \
	  CDC_TEST_KAFKA_BROKERS=$$brokers CDC_TEST_KAFKA_DIR=$$dir CDC_BENCH_CONNECTOR_BROKERS=127.0.0.1:$$port CDC_BENCH_NET_MS=$$ms \
	  CDC_BENCH_OUT=$(abspath $(BENCH_DIR))/results.jsonl \
	    $(GO) test -run '^$$' -bench '$(NET_BENCH)' -benchtime 1x -count $(BENCH_COUNT) -timeout 60m ./internal/pipeline || exit 1; \
	  kill $$px; wait $$px 2>/dev/null; px=; \
	done

vet:
	$(GO) vet ./...
	cd scripts/containers && $(GO) vet ./...
	cd scripts/netchaos && $(GO) vet ./...
	cd deploy/check && $(GO) vet ./...
	@test -z "$$(gofmt -l .)" || (echo "gofmt needed:"; gofmt -l .; exit 1)

clean:
	rm -rf bin
