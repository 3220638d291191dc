package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/testenv"
)

var pg *testenv.Postgres

// env is an environment of these key, value pairs; noEnv is empty.
var (
	env   = config.Map
	noEnv = env()
)

// writeConfig writes body as a config file in a temporary directory.
var writeConfig = testenv.WriteConfig

// TestMain doubles as the cdc binary: with CDC_TEST_EXEC_MAIN=1 the test
// binary runs main's logic, so the tests below can start, SIGKILL and
// SIGTERM real connector processes without a separate build step.
func TestMain(m *testing.M) {
	if os.Getenv("CDC_TEST_EXEC_MAIN") == "1" {
		main()
		return
	}
	testenv.Main(m, &pg)
}

// proc is a connector process.
type proc struct {
	cmd *exec.Cmd
	out *testenv.Buffer
}

func startProc(t *testing.T, config string) *proc {
	t.Helper()
	return startCmd(t, "run", "--config", config)
}

// startCmd runs the cdc binary with args.
func startCmd(t *testing.T, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "CDC_TEST_EXEC_MAIN=1")
	out := &testenv.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, out: out}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		if t.Failed() || os.Getenv("CDC_TEST_SHOW_LOGS") != "" {
			t.Logf("connector output:\n%s", out)
		}
	})
	return p
}

// outboxIDs is the set of event ids the outbox table holds: every
// committed event (a rolled-back row is not there).
func outboxIDs(t *testing.T, db string) map[string]bool {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	rows, _ := conn.Query(context.Background(), `SELECT id::text FROM outbox`)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	return want
}

// outboxConfig writes the config of a connector on the outbox table to a
// file and returns its path: the postgres section's fields (pg, e.g.
// `url: "..."`), the test's topics and checkpoint topic, no endpoint, info
// logs, and extra top-level YAML lines.
func outboxConfig(t *testing.T, kafka *testenv.Kafka, pg, extra string) string {
	t.Helper()
	config := filepath.Join(t.TempDir(), "cdc.yaml")
	err := os.WriteFile(config, []byte(fmt.Sprintf(`
postgres: {%s}
kafka: {brokers: [%s]}
tables: [{name: outbox, topic: %q}]
checkpoint: {topic: %s}
http: {listen: ""}
log: {level: info}
%s
`, pg, strings.Join(kafka.Brokers, ", "), kafka.Prefix+"outbox.event.{aggregate_type}", kafka.CheckpointTopic(), extra)), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	return config
}

// withOptions adds server settings for the connector's sessions to a URL
// (options=-c name=value ...), such as a short wal_sender_timeout.
func withOptions(db, settings string) string {
	sep := "?"
	if strings.Contains(db, "?") {
		sep = "&"
	}
	return db + sep + "options=" + strings.ReplaceAll(strings.ReplaceAll("-c "+settings, " ", "%20"), "=", "%3D")
}

// pacedWriter inserts one event every pace into db's outbox, over 20
// aggregates, until stop is called, which returns its first error. written
// counts the committed events.
func pacedWriter(db string, pace time.Duration) (written *atomic.Int64, stop func() error) {
	written = &atomic.Int64{}
	quit := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		conn, err := pgx.Connect(context.Background(), db)
		if err != nil {
			done <- err
			return
		}
		defer conn.Close(context.Background())
		tick := time.NewTicker(pace) // the writer's pace, not a synchronisation
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-quit:
				done <- nil
				return
			case <-tick.C:
			}
			if _, err := conn.Exec(context.Background(), `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', $1, 'E', $2)`,
				fmt.Sprintf("a-%d", i%20), fmt.Sprintf(`{"i": %d}`, i)); err != nil {
				done <- err
				return
			}
			written.Add(1)
		}
	}()
	return written, func() error { close(quit); return <-done }
}

func slotActive(t *testing.T, db string) bool {
	var active bool
	// Slot names are the cluster's: tests of other databases have slots
	// of the same name.
	testenv.QueryRow(t, db, `SELECT coalesce((SELECT active FROM pg_replication_slots WHERE slot_name = 'outbox_cdc' AND database = current_database()), false)`, nil, &active)
	return active
}

// TestKillMidStreamAndRestart stops the connector with SIGKILL while
// events flow, without any flush, and starts it again. No event is lost,
// and any duplicate belongs to a transaction the slot had not confirmed.
// Then SIGTERM shuts it down cleanly with exit code 0.
func TestKillMidStreamAndRestart(t *testing.T) {
	// At least this many events; the writer goes on past it until the
	// kill, so the kill always lands mid-stream whatever the relative
	// speed of writer and connector (on a loaded 2-core CI box the
	// writer once finished first).
	const total = 20000
	p := testenv.Require(t, pg)
	db := p.NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`)
	kafka := testenv.NewKafka(t)
	config := filepath.Join(t.TempDir(), "cdc.yaml")
	writeErr := os.WriteFile(config, []byte(fmt.Sprintf(`
postgres:
  url: %q
  status_interval: 50ms
kafka:
  brokers: [%s]
tables:
  - name: outbox
    topic: %s
checkpoint:
  topic: %s
http:
  listen: "127.0.0.1:0"
log:
  level: info
`, db, strings.Join(kafka.Brokers, ", "), kafka.Prefix+"outbox.event.{aggregate_type}", kafka.CheckpointTopic())), 0o600)
	if writeErr != nil {
		t.Fatal(writeErr)
	}

	first := startProc(t, config)
	testenv.Eventually(t, 30*time.Second, "the connector to hold the slot", func() bool { return slotActive(t, db) })

	// One writer commits 1-3 row transactions for 50 aggregates, with a
	// per-aggregate sequence in the payload.
	var mu sync.Mutex
	written := 0
	killed := make(chan struct{})
	writerDone := make(chan error, 1)
	go func() {
		conn, err := pgx.Connect(context.Background(), db)
		if err != nil {
			writerDone <- err
			return
		}
		defer conn.Close(context.Background())
		seq := map[int]int{}
		for i := 0; ; {
			if i >= total {
				select {
				case <-killed:
					writerDone <- nil
					return
				default:
				}
			}
			batch := &pgx.Batch{}
			n := 1 + i%3
			for j := 0; j < n; j++ {
				agg := i % 50
				seq[agg]++
				batch.Queue(`INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', $1, 'E', $2)`,
					fmt.Sprintf("a-%02d", agg), fmt.Sprintf(`{"seq": %d}`, seq[agg]))
				i++
			}
			// A batch runs in one implicit transaction.
			if err := conn.SendBatch(context.Background(), batch).Close(); err != nil {
				writerDone <- err
				return
			}
			mu.Lock()
			written = i
			mu.Unlock()
		}
	}()

	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.WaitCount(t, time.Minute, 1000)
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first.cmd.Wait()
	close(killed)
	// The process is gone: nothing can move the slot until the restart.
	confirmedAtKill := testenv.SlotPosition(t, db, "outbox_cdc")
	mu.Lock()
	writtenAtKill := written
	mu.Unlock()
	t.Logf("killed with %d events written, %d read from kafka, slot at %s", writtenAtKill, len(c.Records), confirmedAtKill)

	// The walsender of the killed process may still hold the slot; the
	// new process waits it out.
	second := startProc(t, config)
	if err := <-writerDone; err != nil {
		t.Fatal(err)
	}
	want := outboxIDs(t, db)
	mu.Lock()
	wrote := written
	mu.Unlock()
	if len(want) != wrote || wrote < total {
		t.Fatalf("outbox holds %d rows, want the %d written (at least %d)", len(want), wrote, total)
	}
	seen := func(recs []*kgo.Record) map[string]int {
		m := map[string]int{}
		for _, r := range recs {
			m[testenv.Header(r, route.HeaderID)]++
		}
		return m
	}
	c.WaitFor(t, 2*time.Minute, "every event after the restart", func(recs []*kgo.Record) bool {
		got := seen(recs)
		for id := range want {
			if got[id] == 0 {
				return false
			}
		}
		return true
	})
	// Every duplicate the restart makes is in Kafka once the slot
	// confirmed the writes, and read before they are counted.
	c.SettleConfirmed(t, 30*time.Second, db, "outbox_cdc")

	dups := 0
	firstSeq := map[string]int{}
	counts := seen(c.Records)
	for _, r := range c.Records {
		id := testenv.Header(r, route.HeaderID)
		if !want[id] {
			t.Fatalf("record for unknown event %s", id)
		}
		if n := counts[id]; n > 1 {
			dups++
			commit, err := pglogrepl.ParseLSN(testenv.Header(r, route.HeaderCommitLSN))
			if err != nil {
				t.Fatal(err)
			}
			// A confirmed transaction ends at or before the slot's
			// position, so its commit record starts before it.
			if commit < confirmedAtKill {
				t.Fatalf("event %s (commit %s) delivered %d times, but its transaction was confirmed (slot at %s)", id, commit, n, confirmedAtKill)
			}
		}
		// Duplicates replay a suffix; first deliveries stay in order.
		var seq int
		fmt.Sscanf(string(r.Value), `{"seq": %d}`, &seq)
		if seq > firstSeq[string(r.Key)] {
			if seq != firstSeq[string(r.Key)]+1 {
				t.Fatalf("aggregate %s: first delivery of seq %d after %d", r.Key, seq, firstSeq[string(r.Key)])
			}
			firstSeq[string(r.Key)] = seq
		}
	}
	t.Logf("%d records for %d events; %d records are re-deliveries of unconfirmed transactions", len(c.Records), wrote, dups)

	if err := second.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := second.cmd.Wait(); err != nil {
		t.Fatalf("connector exited with %v after SIGTERM; want exit code 0", err)
	}
	if !strings.Contains(second.out.String(), "stopped") {
		t.Fatalf("no shutdown line in the log:\n%s", second.out)
	}
}

// TestFatalConfigExitCodes: configuration and precondition errors exit
// non-zero with a message that says what to do.
func TestFatalConfigExitCodes(t *testing.T) {
	p := testenv.Require(t, pg)
	db := p.NewDatabase(t)
	kafka := testenv.NewKafka(t)
	var out bytes.Buffer
	code := run(context.Background(), []string{"run"}, env("CDC_POSTGRES_URL", db, "CDC_KAFKA_BROKERS", strings.Join(kafka.Brokers, ","), "CDC_HTTP_LISTEN", ""), &out, &out)
	if code != 1 || !strings.Contains(out.String(), "outbox table public.outbox does not exist") {
		t.Fatalf("exit %d, output:\n%s\nwant exit 1 naming the missing table", code, out.String())
	}
	out.Reset()
	if code := run(context.Background(), []string{"run", "--config", "/nonexistent.yaml"}, noEnv, &out, &out); code != 2 {
		t.Fatalf("missing config file: exit %d, want 2", code)
	}
}

// TestDemo runs `cdc demo` as make demo does: its own throwaway Postgres
// and embedded broker. Every event written is delivered, the summary
// reports it, and everything is cleaned up.
func TestDemo(t *testing.T) {
	testenv.Require(t, pg) // the demo starts its own server from the same binaries
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"demo", "--duration", "2s", "--rate", "50"}, noEnv, &out, &errOut)
	if code != 0 {
		t.Fatalf("demo exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
	var written, delivered int
	for _, line := range strings.Split(out.String(), "\n") {
		fmt.Sscanf(strings.TrimSpace(line), "events written: %d", &written)
		fmt.Sscanf(strings.TrimSpace(line), "events delivered: %d", &delivered)
	}
	if written < 20 || delivered != written {
		t.Fatalf("written %d, delivered %d; want every event delivered\n%s", written, delivered, out.String())
	}
	var replayed int
	for _, line := range strings.Split(out.String(), "\n") {
		fmt.Sscanf(line, "replayed %d events", &replayed)
	}
	if replayed != written {
		t.Fatalf("the demo replayed %d events, want the %d written\n%s", replayed, written, out.String())
	}
	for _, want := range []string{"commit -> ack:      p50", "slot confirmed at:  0/", "cleaned up"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "\x1b[") {
		t.Errorf("ANSI escapes in non-terminal output:\n%q", out.String())
	}
}
