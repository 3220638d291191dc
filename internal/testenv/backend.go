package testenv

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tckafka "github.com/testcontainers/testcontainers-go/modules/kafka"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/outboxcdc/cdc/internal/localpg"
)

// The one place that chooses how the integration tests get Postgres and
// Kafka. In order:
//
//  1. CDC_TEST_POSTGRES_URL / CDC_TEST_KAFKA_BROKERS: servers someone else
//     runs (make test-kafka sets the Kafka one).
//  2. CDC_TEST_BACKEND=local or =testcontainers, if set.
//  3. testcontainers-go when a Docker engine answers, else local
//     processes: initdb/pg_ctl for Postgres and in-process kfake for Kafka.
//
// Main prints the choice, so every test run says which path it used.

const (
	backendLocal      = "local"
	backendContainers = "testcontainers"
)

var backendOnce = sync.OnceValue(func() string {
	switch b := os.Getenv("CDC_TEST_BACKEND"); b {
	case backendLocal, backendContainers:
		return b
	case "":
	default:
		fmt.Fprintf(os.Stderr, "testenv: CDC_TEST_BACKEND=%q is neither local nor testcontainers; using local\n", b)
		return backendLocal
	}
	if dockerReachable() {
		return backendContainers
	}
	return backendLocal
})

// Backend returns "local" or "testcontainers".
func Backend() string { return backendOnce() }

// dockerReachable reports whether a Docker engine answers /_ping on
// DOCKER_HOST or the default socket. The docker CLI alone is not enough.
func dockerReachable() bool {
	network, addr := "unix", "/var/run/docker.sock"
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		u, err := url.Parse(h)
		if err != nil {
			return false
		}
		switch u.Scheme {
		case "unix":
			addr = u.Path
		case "tcp":
			network, addr = "tcp", u.Host
		default:
			return false
		}
	}
	cl := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
	}}
	resp, err := cl.Get("http://docker/_ping")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// postgresImage is the server the testcontainers path runs.
const postgresImage = "postgres:17"

func startPostgres(settings ...string) (*Postgres, error) {
	if Backend() == backendLocal {
		srv, err := localpg.Start(settings...)
		if err != nil {
			return nil, err
		}
		return &Postgres{URL: srv.URL, Bin: srv.Bin, stop: srv.Stop, crash: srv.Crash, down: srv.StopKeep, up: srv.StartAgain, backup: srv.Backup, restore: srv.Restore, Via: "local initdb/pg_ctl from " + srv.Bin}, nil
	}
	cmd := []string{"postgres", "-c", "wal_level=logical", "-c", "max_replication_slots=64", "-c", "max_wal_senders=64",
		"-c", "max_connections=200", "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"}
	for _, s := range settings {
		cmd = append(cmd, "-c", s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := tcpostgres.Run(ctx, postgresImage,
		tcpostgres.WithDatabase("postgres"), tcpostgres.WithUsername("postgres"), tcpostgres.WithPassword("postgres"),
		testcontainers.WithCmd(cmd...), tcpostgres.BasicWaitStrategies())
	if err != nil {
		return nil, fmt.Errorf("start %s with testcontainers: %w", postgresImage, err)
	}
	u, err := c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		testcontainers.TerminateContainer(c)
		return nil, err
	}
	return &Postgres{URL: u, stop: func() { testcontainers.TerminateContainer(c) }, Via: "testcontainers " + postgresImage}, nil
}

// kafkaImage is the broker the testcontainers path runs; the kafka module
// of testcontainers-go supports confluent-local.
const kafkaImage = "confluentinc/confluent-local:7.5.0"

var containerKafka struct {
	once    sync.Once
	brokers []string
	stop    func()
	err     error
}

// sharedContainerKafka starts one broker container for the test binary.
func sharedContainerKafka() ([]string, error) {
	containerKafka.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		c, err := tckafka.Run(ctx, kafkaImage, tckafka.WithClusterID("outbox-cdc-test"))
		if err != nil {
			containerKafka.err = fmt.Errorf("start %s with testcontainers: %w", kafkaImage, err)
			return
		}
		containerKafka.stop = func() { testcontainers.TerminateContainer(c) }
		containerKafka.brokers, containerKafka.err = c.Brokers(ctx)
	})
	return containerKafka.brokers, containerKafka.err
}

// kafkaVia says where NewKafka's brokers come from.
func kafkaVia() string {
	switch {
	case External():
		return "external brokers " + strings.TrimSpace(os.Getenv("CDC_TEST_KAFKA_BROKERS"))
	case Backend() == backendContainers:
		return "testcontainers " + kafkaImage
	default:
		return "in-process kfake"
	}
}

// Describe says where the tests' Postgres and Kafka will come from, without
// starting them.
func Describe() (postgres, kafka string) {
	switch {
	case os.Getenv("CDC_TEST_POSTGRES_URL") != "":
		postgres = "CDC_TEST_POSTGRES_URL"
	case Backend() == backendContainers:
		postgres = "testcontainers " + postgresImage
	default:
		postgres = "local initdb/pg_ctl"
		if bin, err := localpg.FindBinaries(); err == nil {
			postgres += " from " + bin
		} else {
			postgres += " (not found: the integration tests will fail; run make setup)"
		}
	}
	return postgres, kafkaVia()
}
