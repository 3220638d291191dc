package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	neturl "net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestUsageErrors: a bad flag, LSN or time exits 2 with one line on
// stderr that says what is wrong; --help exits 0 and prints to stdout.
func TestUsageErrors(t *testing.T) {
	cfg := writeConfig(t, "postgres: {url: 'postgres://u@h/d'}\nkafka: {brokers: [k:1]}\nreplay: {window: 1h}\n")
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"replay", "--config", cfg, "--from-lsn", "xyz"}, 2, `--from-lsn "xyz" is not an LSN; write it as Postgres does, for example 0/16B3748`},
		{[]string{"replay", "--config", cfg, "--from-time", "yesterday"}, 2, `--from-time "yesterday" is not an RFC 3339 time, for example 2026-11-22T10:00:00Z`},
		{[]string{"replay", "--config", cfg}, 2, "replay needs one of --from-lsn and --from-time"},
		{[]string{"replay", "--config", cfg, "--from-lsn", "0/10", "--from-time", "2026-11-22T10:00:00Z"}, 2, "replay needs one of --from-lsn and --from-time"},
		{[]string{"replay", "--config", cfg, "--from-lsn", "0/20", "--to-lsn", "0/10"}, 2, "is empty"},
		{[]string{"replay", "--from-lsn", "0/10"}, 2, "replay needs --config"},
		{[]string{"replay", "--config", cfg, "--from-lsn", "0/10", "--table", "nope"}, 2, "--table public.nope is not a configured table"},
		{[]string{"rewind", "--config", cfg, "--to-lsn", "nope"}, 2, `--to-lsn "nope" is not an LSN`},
		{[]string{"rewind", "--config", cfg}, 2, "rewind needs one of --to-lsn and --to-time"},
		{[]string{"reset", "--config", cfg}, 2, "add --accept-gap"},
		{[]string{"run", "--offline"}, 2, "run: flag provided but not defined: -offline (cdc run --help lists the flags)"},
		{[]string{"check", "extra"}, 2, `check: unexpected argument "extra"`},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(context.Background(), tt.args, noEnv, &out, &errOut)
			if code != tt.code || !strings.Contains(errOut.String(), tt.want) {
				t.Fatalf("exit %d, stderr %q; want exit %d and %q", code, errOut.String(), tt.code, tt.want)
			}
			if first, _, _ := strings.Cut(errOut.String(), "\n"); !strings.Contains(first, tt.want) {
				t.Errorf("the error is not on the first line: %q", errOut.String())
			}
		})
	}
	for _, cmd := range []string{"run", "check", "replay", "rewind", "reset", "demo", "version"} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), []string{cmd, "--help"}, noEnv, &out, &errOut); code != 0 ||
			!strings.Contains(out.String(), "usage: cdc "+cmd) || errOut.Len() != 0 {
			t.Errorf("cdc %s --help: exit %d, stdout %q, stderr %q; want exit 0 and the usage on stdout", cmd, code, out.String(), errOut.String())
		}
		if cmd == "run" && strings.Contains(out.String(), "offline") {
			t.Errorf("cdc run --help lists check's --offline:\n%s", out.String())
		}
	}
	var out bytes.Buffer
	var errOut bytes.Buffer
	if code := run(context.Background(), []string{"version"}, noEnv, &out, &errOut); code != 0 || out.String() != "cdc dev\n" || errOut.Len() != 0 {
		t.Errorf("cdc version: exit %d, stdout %q, stderr %q; want cdc dev on stdout", code, out.String(), errOut.String())
	}
	out.Reset()
	if code := run(context.Background(), []string{"version", "--verbose"}, noEnv, &out, &errOut); code != 0 ||
		!strings.Contains(out.String(), runtime.Version()) || !strings.Contains(out.String(), "  github.com/jackc/pgx/v5 v5.") ||
		!strings.Contains(out.String(), "  github.com/twmb/franz-go v1.") {
		t.Errorf("cdc version --verbose: exit %d, stdout %q; want the Go version and the dependencies", code, out.String())
	}
}

// TestReplayKilledLeavesNoSlot: a replay SIGKILLed half-way leaves no
// replication slot behind: its copy of the replay slot is temporary and
// belongs to its connection.
func TestReplayKilledLeavesNoSlot(t *testing.T) {
	const total = 300_000
	p := testenv.Require(t, pg)
	db := p.NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`)
	kafka := testenv.NewKafka(t)
	config := filepath.Join(t.TempDir(), "cdc.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`
postgres: {url: %q, status_interval: 50ms}
kafka: {brokers: [%s]}
tables: [{name: outbox, topic: %q}]
checkpoint: {topic: %s}
replay: {window: 1h}
http: {listen: "127.0.0.1:0"}
`, db, strings.Join(kafka.Brokers, ", "), kafka.Prefix+"outbox.event.{aggregate_type}", kafka.CheckpointTopic())), 0o600); err != nil {
		t.Fatal(err)
	}
	startProc(t, config)
	testenv.Eventually(t, 30*time.Second, "the replay slot", func() bool { return testenv.SlotPosition(t, db, "outbox_cdc_replay") != 0 })
	from := testenv.CurrentWAL(t, db)
	testenv.Exec(t, db, fmt.Sprintf(`INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
		SELECT 'order', 'a-' || (i %% 100), 'E', jsonb_build_object('i', i) FROM generate_series(1, %d) i`, total))

	replay := startCmd(t, "replay", "--config", config, "--from-lsn", from.String(), "--topic-suffix", ".replay")
	rc := kafka.NewConsumer(t, `.*\.replay$`)
	rc.WaitCount(t, time.Minute, 1)
	if err := replay.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	replay.cmd.Wait()
	if len(rc.Records) >= total {
		t.Fatalf("the replay had finished (%d records) before the kill", len(rc.Records))
	}
	testenv.Eventually(t, 30*time.Second, "the killed replay's slot to go", func() bool {
		var n int
		testenv.QueryRow(t, db, `SELECT count(*) FROM pg_replication_slots WHERE slot_name NOT IN ('outbox_cdc', 'outbox_cdc_replay')`, nil, &n)
		return n == 0
	})
	t.Logf("killed the replay after %d of %d records", len(rc.Records), total)
}

// TestCheckListsProblems: cdc check against a role that cannot run the
// pipeline exits 1 and lists each problem with its fix, one per line; the
// same config passes once they are fixed.
func TestCheckListsProblems(t *testing.T) {
	db := testenv.Require(t, pg).NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`, `DO $$ BEGIN
		IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'cdc_check') THEN CREATE ROLE cdc_check LOGIN; END IF; END $$`,
		`ALTER ROLE cdc_check NOREPLICATION`, `REVOKE pg_read_all_stats FROM cdc_check`) // the server outlives one run of the test (-count)
	u, err := neturl.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	u.User = neturl.User("cdc_check")
	k := testenv.NewKafka(t)
	cfg := writeConfig(t, fmt.Sprintf("postgres: {url: %q, slot: check_slot}\nkafka: {brokers: [%s]}\ncheckpoint: {topic: %s}\n",
		u.String(), strings.Join(k.Brokers, ", "), k.CheckpointTopic()))

	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"check", "--config", cfg}, noEnv, &out, &errOut)
	lines := strings.Split(strings.TrimSpace(errOut.String()), "\n")
	// The grant a standby's takeover needs weakens cdc run, and does not
	// stop it: a warning, on stdout, whose fix is accepted as written.
	if code != 1 || len(lines) < 4 || !strings.HasPrefix(lines[0], "cdc: check found 3 problem(s) that would stop cdc run:") ||
		!strings.Contains(out.String(), "warnings (cdc run works, but less well than it could):\n") ||
		!strings.Contains(out.String(), "\n  - postgres: role cdc_check cannot see when the slot's holder last spoke") ||
		// The test server keeps Postgres' default, which the README says to set.
		!strings.Contains(out.String(), "\n  - postgres: max_slot_wal_keep_size is unlimited (-1)") ||
		!strings.Contains(out.String(), "run: GRANT pg_read_all_stats TO cdc_check (or set standby.takeover_after: 0 to turn takeover off") ||
		!strings.Contains(errOut.String(), "\n  - postgres: role cdc_check lacks the REPLICATION attribute") ||
		!strings.Contains(errOut.String(), "\n  - postgres: role cdc_check may not SELECT from outbox table public.outbox") ||
		!strings.Contains(errOut.String(), "\n  - postgres: publication outbox_cdc does not exist, and role cdc_check may not create it") {
		t.Fatalf("exit %d, stdout:\n%s\nstderr:\n%s\nwant exit 1, the three problems, one per line, and the warning", code, out.String(), errOut.String())
	}
	// The fix the warning offers is a config the connector takes.
	takeoverOff := writeConfig(t, fmt.Sprintf("postgres: {url: %q, slot: check_slot}\nkafka: {brokers: [%s]}\ncheckpoint: {topic: %s}\nstandby: {takeover_after: 0}\n",
		u.String(), strings.Join(k.Brokers, ", "), k.CheckpointTopic()))
	out.Reset()
	errOut.Reset()
	if run(context.Background(), []string{"check", "--config", takeoverOff}, noEnv, &out, &errOut); strings.Contains(out.String(), "pg_read_all_stats") || strings.Contains(errOut.String(), "is not a duration") {
		t.Fatalf("with standby.takeover_after: 0: stdout %q, stderr %q; want the warning gone and the value taken", out.String(), errOut.String())
	}

	testenv.Exec(t, db, `ALTER ROLE cdc_check REPLICATION`, `GRANT SELECT ON outbox TO cdc_check`, `GRANT pg_read_all_stats TO cdc_check`, `CREATE PUBLICATION outbox_cdc FOR TABLE outbox WITH (publish = 'insert')`)
	out.Reset()
	errOut.Reset()
	if code := run(context.Background(), []string{"check", "--config", cfg}, noEnv, &out, &errOut); code != 0 || !strings.Contains(out.String(), "postgres and kafka OK") || strings.Contains(out.String(), "pg_read_all_stats") {
		t.Fatalf("after the fixes: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
}

// TestFatalErrorIsOneLine: a fatal error at start (here a database that
// does not exist) exits 1 at once, and every log entry is one line, in the
// text format and in JSON, where each line is an object.
func TestFatalErrorIsOneLine(t *testing.T) {
	db := testenv.Require(t, pg).NewDatabase(t)
	u, err := neturl.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/no_such_database"
	k := testenv.NewKafka(t)
	for _, format := range []string{"text", "json"} {
		var out, errOut bytes.Buffer
		code := run(context.Background(), []string{"run"}, env("CDC_POSTGRES_URL", u.String(), "CDC_KAFKA_BROKERS", strings.Join(k.Brokers, ","),
			"CDC_LOG_FORMAT", format, "CDC_HTTP_LISTEN", ""), &out, &errOut)
		if code != 1 || !strings.Contains(errOut.String(), `database \"no_such_database\" does not exist (SQLSTATE 3D000): fix the database in postgres.url`) &&
			!strings.Contains(errOut.String(), `database "no_such_database" does not exist (SQLSTATE 3D000): fix the database in postgres.url`) {
			t.Fatalf("%s: exit %d, stderr:\n%s\nwant exit 1 naming the database", format, code, errOut.String())
		}
		for _, l := range strings.Split(strings.TrimSpace(errOut.String()), "\n") {
			var obj map[string]any
			if format == "json" && json.Unmarshal([]byte(l), &obj) != nil || format == "text" && !strings.HasPrefix(l, "20") {
				t.Errorf("%s: a log entry spans lines, or is not an entry: %q", format, l)
			}
		}
	}
}

// TestProgressLineInALog (issue 39): written to a log rather than a
// terminal, the backfill's progress shows its last state when it ends,
// however soon, and a job that has no total yet does not read "0 of 0".
func TestProgressLineInALog(t *testing.T) {
	var b strings.Builder
	p := newProgressLine(&b)
	p.printf("backfill: %s", progressText(checkpoint.Job{ID: "j", Started: time.Now()}))
	p.printf("backfill: %s", progressText(checkpoint.Job{ID: "j", Rows: 2, Total: 2, Started: time.Now(), Finished: time.Now()}))
	p.done()
	out := b.String()
	if strings.Contains(out, "0 of 0") || !strings.Contains(out, "started, 0 rows sent so far") || !strings.HasSuffix(out, "backfill: 2 of 2 rows (100%), done\n") {
		t.Fatalf("progress in a log:\n%s", out)
	}
}

// TestShownEscapesControlCharacters: cdc parked prints keys and topics the
// application chose; one with a control character (an escape sequence a
// terminal would obey) is shown quoted, escaped; others as they are.
func TestShownEscapesControlCharacters(t *testing.T) {
	for in, want := range map[string]string{
		"ord-42":          "ord-42",
		"clé":             "clé",
		"a\x1b[2Jb":       `"a\x1b[2Jb"`,
		"tab\there":       `"tab\there"`,
		"line\nbreak":     `"line\nbreak"`,
		"outbox.event.ok": "outbox.event.ok",
	} {
		if got := shown(in); got != want {
			t.Errorf("shown(%q) = %s, want %s", in, got, want)
		}
	}
}
