// Command containers starts one Postgres or Kafka container with
// testcontainers-go for the integration tests (internal/testenv), prints
// where it listens as one JSON line on stdout, and removes the container
// when its standard input closes or it is signalled.
//
// It is a module of its own so that testcontainers-go and the Docker client
// it brings are not requirements of the connector's module: the binary and
// its users never download them. The tests build it only when a Docker
// engine answers.
//
//	containers postgres [setting=value ...]   prints {"url": "..."}
//	containers kafka                          prints {"brokers": ["..."]}
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tckafka "github.com/testcontainers/testcontainers-go/modules/kafka"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

// The images the tests run. The kafka module of testcontainers-go supports
// confluent-local.
const (
	postgresImage = "postgres:17"
	kafkaImage    = "confluentinc/confluent-local:7.5.0"
)

// started is the line printed once the container is ready.
type started struct {
	URL     string   `json:"url,omitempty"`
	Brokers []string `json:"brokers,omitempty"`
	Image   string   `json:"image"`
}

func main() {
	if len(os.Args) < 2 {
		fail(fmt.Errorf("usage: containers postgres [setting=value ...] | containers kafka"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	var (
		c   testcontainers.Container
		out started
		err error
	)
	switch os.Args[1] {
	case "postgres":
		c, out, err = runPostgres(ctx, os.Args[2:])
	case "kafka":
		c, out, err = runKafka(ctx)
	default:
		err = fmt.Errorf("unknown container %q: want postgres or kafka", os.Args[1])
	}
	cancel()
	if err != nil {
		fail(err)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		testcontainers.TerminateContainer(c)
		fail(err)
	}

	// The test process holds our stdin open; its end, or a signal, ends
	// the container.
	done := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(done) }()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-done:
	case <-sig:
	}
	if err := testcontainers.TerminateContainer(c); err != nil {
		fail(err)
	}
}

func runPostgres(ctx context.Context, settings []string) (testcontainers.Container, started, error) {
	cmd := []string{"postgres", "-c", "wal_level=logical", "-c", "max_replication_slots=64", "-c", "max_wal_senders=64",
		"-c", "max_connections=200", "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"}
	for _, s := range settings {
		cmd = append(cmd, "-c", s)
	}
	c, err := tcpostgres.Run(ctx, postgresImage,
		tcpostgres.WithDatabase("postgres"), tcpostgres.WithUsername("postgres"), tcpostgres.WithPassword("postgres"),
		testcontainers.WithCmd(cmd...), tcpostgres.BasicWaitStrategies())
	if err != nil {
		return nil, started{}, fmt.Errorf("start %s: %w", postgresImage, err)
	}
	u, err := c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		testcontainers.TerminateContainer(c)
		return nil, started{}, err
	}
	return c, started{URL: u, Image: postgresImage}, nil
}

func runKafka(ctx context.Context) (testcontainers.Container, started, error) {
	c, err := tckafka.Run(ctx, kafkaImage, tckafka.WithClusterID("outbox-cdc-test"))
	if err != nil {
		return nil, started{}, fmt.Errorf("start %s: %w", kafkaImage, err)
	}
	brokers, err := c.Brokers(ctx)
	if err != nil {
		testcontainers.TerminateContainer(c)
		return nil, started{}, err
	}
	return c, started{Brokers: brokers, Image: kafkaImage}, nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "containers:", err)
	os.Exit(1)
}
