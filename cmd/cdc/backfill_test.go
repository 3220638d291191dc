package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// backfillState is a job as cdc status --json shows it.
type backfillState struct {
	ID       string     `json:"id"`
	Rows     int64      `json:"rows"`
	Total    int64      `json:"total"`
	Finished *time.Time `json:"finished_at"`
}

// statusBackfill runs cdc status --json and returns its first backfill.
func statusBackfill(t *testing.T, config string) (backfillState, bool) {
	t.Helper()
	p := startCmd(t, "status", "--config", config, "--json")
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("cdc status: %v: %s", err, p.out)
	}
	var st struct {
		Checkpoint *struct {
			Backfills []backfillState `json:"backfills"`
		} `json:"checkpoint"`
	}
	out := p.out.String()
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &st); err != nil {
		t.Fatalf("cdc status --json: %v: %s", err, out)
	}
	if st.Checkpoint == nil || len(st.Checkpoint.Backfills) == 0 {
		return backfillState{}, false
	}
	return st.Checkpoint.Backfills[0], true
}

// TestBackfillKilledResumes: cdc backfill asks the running connector for
// 50,000 rows committed before its slot; the connector is killed with
// SIGKILL half-way and started again. It resumes from the checkpoint: every
// row arrives, and only the chunks in flight at the kill are sent twice.
//
// Half-way is by construction, not by timing: the backfill's condition
// calls a gate that makes a chunk read wait on an advisory lock the test
// holds once it reaches the upper half of the keys, and the test lets go
// only after the kill. (On a loaded box a 50,000-row backfill once finished
// between two polls of cdc status.)
func TestBackfillKilledResumes(t *testing.T) {
	const rows, chunk = 50000, 200
	const gateLock = 7_212_027
	p := testenv.Require(t, pg)
	db := p.NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`,
		fmt.Sprintf(`INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
		SELECT 'order', 'a-' || (s %% 100), 'E', jsonb_build_object('seq', s) FROM generate_series(1, %d) s`, rows),
		// Only chunk reads wait: they alone end in LIMIT $n (the rows a
		// chunk asks for follow their size). The count and the last key
		// read every row, or the highest first, and would wait before the
		// backfill began.
		fmt.Sprintf(`CREATE FUNCTION public.backfill_gate(id uuid) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
		BEGIN
			IF id >= '80000000-0000-0000-0000-000000000000' AND current_query() LIKE '%%LIMIT $%%' THEN
				PERFORM pg_advisory_xact_lock_shared(%d);
			END IF;
			RETURN true;
		END $$`, gateLock))
	gate, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer gate.Close(context.Background())
	if _, err := gate.Exec(context.Background(), fmt.Sprintf("SELECT pg_advisory_lock(%d)", gateLock)); err != nil {
		t.Fatal(err)
	}
	kafka := testenv.NewKafka(t)
	// As the least-privileged role: the connector and cdc backfill.
	role := testenv.LeastPrivileged(t, db, "outbox", false)
	// The gate stops a chunk at the first key of the upper half only if the
	// read scans in key order: a sort would call it on every row first.
	u, err := url.Parse(role)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Exec(t, db, "ANALYZE outbox", fmt.Sprintf(`ALTER ROLE %s SET enable_seqscan = off`, u.User.Username()),
		fmt.Sprintf(`ALTER ROLE %s SET enable_bitmapscan = off`, u.User.Username()),
		fmt.Sprintf(`ALTER ROLE %s SET enable_sort = off`, u.User.Username()))
	config := filepath.Join(t.TempDir(), "cdc.yaml")
	keyFile := filepath.Join(t.TempDir(), "signing.key")
	if err := os.WriteFile(keyFile, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	write := func(backfill string) {
		err := os.WriteFile(config, []byte(fmt.Sprintf(`
postgres:
  url: %q
  status_interval: 50ms
kafka:
  brokers: [%s]
tables:
  - name: outbox
    topic: %s
%s
checkpoint:
  topic: %s
  signing_key_file: %s
http:
  listen: ""
log:
  level: info
`, role, strings.Join(kafka.Brokers, ", "), kafka.Prefix+"outbox.event.{aggregate_type}", backfill, kafka.CheckpointTopic(), keyFile)), 0o600)
		if err != nil {
			t.Fatal(err)
		}
	}
	// The first start, without a backfill, makes the slot after the rows.
	write("")
	first := startProc(t, config)
	// Streaming, so its checkpoint is saved (the slot is active already
	// while it is being created).
	testenv.Eventually(t, 30*time.Second, "the connector to stream", func() bool {
		return strings.Contains(first.out.String(), "streaming from replication slot")
	})
	first.cmd.Process.Signal(syscall.SIGTERM)
	first.cmd.Wait()
	// In keyset chunks of order_by id: the gate holds a chunk's read (in
	// commit order, one query reads every row at the job's start).
	write(fmt.Sprintf("    backfill: {chunk_size: %d, order_by: id}", chunk))
	second := startProc(t, config)
	testenv.Eventually(t, 30*time.Second, "the connector to hold the slot", func() bool { return slotActive(t, db) })

	const where = "public.backfill_gate(id)"
	req := startCmd(t, "backfill", "--config", config, "--table", "outbox", "--where", where, "--no-wait")
	if err := req.cmd.Wait(); err != nil {
		t.Fatalf("cdc backfill: %v: %s", err, req.out)
	}
	if !strings.Contains(req.out.String(), fmt.Sprintf("%d rows match %s", rows, where)) {
		t.Errorf("cdc backfill said:\n%s\nwant it to count %d rows", req.out, rows)
	}
	testenv.Eventually(t, time.Minute, "a chunk read to wait at the gate", func() bool {
		var waiting int
		testenv.QueryRow(t, db, `SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
			WHERE d.datname = current_database() AND l.locktype = 'advisory' AND NOT l.granted`, nil, &waiting)
		return waiting > 0
	})

	testenv.Eventually(t, time.Minute, "the checkpoint to hold the rows before the gate", func() bool {
		b, ok := statusBackfill(t, config)
		return ok && b.Rows >= rows/5
	})
	if err := second.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	second.cmd.Wait()
	atKill, _ := statusBackfill(t, config)
	if atKill.Finished != nil || atKill.Rows >= rows {
		t.Fatalf("the backfill had finished before the kill (%+v): it did not wait at the gate", atKill)
	}
	// The killed connector's read goes on waiting in its backend; letting
	// go ends it (its client is gone) and lets the restart pass the gate.
	if _, err := gate.Exec(context.Background(), fmt.Sprintf("SELECT pg_advisory_unlock(%d)", gateLock)); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed with %d of %d rows in the checkpoint", atKill.Rows, atKill.Total)

	startProc(t, config)
	testenv.Eventually(t, 2*time.Minute, "the backfill to finish", func() bool {
		b, ok := statusBackfill(t, config)
		return ok && b.Finished != nil
	})
	want := outboxIDs(t, db)
	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.WaitFor(t, time.Minute, "every row", func(recs []*kgo.Record) bool {
		got := map[string]bool{}
		for _, r := range recs {
			got[testenv.Header(r, route.HeaderID)] = true
		}
		return len(got) == len(want)
	})
	c.SettleConfirmed(t, time.Minute, db, "outbox_cdc")
	counts := map[string]int{}
	for _, r := range c.Records {
		id := testenv.Header(r, route.HeaderID)
		if !want[id] {
			t.Fatalf("record for unknown row %s", id)
		}
		counts[id]++
	}
	dups := len(c.Records) - len(want)
	// What was sent after the checkpoint's last chunk and before the kill
	// is sent again: a few chunks, never the whole table.
	if dups > 20*chunk {
		t.Errorf("%d rows sent twice; want at most %d (the chunks after the last checkpoint)", dups, 20*chunk)
	}
	final, _ := statusBackfill(t, config)
	if final.Rows < rows {
		t.Errorf("the finished job counts %d rows, want at least %d", final.Rows, rows)
	}
	t.Logf("%d rows, %d records, %d sent twice; job %+v", len(want), len(c.Records), dups, final)

	// cdc backfill follows a job to its end; one that matches nothing
	// ends at once.
	none := startCmd(t, "backfill", "--config", config, "--table", "outbox", "--where", "payload->>'seq' = 'none'")
	if err := none.cmd.Wait(); err != nil {
		t.Fatalf("cdc backfill: %v: %s", err, none.out)
	}
	if out := none.out.String(); !strings.Contains(out, "0 rows match payload->>'seq' = 'none'") || !strings.Contains(out, "backfilled 0 rows of public.outbox") {
		t.Errorf("cdc backfill said:\n%s", out)
	}
	// A condition that does not work is refused before anything is asked.
	bad := startCmd(t, "backfill", "--config", config, "--table", "outbox", "--where", "seq >")
	if err := bad.cmd.Wait(); err == nil || !strings.Contains(bad.out.String(), `the condition \"seq >\" does not work: syntax error`) {
		t.Errorf("cdc backfill --where 'seq >': %v:\n%s", err, bad.out)
	}
}
