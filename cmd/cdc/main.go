package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/outboxcdc/cdc/internal/pipeline"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const usage = `usage:
  cdc run   [--config cdc.yaml]            stream outbox inserts to Kafka until SIGINT/SIGTERM
  cdc check [--config cdc.yaml] [--offline] validate the config; without --offline also
                                           check Postgres and Kafka without streaming
  cdc demo  [--duration 15s] [--rate 25]   see it work: a throwaway Postgres, an embedded
                                           Kafka broker and an order service, all in-process
  cdc version

The environment overrides the file: CDC_POSTGRES_URL, CDC_KAFKA_BROKERS
(comma-separated), CDC_LOG_LEVEL, CDC_LOG_FORMAT. See docs/config.md.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// run is main without the process: it returns the exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, args := args[0], args[1:]
	if cmd == "demo" {
		return demo(ctx, args, getenv, stdout, stderr)
	}
	fs := flag.NewFlagSet("cdc "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "path of the YAML config file")
	offline := fs.Bool("offline", false, "check: validate the config without connecting")
	switch cmd {
	case "version", "--version":
		fmt.Fprintln(stderr, "cdc", version)
		return 0
	case "run", "check":
	case "help", "-h", "--help":
		fmt.Fprint(stderr, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "cdc: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg, lc, err := loadConfig(*configPath, getenv)
	if err != nil {
		fmt.Fprintf(stderr, "cdc: %v\n", err)
		return 2
	}
	log := hclog.New(&hclog.LoggerOptions{
		Name:       "cdc",
		Level:      hclog.LevelFromString(lc.Level),
		JSONFormat: lc.JSON,
		Output:     stderr,
	})

	p, err := pipeline.New(cfg, log, pipeline.Options{})
	if err != nil {
		fmt.Fprintf(stderr, "cdc: %v\n", err)
		return 2
	}
	if cmd == "check" {
		return check(ctx, p, *offline, stderr)
	}
	cfg = p.Config()
	log.Info("starting", "version", version, "slot", cfg.Postgres.Slot, "tables", len(cfg.Tables))
	if err := p.Run(ctx); err != nil {
		log.Error("stopped on a fatal error", "error", err)
		return 1
	}
	return 0
}

// check reports on p's validated config and, unless offline, the
// server-side preconditions, without creating anything.
func check(ctx context.Context, p *pipeline.Pipeline, offline bool, out io.Writer) int {
	cfg := p.Config()
	if offline {
		fmt.Fprintf(out, "config OK: %d outbox table(s), slot %s, publication %s\n", len(cfg.Tables), cfg.Postgres.Slot, cfg.Postgres.Publication)
		return 0
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := p.Check(ctx); err != nil {
		fmt.Fprintf(out, "cdc: %v\n", err)
		return 1
	}
	fmt.Fprintln(out, "postgres and kafka OK")
	return 0
}
