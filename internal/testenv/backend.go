package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/outboxcdc/cdc/internal/localpg"
)

// The one place that chooses how the integration tests get Postgres and
// Kafka. In order:
//
//  1. CDC_TEST_POSTGRES_URL / CDC_TEST_KAFKA_BROKERS: servers someone else
//     runs (make test-kafka sets the Kafka one).
//  2. CDC_TEST_BACKEND=local or =testcontainers, if set.
//  3. testcontainers-go (scripts/containers) when a Docker engine answers, else local
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

// The testcontainers path runs scripts/containers, a module of its own, so
// that testcontainers-go is not a requirement of the connector's module. It
// is built once per test binary; each container lives as long as the child
// process that started it, which removes it when its stdin closes.
var containersBin = sync.OnceValues(func() (string, error) {
	dir, err := repoDir("scripts/containers")
	if err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp("", "cdc-containers-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(tmp, "containers")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build scripts/containers: %v: %s", err, bytes.TrimSpace(out))
	}
	return bin, nil
})

// repoDir finds rel in the repository, walking up from the test's package
// directory.
func repoDir(rel string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, rel, "go.mod")); err == nil {
			return filepath.Join(dir, rel), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("%s not found above the working directory", rel)
		}
		dir = parent
	}
}

// container is one running scripts/containers child.
type container struct {
	URL     string   `json:"url"`
	Brokers []string `json:"brokers"`
	Image   string   `json:"image"`
	stdin   io.Closer
	cmd     *exec.Cmd
}

// runContainer starts scripts/containers with args and waits for the line
// that says where the container listens.
func runContainer(args ...string) (*container, error) {
	bin, err := containersBin()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &container{stdin: stdin, cmd: cmd}
	if err := json.NewDecoder(stdout).Decode(c); err != nil {
		stdin.Close()
		cmd.Wait()
		return nil, fmt.Errorf("start a %s container with testcontainers: %v (its errors are above)", args[0], err)
	}
	return c, nil
}

// stop removes the container and waits for the child.
func (c *container) stop() {
	c.stdin.Close()
	c.cmd.Wait()
}

func startPostgres(settings ...string) (*Postgres, error) {
	if Backend() == backendLocal {
		srv, err := localpg.Start(settings...)
		if err != nil {
			return nil, err
		}
		return &Postgres{URL: srv.URL, Bin: srv.Bin, stop: srv.Stop, crash: srv.Crash, down: srv.StopKeep, up: srv.StartAgain, backup: srv.Backup, restore: srv.Restore, Via: "local initdb/pg_ctl from " + srv.Bin}, nil
	}
	c, err := runContainer(append([]string{"postgres"}, settings...)...)
	if err != nil {
		return nil, err
	}
	return &Postgres{URL: c.URL, stop: c.stop, Via: "testcontainers " + c.Image}, nil
}

var containerKafka struct {
	once    sync.Once
	brokers []string
	image   string
	stop    func()
	err     error
}

// sharedContainerKafka starts one broker container for the test binary.
func sharedContainerKafka() ([]string, error) {
	containerKafka.once.Do(func() {
		c, err := runContainer("kafka")
		if err != nil {
			containerKafka.err = err
			return
		}
		containerKafka.brokers, containerKafka.image, containerKafka.stop = c.Brokers, c.Image, c.stop
	})
	return containerKafka.brokers, containerKafka.err
}

// kafkaVia says where NewKafka's brokers come from.
func kafkaVia() string {
	switch {
	case External():
		return "external brokers " + strings.TrimSpace(os.Getenv("CDC_TEST_KAFKA_BROKERS"))
	case Backend() == backendContainers:
		return "testcontainers (scripts/containers)"
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
		postgres = "testcontainers (scripts/containers)"
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
