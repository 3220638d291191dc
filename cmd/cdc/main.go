package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/endpoint"
	"github.com/outboxcdc/cdc/internal/pipeline"
)

// version is set at build time with -ldflags "-X main.version=..." (make
// build and the release do), or else is the module version go install
// recorded.
var version = ""

func init() {
	if version == "" {
		version = moduleVersion()
	}
}

// cli is one invocation: where it reads its environment and writes.
type cli struct {
	env            config.Environ
	stdout, stderr io.Writer
	http           endpoint.Config // set by pipeline, from the config
	// weak lists what the config leaves open beyond the pipeline's own
	// settings (config.Log.Weaknesses): the endpoint, secret files.
	weak []string
}

// command is one subcommand.
type command struct {
	summary string
	run     func(ctx context.Context, c *cli, args []string) int
}

var commands map[string]command

func init() {
	commands = map[string]command{
		"run":      {"stream outbox inserts to Kafka until SIGINT/SIGTERM", runCmd},
		"check":    {"check the config, and Postgres and Kafka, without streaming", checkCmd},
		"replay":   {"re-send the transactions of an LSN or time range from the replay window", replayCmd},
		"backfill": {"send a table's existing rows through the running connector, beside its stream", backfillCmd},
		"rewind":   {"move the stopped pipeline back to an LSN or time in the replay window", rewindCmd},
		"reset":    {"accept a gap the connector refused to stream over", resetCmd},
		"skip":     {"send one invalid event the stopped connector stops on to the dead-letter topic, and stream on", skipCmd},
		"parked":   {"list the keys on_invalid: park holds back, with why and how many events wait", parkedCmd},
		"redrive":  {"send a parked key's events on, in order, through the running connector, once the cause is fixed", redriveCmd},
		"status":   {"show the slot, lag, retained WAL, publication, checkpoint and replay window", statusCmd},
		"demo":     {"see it work: a throwaway Postgres, an embedded broker and an order service", demoCmd},
		"probe":    {"ask a running connector's /healthz or /readyz, for health checks that run a command", probeCmd},
		"version":  {"print the version", versionCmd},
	}
}

// envHelp says how the config commands read the environment.
const envHelp = `Environment: every setting outside tables has a variable, CDC_ and its key
in capitals with _ for . (CDC_POSTGRES_URL, CDC_KAFKA_BROKERS comma-separated,
CDC_KAFKA_MAX_BATCH_DELAY, ...), which overrides the config file; the file's
values may use ${VAR} and ${VAR:-default}. CDC_HTTP_LISTEN= (empty) turns the
endpoint off. See docs/config.md.`

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: cdc <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-9s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(w, "\ncdc <command> --help shows a command's flags.\n%s\n", envHelp)
}

func main() {
	// The packages' init functions have run: what they touched of the
	// binary, no command runs again.
	dropStartPages()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr))
}

// run is main without the process: it returns the exit code. 0: done, or a
// clean shutdown; 1: a fatal error at run time; 2: a usage or config error.
func run(ctx context.Context, args []string, env config.Environ, stdout, stderr io.Writer) int {
	c := &cli{env: env, stdout: stdout, stderr: stderr}
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	name, args := args[0], args[1:]
	switch name {
	case "help", "-h", "--help":
		usage(stdout)
		return 0
	case "--version":
		name = "version"
	}
	cmd, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "cdc: unknown command %q\n\n", name)
		usage(stderr)
		return 2
	}
	return cmd.run(ctx, c, args)
}

// flagSet is a command's flags, and its synopsis for the usage.
type flagSet struct {
	*flag.FlagSet
	synopsis string
}

// flags returns the flag set of a command; synopsis follows "cdc name".
func (c *cli) flags(name, synopsis string) *flagSet {
	fs := flag.NewFlagSet("cdc "+name, flag.ContinueOnError)
	// The flag package writes its own error and the usage; parse writes
	// one line instead, and the usage only when asked for.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &flagSet{fs, synopsis}
}

// printUsage writes fs's usage to w.
func printUsage(w io.Writer, fs *flagSet) {
	name := strings.TrimPrefix(fs.Name(), "cdc ")
	fmt.Fprintf(w, "usage: cdc %s %s\n\n%s.\n", name, fs.synopsis, commands[name].summary)
	fs.SetOutput(w)
	if hasFlags(fs.FlagSet) {
		fmt.Fprintln(w, "\nflags:")
		fs.PrintDefaults()
	}
	fs.SetOutput(io.Discard)
	if fs.Lookup("config") != nil {
		fmt.Fprintf(w, "\n%s\n", envHelp)
	}
}

func hasFlags(fs *flag.FlagSet) bool {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n > 0
}

// parse parses args; ok false means return code: 0 after --help (the usage
// on stdout), 2 after a usage error (one line on stderr).
func (c *cli) parse(fs *flagSet, args []string) (code int, ok bool) {
	err := fs.Parse(args)
	name := strings.TrimPrefix(fs.Name(), "cdc ")
	switch {
	case errors.Is(err, flag.ErrHelp):
		printUsage(c.stdout, fs)
		return 0, false
	case err != nil:
		return c.usageErr("%s: %v (cdc %s --help lists the flags)", name, err, name), false
	case fs.NArg() > 0:
		return c.usageErr("%s: unexpected argument %q (cdc %s --help lists the flags)", name, fs.Arg(0), name), false
	}
	return 0, true
}

// usageErr reports a usage error of a command: exit code 2.
func (c *cli) usageErr(format string, args ...any) int {
	fmt.Fprintf(c.stderr, "cdc: "+format+"\n", args...)
	return 2
}

// pipeline loads the config at path, lets each adjust set what a command
// sets beyond it (in the config and the pipeline's options), and makes the
// pipeline, which validates the config. ok false means return code.
func (c *cli) pipeline(path string, adjust ...func(*config.Config, *pipeline.Options)) (p *pipeline.Pipeline, log hclog.Logger, code int, ok bool) {
	cfg, lc, err := config.Load(path, c.env)
	if err != nil {
		return nil, nil, c.usageErr("%v", err), false
	}
	opts := pipeline.Options{ConfigFile: path, Version: version}
	for _, f := range adjust {
		f(&cfg, &opts)
	}
	c.http = lc.HTTP
	c.weak = lc.Weaknesses()
	log = hclog.New(&hclog.LoggerOptions{
		Name:       "cdc",
		Level:      hclog.LevelFromString(lc.Level),
		JSONFormat: lc.JSON,
		Output:     c.stderr,
	})
	p, err = pipeline.New(cfg, log, opts)
	if err != nil {
		return nil, nil, c.usageErr("%v", err), false
	}
	return p, log, 0, true
}

func versionCmd(_ context.Context, c *cli, args []string) int {
	fs := c.flags("version", "[--verbose]")
	verbose := fs.Bool("verbose", false, "also print the Go version and the version of each dependency")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	fmt.Fprintln(c.stdout, "cdc", version)
	if !*verbose {
		return 0
	}
	fmt.Fprintf(c.stdout, "%s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Replace != nil {
				d = d.Replace
			}
			fmt.Fprintf(c.stdout, "  %s %s\n", d.Path, d.Version)
		}
	}
	return 0
}

// moduleVersion is the version go install recorded (cdc@v1.2.3), for a
// binary built without -ldflags "-X main.version=...".
func moduleVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}
