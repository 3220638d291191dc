# The README's commands. Every target works on a machine prepared by
# `make setup` (Go, PostgreSQL server binaries); no Docker, no Kafka needed.

GO       ?= go
BIN      ?= bin/cdc
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

.PHONY: setup build demo test test-kafka kafka-start kafka-stop test-short fuzz bench vet clean

setup:            ## install PostgreSQL server binaries and Go modules
	./scripts/setup.sh

build:            ## build bin/cdc
	$(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o $(BIN) ./cmd/cdc

demo:             ## see it work: throwaway Postgres, embedded Kafka, an order service
	$(GO) run ./cmd/cdc demo $(DEMO_ARGS)

test: vet         ## unit and integration tests (real Postgres, in-process Kafka)
	@$(GO) run ./scripts/testbackend
	$(GO) test -race -count=1 -timeout 20m ./...
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime 15s ./internal/decode

# The whole suite against a real Apache Kafka broker (scripts/kafka.sh), plus
# the tests only a real broker can answer (-tags realkafka).
test-kafka:       ## integration tests against a real Apache Kafka broker
	./scripts/kafka.sh fetch
	@dir=$$(mktemp -d -t cdc-kafka-XXXXXX); \
	trap './scripts/kafka.sh stop '"$$dir" EXIT; \
	brokers=$$(./scripts/kafka.sh start "$$dir") || exit 1; \
	echo "test-kafka: Apache Kafka at $$brokers"; \
	CDC_TEST_KAFKA_BROKERS=$$brokers $(GO) run ./scripts/testbackend; \
	CDC_TEST_KAFKA_BROKERS=$$brokers CDC_TEST_KAFKA_DIR=$$dir \
	  $(GO) test -tags realkafka -count=1 -timeout 20m ./...

kafka-start:      ## start a real broker for manual use; prints its address
	./scripts/kafka.sh start

kafka-stop:
	./scripts/kafka.sh stop

test-short:       ## unit tests only
	$(GO) test -short -count=1 ./...

fuzz:             ## fuzz the pgoutput decoder for a minute
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime 60s ./internal/decode

bench:            ## drain 100k events; compare with pg_recvlogical on the same backlog
	$(GO) test -run '^$$' -bench 'BenchmarkDrain|BenchmarkReplay' -benchtime 1x -timeout 30m ./internal/pipeline

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l .)" || (echo "gofmt needed:"; gofmt -l .; exit 1)

clean:
	rm -rf bin
