package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/mattn/go-isatty"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/delivery"
	"github.com/outboxcdc/cdc/internal/demo"
	"github.com/outboxcdc/cdc/internal/endpoint"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/ops"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/replay"
	"github.com/outboxcdc/cdc/internal/setup"
)

// memoryHeadroom is what cdc run allows the heap beyond max_in_flight_bytes
// in its soft memory limit: the decoder, franz-go's buffers and batches,
// the metrics.
const memoryHeadroom = 40 << 20

// gcSettings is what cdc run gives Go's collector, unless the environment
// does (GOMEMLIMIT: nothing); 0 leaves a setting alone. GOGC stays Go's
// (100, or the environment's).
//
// The records waiting for Kafka are bounded by max_in_flight_bytes; by
// default Go lets the heap grow to twice what is live before collecting,
// so a stall with large payloads would double them. A soft limit of that
// bound plus room for the rest makes the collector work harder instead
// (docs/config.md). GOGC stays Go's default: docs/benchmarks.md, "Memory
// and GOGC", has what a higher one trades.
func gcSettings(maxInFlightBytes int64, getenv func(string) string) (limit int64, percent int) {
	if getenv("GOMEMLIMIT") != "" {
		return 0, 0
	}
	return maxInFlightBytes + memoryHeadroom, 0
}

// liveProcs is what cdc run does with GOMAXPROCS as its stream turns
// live and falls behind (postgres.Config.OnLive), or nil to leave it alone: when
// the environment sets it, or the runtime's default is one already (a
// container with a CPU limit of one core or less).
//
// A live stream's work is one sequence: read, decode, route, produce,
// acknowledge, each step handing to the next goroutine. With a second P,
// every hand-off woke another thread to steal the work, and on a small or
// virtual machine those wake-ups cost more than the work: at 40,000
// events a second one P took a sixth less CPU and kept p99 lower
// (docs/benchmarks.md, "Where the time goes"). A stream behind has a
// backlog to drain, where franz-go's encoding and writing on a second P
// beside the decoding is worth it: there the runtime's default comes back.
// The switch stops the world for microseconds, and happens only when the
// stream changes state, at most once per transaction and in practice a
// few times a session (the state has a margin: wal's liveAfter).
func liveProcs(getenv func(string) string, defaultProcs int) func(live bool) {
	if getenv("GOMAXPROCS") != "" || defaultProcs <= 1 {
		return nil
	}
	return func(live bool) {
		if live {
			runtime.GOMAXPROCS(1)
		} else {
			runtime.SetDefaultGOMAXPROCS()
		}
	}
}

func runCmd(ctx context.Context, c *cli, args []string) int {
	fs := c.flags("run", "[--config cdc.yaml]")
	file := fs.String("config", "", "the YAML config file (docs/config.md); without it, the environment and defaults")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	p, log, code, ok := c.pipeline(*file, func(cfg *config.Config, o *pipeline.Options) {
		cfg.Postgres.OnLive = liveProcs(os.Getenv, runtime.GOMAXPROCS(0))
		// A session that streams has connected, read the checkpoint and
		// checked the topics: code the stream does not run again. Off
		// the stream's goroutine, which OnSession must not block.
		o.OnSession = func(*delivery.Tracker) { go dropStartPages() }
	})
	if !ok {
		return code
	}
	cfg := p.Config()
	log.Info("starting", "version", version, "slot", cfg.Postgres.Slot, "tables", len(cfg.Tables))
	for _, w := range append(p.Weaknesses(), c.weak...) {
		log.Warn("insecure setting: " + w)
	}
	if limit, percent := gcSettings(cfg.MaxInFlightBytes, os.Getenv); limit > 0 {
		debug.SetMemoryLimit(limit)
		if percent > 0 {
			debug.SetGCPercent(percent)
		}
	}
	if c.http.Listen != "" {
		srv, err := endpoint.Start(c.http, p.Metrics().Registry, p)
		if err != nil {
			return c.usageErr("%v", err)
		}
		defer srv.Close()
		log.Info("serving /metrics, /healthz and /readyz", "addr", "http://"+srv.Addr(), "metrics_token", c.http.Token != "" || c.http.TokenFile != "")
	}
	if err := p.Run(ctx); err != nil {
		log.Error("stopped on a fatal error", "error", errtext.OneLine(err))
		return 1
	}
	return 0
}

func checkCmd(ctx context.Context, c *cli, args []string) int {
	fs := c.flags("check", "[--config cdc.yaml] [--offline]")
	config := fs.String("config", "", "the YAML config file (docs/config.md)")
	offline := fs.Bool("offline", false, "validate the config only, without connecting")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	p, _, code, ok := c.pipeline(*config)
	if !ok {
		return code
	}
	cfg := p.Config()
	if *offline {
		fmt.Fprintf(c.stdout, "config OK: %d outbox table(s), slot %s, publication %s\n", len(cfg.Tables), cfg.Postgres.Slot, cfg.Postgres.Publication)
		printWeaknesses(c, p)
		return 0
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	warnings, err := p.Ops().Check(ctx)
	printWarnings := func() {
		if len(warnings) > 0 {
			fmt.Fprintf(c.stdout, "warnings (cdc run works, but less well than it could):\n")
			for _, w := range warnings {
				fmt.Fprintf(c.stdout, "  - %s\n", w)
			}
		}
	}
	if err != nil {
		var ce *setup.CheckError
		if !errors.As(err, &ce) {
			fmt.Fprintf(c.stderr, "cdc: %v\n", err)
			return 1
		}
		fmt.Fprintf(c.stderr, "cdc: check found %d problem(s) that would stop cdc run:\n", len(ce.Problems))
		for _, pr := range ce.Problems {
			fmt.Fprintf(c.stderr, "  - %s\n", pr)
		}
		printWarnings()
		printWeaknesses(c, p)
		return 1
	}
	fmt.Fprintln(c.stdout, "postgres and kafka OK: cdc run has what it needs")
	printWarnings()
	printWeaknesses(c, p)
	return 0
}

// printWeaknesses lists insecure settings after cdc check's verdict: they
// do not stop cdc run, but an attacker on the network could use them.
func printWeaknesses(c *cli, p *pipeline.Pipeline) {
	if ws := append(p.Weaknesses(), c.weak...); len(ws) > 0 {
		fmt.Fprintf(c.stdout, "insecure settings (cdc run works, but the network can read or tamper):\n")
		for _, w := range ws {
			fmt.Fprintf(c.stdout, "  - %s\n", w)
		}
	}
}

// rangeFlags are the --from-*/--to-* flags of replay and rewind.
type rangeFlags struct {
	fromLSN, toLSN, fromTime, toTime *string
}

func (r rangeFlags) parse() (replay.Range, error) {
	var rg replay.Range
	lsn := func(flag, s string, dst *pglogrepl.LSN) error {
		if s == "" {
			return nil
		}
		l, err := pglogrepl.ParseLSN(s)
		if err != nil || l == 0 {
			return fmt.Errorf("--%s %q is not an LSN; write it as Postgres does, for example 0/16B3748", flag, s)
		}
		*dst = l
		return nil
	}
	at := func(flag, s string, dst *time.Time) error {
		if s == "" {
			return nil
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return fmt.Errorf("--%s %q is not an RFC 3339 time, for example 2026-11-22T10:00:00Z", flag, s)
		}
		*dst = t
		return nil
	}
	for _, err := range []error{
		lsn("from-lsn", deref(r.fromLSN), &rg.FromLSN), lsn("to-lsn", deref(r.toLSN), &rg.ToLSN),
		at("from-time", deref(r.fromTime), &rg.FromTime), at("to-time", deref(r.toTime), &rg.ToTime),
	} {
		if err != nil {
			return rg, err
		}
	}
	return rg, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// multi is a repeatable string flag.
type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(s string) error { *m = append(*m, s); return nil }

func replayCmd(ctx context.Context, c *cli, args []string) int {
	fs := c.flags("replay", "--config F (--from-lsn L | --from-time T) [--to-lsn L2 | --to-time T2] [--topic-suffix S] [--table NAME]... [--aggregate-type T]... [--aggregate-id ID]... [--event-type E]...")
	config := fs.String("config", "", "the YAML config file of the pipeline (required)")
	rf := rangeFlags{
		fromLSN:  fs.String("from-lsn", "", "re-send transactions whose commit LSN is at or after this, e.g. 0/16B3748"),
		toLSN:    fs.String("to-lsn", "", "and before this LSN (default: the WAL end when the replay starts)"),
		fromTime: fs.String("from-time", "", "re-send transactions that committed at or after this RFC 3339 time"),
		toTime:   fs.String("to-time", "", "and before this time"),
	}
	suffix := fs.String("topic-suffix", "", "send to each topic with this suffix (e.g. .replay) instead of the topic itself")
	var tables, aggTypes, aggIDs, eventTypes multi
	fs.Var(&tables, "table", "replay only this table (repeatable; as in tables[].name)")
	fs.Var(&aggTypes, "aggregate-type", "replay only events of this aggregate type, the mapped aggregate_type field (repeatable)")
	fs.Var(&aggIDs, "aggregate-id", "replay only events of this aggregate id (repeatable)")
	fs.Var(&eventTypes, "event-type", "replay only events of this type, the mapped event_type field (repeatable)")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	if *config == "" {
		return c.usageErr("replay needs --config: the config of the pipeline whose window to replay from")
	}
	rg, err := rf.parse()
	if err != nil {
		return c.usageErr("%v", err)
	}
	switch {
	case (rg.FromLSN == 0) == rg.FromTime.IsZero():
		return c.usageErr("replay needs one of --from-lsn and --from-time")
	case rg.ToLSN != 0 && !rg.ToTime.IsZero():
		return c.usageErr("use --to-lsn or --to-time, not both")
	case rg.ToLSN != 0 && rg.ToLSN <= rg.FromLSN, !rg.ToTime.IsZero() && !rg.ToTime.After(rg.FromTime):
		return c.usageErr("the range %s is empty: its end must come after its start", rg)
	}
	p, log, code, ok := c.pipeline(*config)
	if !ok {
		return code
	}
	r := replay.Request{Range: rg, TopicSuffix: *suffix, AggregateTypes: aggTypes, AggregateIDs: aggIDs, EventTypes: eventTypes}
	for _, name := range tables {
		t, err := findTable(p.Config().Tables, name)
		if err != nil {
			return c.usageErr("--table %v", err)
		}
		r.Tables = append(r.Tables, t)
	}
	log.Info("replaying", "range", rg.String(), "topic_suffix", *suffix, "tables", tables.String(),
		"aggregate_types", aggTypes.String(), "aggregate_ids", aggIDs.String(), "event_types", eventTypes.String())
	show := newProgressLine(c.stderr)
	sum, err := p.Replay(ctx, r, func(pr replay.Status) {
		show.printf("replay: %d events sent, %d acknowledged; at %s of %s", pr.Events, pr.Acked, pr.At, pr.End)
	})
	show.done()
	if err != nil {
		log.Error("replay failed", "error", errtext.OneLine(err))
		return 1
	}
	fmt.Fprintf(c.stdout, "replayed %d events in %d transactions in %s: %d matched, %d skipped (outside the range, the tables or the filters)\n",
		sum.Events, sum.Transactions, sum.Elapsed.Round(time.Millisecond), sum.Events, sum.Skipped)
	if sum.LeftOut > 0 {
		fmt.Fprintf(c.stdout, "  left out: %d more matched, but their tables' filters leave them out, as the stream does\n", sum.LeftOut)
	}
	if sum.Held > 0 {
		fmt.Fprintf(c.stdout, "  held:    %d more matched, of keys parked before them (cdc parked lists them): not sent, so that none reaches its topic before its key's parked first event; cdc redrive sends them on\n", sum.Held)
	}
	fmt.Fprintf(c.stdout, "  asked:   %s\n  read:    WAL %s to %s\n", rg, sum.Start, sum.End)
	if sum.Transactions > 0 {
		fmt.Fprintf(c.stdout, "  sent:    commit LSN %s to %s, committed %s to %s\n", sum.FirstCommit, sum.LastCommit,
			sum.FirstTime.UTC().Format(time.RFC3339Nano), sum.LastTime.UTC().Format(time.RFC3339Nano))
	}
	return 0
}

func backfillCmd(ctx context.Context, c *cli, args []string) int {
	fs := c.flags("backfill", "--config F --table NAME [--where CONDITION] [--no-wait]")
	config := fs.String("config", "", "the YAML config file of the running pipeline (required)")
	table := fs.String("table", "", "the outbox table, as in tables[].name (required)")
	where := fs.String("where", "", "an SQL condition on the table's columns (default: the table's backfill.where, else every row)")
	noWait := fs.Bool("no-wait", false, "return once the request is made, without following it")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	if *config == "" || *table == "" {
		return c.usageErr("backfill needs --config (the running pipeline's) and --table")
	}
	p, log, code, ok := c.pipeline(*config)
	if !ok {
		return code
	}
	t, err := findTable(p.Config().Tables, *table)
	if err != nil {
		return c.usageErr("--table %v", err)
	}
	cond := *where
	if !isSet(fs, "where") && t.Backfill != nil {
		cond = t.Backfill.Where
	}
	req, err := p.Ops().RequestBackfill(ctx, t, cond)
	if err != nil {
		log.Error("backfill not started", "error", errtext.OneLine(err))
		return 1
	}
	fmt.Fprintf(c.stdout, "requested backfill %s of %s: %d rows match %s\n", req.ID, req.Table, req.Rows, orAll(req.Where))
	if *noWait {
		fmt.Fprintln(c.stdout, "the connector runs it; cdc status shows its progress")
		return 0
	}
	show := newProgressLine(c.stderr)
	started := time.Now()
	job, err := p.Ops().WatchBackfill(ctx, req, func(j checkpoint.Job) {
		if j.ID == "" {
			if time.Since(started) > 5*time.Second {
				show.printf("backfill: waiting for the connector to start it; is cdc run running with this config?")
			}
			return
		}
		show.printf("backfill: %s", progressText(j))
	})
	show.done()
	switch {
	case ctx.Err() != nil:
		fmt.Fprintln(c.stdout, "stopped following; the connector goes on with the backfill, and cdc status shows it")
		return 0
	case err != nil:
		log.Error("backfill failed", "error", errtext.OneLine(err))
		return 1
	}
	fmt.Fprintf(c.stdout, "backfilled %d rows of %s in %s\n", job.Rows, job.Table, job.Finished.Sub(job.Started).Round(time.Millisecond))
	return 0
}

// progressText is a job's progress for a person: rows, share, rate, and
// time left.
func progressText(j checkpoint.Job) string {
	if j.Total == 0 && !j.Done() {
		// Before its first chunk a job knows no total yet.
		return fmt.Sprintf("started, %d rows sent so far", j.Rows)
	}
	s := fmt.Sprintf("%d of %d rows", j.Rows, j.Total)
	if j.Total > 0 {
		s += fmt.Sprintf(" (%d%%)", min(100, j.Rows*100/j.Total))
	}
	if el := time.Since(j.Started); el > time.Second && j.Rows > 0 && !j.Done() {
		rate := float64(j.Rows) / el.Seconds()
		s += fmt.Sprintf(", %.0f rows/s", rate)
		if left := j.Total - j.Rows; left > 0 {
			s += fmt.Sprintf(", about %s left", time.Duration(float64(left)/rate*float64(time.Second)).Round(time.Second))
		}
	}
	if j.Done() {
		s += ", done"
	}
	return s
}

func orAll(where string) string {
	if where == "" {
		return "(every row)"
	}
	return where
}

// isSet reports whether the command line set flag name.
func isSet(fs *flagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// findTable finds a configured table by name, written as in SQL.
func findTable(tables []*outbox.Source, name string) (*outbox.Source, error) {
	tn, err := outbox.ParseTableName(name)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, t := range tables {
		if !t.IsMessage() && t.Name == tn {
			return t, nil
		}
		names = append(names, t.String())
	}
	return nil, fmt.Errorf("%s is not a configured table; the config has %s", tn, strings.Join(names, ", "))
}

func rewindCmd(ctx context.Context, c *cli, args []string) int {
	fs := c.flags("rewind", "--config F (--to-lsn L | --to-time T)")
	config := fs.String("config", "", "the YAML config file of the pipeline (required)")
	toLSN := fs.String("to-lsn", "", "re-deliver from the transaction whose commit LSN is at or after this")
	toTime := fs.String("to-time", "", "re-deliver from the transactions that committed at or after this RFC 3339 time")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	if *config == "" {
		return c.usageErr("rewind needs --config: the config of the pipeline to rewind")
	}
	// The rewind's target is the replay range's start.
	rg, err := rangeFlags{fromLSN: toLSN, fromTime: toTime}.parse()
	if err != nil {
		return c.usageErr("%v", strings.NewReplacer("--from-", "--to-").Replace(err.Error()))
	}
	if (rg.FromLSN == 0) == rg.FromTime.IsZero() {
		return c.usageErr("rewind needs one of --to-lsn and --to-time")
	}
	p, log, code, ok := c.pipeline(*config)
	if !ok {
		return code
	}
	done, err := p.Ops().Rewind(ctx, rg)
	if err != nil {
		log.Error("rewind failed", "error", errtext.OneLine(err))
		return 1
	}
	fmt.Fprintf(c.stdout, "rewound slot %s from %s to %s; the next cdc run re-delivers from there\n", p.Config().Postgres.Slot, done.From, done.To)
	return 0
}

func skipCmd(ctx context.Context, c *cli, args []string) int {
	fs := c.flags("skip", "--config F --lsn L --id ID")
	config := fs.String("config", "", "the YAML config file of the pipeline (required)")
	lsnFlag := fs.String("lsn", "", "the commit LSN of the event's transaction, as the error names it (0/16B3748)")
	id := fs.String("id", "", "the event's id, as the error names it")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	if *config == "" || *lsnFlag == "" || *id == "" {
		return c.usageErr("skip needs --config, --lsn and --id: the connector's error on the event names the last two (outbox event id=\"...\" ... (commit lsn ...))")
	}
	lsn, err := pglogrepl.ParseLSN(*lsnFlag)
	if err != nil {
		return c.usageErr("--lsn %q is not an LSN such as 0/16B3748", *lsnFlag)
	}
	p, log, code, ok := c.pipeline(*config)
	if !ok {
		return code
	}
	topic, err := p.Ops().Skip(ctx, lsn, *id)
	if err != nil {
		log.Error("skip failed", "error", errtext.OneLine(err))
		return 1
	}
	fmt.Fprintf(c.stdout, "the next cdc run sends event %s of the transaction at %s to %s, with why it is invalid, and streams on\n", *id, lsn, topic)
	return 0
}

func resetCmd(ctx context.Context, c *cli, args []string) int {
	fs := c.flags("reset", "--config F --accept-gap")
	config := fs.String("config", "", "the YAML config file of the pipeline")
	accept := fs.Bool("accept-gap", false, "record that events in the gap the connector refused may never be delivered, and let it stream on")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	if !*accept {
		return c.usageErr("reset only accepts a gap, explicitly: add --accept-gap")
	}
	p, log, code, ok := c.pipeline(*config)
	if !ok {
		return code
	}
	a, err := p.Ops().AcceptGap(ctx)
	switch {
	case err != nil:
		log.Error("reset failed", "error", errtext.OneLine(err))
		return 1
	case a.Gap == nil && a.LostSlot:
		fmt.Fprintln(c.stdout, "dropped the lost slot; cdc run creates a new one")
	case a.Gap == nil:
		fmt.Fprintln(c.stdout, "no gap: the slot and the checkpoint agree, nothing to accept")
	default:
		fmt.Fprintf(c.stdout, "accepted the gap: events committed between %s and %s may never be delivered; recorded in the checkpoint. cdc run streams from %s\n", a.From, a.To, a.To)
	}
	return 0
}

// progressLine redraws one line on a terminal, or prints one every two
// seconds otherwise.
type progressLine struct {
	w    io.Writer
	tty  bool
	last time.Time
	drew bool
	// pending is the newest line a log (not a terminal) has not shown
	// yet: done shows it, so the last state is never lost to the pace.
	pending string
}

func newProgressLine(w io.Writer) *progressLine {
	f, ok := w.(*os.File)
	return &progressLine{w: w, tty: ok && isatty.IsTerminal(f.Fd())}
}

func (p *progressLine) printf(format string, args ...any) {
	if p.tty {
		fmt.Fprintf(p.w, "\r\x1b[K"+format, args...)
		p.drew = true
		return
	}
	p.pending = fmt.Sprintf(format, args...)
	if time.Since(p.last) >= 2*time.Second {
		fmt.Fprintln(p.w, p.pending)
		p.last, p.pending = time.Now(), ""
	}
}

func (p *progressLine) done() {
	if p.drew {
		fmt.Fprintln(p.w)
	}
	if p.pending != "" {
		fmt.Fprintln(p.w, p.pending)
		p.pending = ""
	}
}

func statusCmd(ctx context.Context, c *cli, args []string) int {
	fs := c.flags("status", "--config F [--config F2]... [--json]")
	var configs multi
	fs.Var(&configs, "config", "the YAML config file of the pipeline; repeat it, or name a directory of *.yaml files, for one row per pipeline")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	paths, fleet, err := configFiles(configs)
	if err != nil {
		return c.usageErr("%v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if fleet {
		return fleetStatus(ctx, c, paths, *asJSON)
	}
	p, _, code, ok := c.pipeline(paths[0])
	if !ok {
		return code
	}
	st, err := p.Ops().Status(ctx)
	if err != nil {
		fmt.Fprintf(c.stderr, "cdc: status: %v\n", err)
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		enc.Encode(st)
		return 0
	}
	printStatus(c.stdout, st)
	return 0
}

// configFiles expands --config: files as given, a directory to its *.yaml
// and *.yml files in name order. fleet is set for more than one file, or
// a directory: cdc status then prints one row per pipeline.
func configFiles(args []string) (paths []string, fleet bool, err error) {
	if len(args) == 0 {
		return []string{""}, false, nil // the environment alone
	}
	for _, a := range args {
		info, err := os.Stat(a)
		if err != nil {
			return nil, false, fmt.Errorf("--config: %v", err)
		}
		if !info.IsDir() {
			paths = append(paths, a)
			continue
		}
		fleet = true
		entries, err := os.ReadDir(a)
		if err != nil {
			return nil, false, fmt.Errorf("--config: %v", err)
		}
		n := len(paths)
		for _, e := range entries {
			if ext := filepath.Ext(e.Name()); !e.IsDir() && (ext == ".yaml" || ext == ".yml") {
				paths = append(paths, filepath.Join(a, e.Name()))
			}
		}
		if len(paths) == n {
			return nil, false, fmt.Errorf("--config %s: the directory holds no *.yaml or *.yml file", a)
		}
	}
	return paths, fleet || len(paths) > 1, nil
}

// pipelineStatus is one pipeline's row of cdc status over several configs;
// its JSON is an element of cdc status --json's array.
type pipelineStatus struct {
	Pipeline string      `json:"pipeline,omitempty"`
	Config   string      `json:"config"`
	Status   *ops.Status `json:"status,omitempty"`
	Error    string      `json:"error,omitempty"`
}

// fleetStatus reads every pipeline's status at once and prints a row
// each. It exits 1 when any could not be read.
func fleetStatus(ctx context.Context, c *cli, paths []string, asJSON bool) int {
	rows := make([]pipelineStatus, len(paths))
	var wg sync.WaitGroup
	for i, path := range paths {
		rows[i].Config = path
		cfg, _, err := config.Load(path, c.env)
		if err == nil {
			err = cfg.Validate()
		}
		if err != nil {
			rows[i].Error = errtext.OneLine(err)
			continue
		}
		rows[i].Pipeline = cfg.Name
		wg.Add(1)
		go func(r *pipelineStatus) {
			defer wg.Done()
			o := &ops.Ops{Config: cfg, Log: hclog.NewNullLogger(), Version: version}
			st, err := o.Status(ctx)
			if err != nil {
				r.Error = errtext.OneLine(err)
				return
			}
			r.Status = &st
		}(&rows[i])
	}
	wg.Wait()
	failed := slices.ContainsFunc(rows, func(r pipelineStatus) bool { return r.Error != "" })
	if asJSON {
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		enc.Encode(rows)
	} else {
		printFleet(c.stdout, rows)
	}
	if failed {
		return 1
	}
	return 0
}

// printFleet writes one row per pipeline: whether an instance streams, the
// slot's lag and retained WAL, and the checkpoint's age.
func printFleet(w io.Writer, rows []pipelineStatus) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PIPELINE\tSLOT\tSTREAMING\tLAG\tRETAINED WAL\tWAL STATUS\tCHECKPOINT\tCONFIG\tPROBLEM")
	for _, r := range rows {
		name, slot, streaming, lag, retained, walStatus, cp, problem := orDash(r.Pipeline), "—", "—", "—", "—", "—", "—", r.Error
		if st := r.Status; st != nil {
			slot, streaming = st.Slot.Name, "no"
			switch {
			case !st.Slot.Exists:
				streaming = "no slot"
			case st.Slot.Active:
				streaming = fmt.Sprintf("yes, pid %d", st.Slot.ActivePID)
			}
			if st.Slot.Exists {
				lag, retained, walStatus = humanBytes(st.Slot.LagBytes), humanBytes(st.Slot.RetainedBytes), orDash(st.Slot.WALStatus)
			}
			if st.Checkpoint != nil {
				cp = fmt.Sprintf("%s, %s ago", st.Checkpoint.ConfirmedLSN, time.Since(st.Checkpoint.UpdatedAt).Round(time.Second))
			} else {
				problem = st.CheckpointError
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, slot, streaming, lag, retained, walStatus, cp, orDash(r.Config), problem)
	}
	tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// printStatus writes st as aligned "key  value" lines under headings.
func printStatus(w io.Writer, st ops.Status) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	server := fmt.Sprintf("primary, PostgreSQL %d", st.Server.Version)
	if st.Server.Role == "standby" {
		server = fmt.Sprintf("hot standby, PostgreSQL %d", st.Server.Version)
		if d := st.Server.ReplayDelaySeconds; d != nil {
			server += fmt.Sprintf(", last replayed a transaction committed %.1f s ago on the primary", *d)
		}
	}
	fmt.Fprintf(tw, "server\t%s\n", server)
	printSlot(tw, "", "slot", st.Slot)
	pub := st.Publication
	tables := strings.Join(pub.Tables, ", ")
	if !pub.Exists {
		tables = "(does not exist yet: cdc run creates it)"
	}
	fmt.Fprintf(tw, "publication\t%s\n  tables\t%s\n", pub.Name, tables)
	if cp := st.Checkpoint; cp != nil {
		printCheckpoint(tw, cp)
	} else {
		fmt.Fprintf(tw, "checkpoint\t%s\n", st.CheckpointError)
	}
	for _, r := range st.Retention {
		kept := fmt.Sprintf("%d rows kept", r.Rows)
		if r.Oldest != nil {
			kept += ", the oldest from " + r.Oldest.UTC().Format(time.RFC3339)
		}
		if r.Error != "" {
			kept = r.Error
		}
		fmt.Fprintf(tw, "retention\t%s: %s after %s: %s\n", r.Table, r.Mode, r.After, kept)
	}
	if w := st.ReplayWindow; w != nil {
		fmt.Fprintf(tw, "replay window\t%s\n", w.Window)
		from := "—"
		if w.FromLSN != "" {
			from = w.FromLSN
			if w.FromTime != nil {
				from += ", transactions committed from " + w.FromTime.UTC().Format(time.RFC3339)
			}
		}
		fmt.Fprintf(tw, "  replays from\t%s\n", from)
		printSlot(tw, "  ", "replay slot", w.Slot)
	}
	tw.Flush()
}

// printSlot writes a slot's lines of cdc status, indented.
func printSlot(tw io.Writer, indent, title string, s ops.SlotStatus) {
	fmt.Fprintf(tw, "%s%s\t%s\n", indent, title, s.Name)
	indent += "  "
	if !s.Exists {
		fmt.Fprintf(tw, "%sexists\tno\n", indent)
		return
	}
	active := "no"
	if s.Active {
		active = fmt.Sprintf("yes, pid %d", s.ActivePID)
	}
	walStatus := s.WALStatus
	if s.LostCause != "" {
		walStatus += " (" + s.InvalidationReason + ": " + s.LostCause + ")"
	}
	fmt.Fprintf(tw, "%[1]sactive\t%[2]s\n%[1]sconfirmed lsn\t%[3]s\n%[1]srestart lsn\t%[4]s\n%[1]swal status\t%[5]s\n", indent, active, s.ConfirmedLSN, s.RestartLSN, walStatus)
	safe := "unlimited (max_slot_wal_keep_size = -1)"
	if s.SafeWALBytes != nil {
		safe = humanBytes(*s.SafeWALBytes)
	}
	fmt.Fprintf(tw, "%[1]ssafe wal size\t%[2]s\n%[1]slag\t%[3]s (%[4]d bytes behind %[5]s)\n%[1]sretained wal\t%[6]s (%[7]d bytes)\n",
		indent, safe, humanBytes(s.LagBytes), s.LagBytes, s.WALEnd, humanBytes(s.RetainedBytes), s.RetainedBytes)
}

// printCheckpoint writes the checkpoint's lines of cdc status.
func printCheckpoint(tw io.Writer, cp *ops.CheckpointStatus) {
	commit := cp.CommitLSN
	if cp.CommitTime != nil {
		commit += ", committed " + cp.CommitTime.UTC().Format(time.RFC3339Nano)
	}
	fmt.Fprintf(tw, "checkpoint\t%s\n  confirmed lsn\t%s\n  last commit\t%s\n  updated\t%s (%s ago)\n",
		cp.Topic, cp.ConfirmedLSN, commit, cp.UpdatedAt.UTC().Format(time.RFC3339), time.Since(cp.UpdatedAt).Round(time.Second))
	for _, h := range cp.History {
		fmt.Fprintf(tw, "  %s\t%s to %s at %s: %s\n", h.Kind, h.From, h.To, h.At.UTC().Format(time.RFC3339), h.Reason)
	}
	for _, b := range cp.Backfills {
		state := progressText(b)
		if b.Error != "" {
			state += ": failed: " + b.Error
		}
		fmt.Fprintf(tw, "  backfill %s\t%s where %s: %s\n", b.ID, b.Table, orAll(b.Where), state)
	}
	if n := len(cp.Parked); n > 0 {
		fmt.Fprintf(tw, "  parked keys\t%d (cdc parked lists them, cdc redrive sends them on)\n", n)
	}
}

// humanBytes writes n in binary units.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// probeCmd asks a running connector's endpoint whether it is healthy or
// ready, for probes that can only run a command: a distroless image has no
// curl, and docker compose's healthcheck runs inside the container.
func probeCmd(ctx context.Context, c *cli, args []string) int {
	fs := c.flags("probe", "[--ready] [--addr host:port]")
	ready := fs.Bool("ready", false, "ask /readyz (this instance streams) instead of /healthz (the process is alive)")
	addr := fs.String("addr", config.DefaultListen, "the connector's http.listen")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	path := "/healthz"
	if *ready {
		path = "/readyz"
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+*addr+path, nil)
	if err != nil {
		return c.usageErr("probe: --addr %q: %v", *addr, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintf(c.stderr, "cdc: probe %s: %v\n", path, err)
		return 1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	msg := strings.TrimSpace(string(body))
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(c.stderr, "cdc: probe %s: %s\n", path, msg)
		return 1
	}
	fmt.Fprintf(c.stdout, "%s: %s\n", path, msg)
	return 0
}

func demoCmd(ctx context.Context, c *cli, args []string) int {
	fs := c.flags("demo", "[--duration 15s] [--rate 25]")
	duration := fs.Duration("duration", 15*time.Second, "how long the order service writes")
	rate := fs.Int("rate", 25, "business transactions per second")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	return demo.Run(ctx, *duration, *rate, c.env.Get, c.stdout, c.stderr)
}
