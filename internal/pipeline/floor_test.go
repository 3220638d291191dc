package pipeline_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/testenv"
)

// steadyWriter writes total events on conn at rate events/s, in per-row
// transactions: every 10 ms the rows due by then, one transaction each
// (fill_tx), from start. It calls warm once the first second, the
// warm-up, has passed, sets *wrote to the time the writes took, and
// sends nil, or the first error, when it is done.
func steadyWriter(conn *pgx.Conn, rate, per, total int, start time.Time, warm func(), wrote *time.Duration) <-chan error {
	done := make(chan error, 1)
	warmEnd := start.Add(time.Second)
	go func() {
		written, warmed := 0, false
		for t := time.NewTicker(10 * time.Millisecond); written < total; <-t.C {
			if !warmed && time.Now().After(warmEnd) {
				warmed = true
				if warm != nil {
					warm()
				}
			}
			due := min(total, int(time.Since(start).Seconds()*float64(rate))+per)
			due -= due % per
			if due > written {
				if _, err := conn.Exec(context.Background(), fmt.Sprintf("CALL fill_tx(%d, %d)", due-written, per)); err != nil {
					done <- err
					return
				}
				written = due
			}
		}
		*wrote = time.Since(start)
		done <- nil
	}()
	return done
}

// latencyFloor is the floor the connector's commit → visible is held
// to (issue 56): pg_recvlogical alone on a slot of its own, with the same
// writer at the same rate for d, after the connector's run in the same
// database, the connector stopped. Each event's latency is the time its
// transaction's COMMIT line reached us, minus the commit's timestamp
// (test_decoding's include-timestamp): what Postgres's decoding and a
// walsender's send cost before anything of the connector's. The first
// second is warm-up and not counted, as in latencyWith. It returns the
// latencies in ms, sorted.
func latencyFloor(b *testing.B, p *testenv.Postgres, db string, conn *pgx.Conn, rate, per int, d time.Duration) []float64 {
	b.Helper()
	const slot = "latency_floor"
	testenv.Exec(b, db, `SELECT pg_create_logical_replication_slot('`+slot+`', 'test_decoding')`)
	defer func() {
		testenv.Eventually(b, time.Minute, "the floor's slot released", func() bool {
			var active bool
			testenv.QueryRow(b, db, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, []any{slot}, &active)
			return !active
		})
		testenv.Exec(b, db, `SELECT pg_drop_replication_slot('`+slot+`')`)
	}()
	cmd := exec.Command(filepath.Join(p.Bin, "pg_recvlogical"), "-d", db, "--slot", slot, "--start",
		"-o", "include-timestamp=1", "-o", "skip-empty-xacts=1", "-f", "-")
	// The COMMIT lines' timestamps in a zone and style parseFloorTime reads.
	cmd.Env = append(os.Environ(), "PGTZ=UTC", "PGDATESTYLE=ISO")
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	testenv.Eventually(b, time.Minute, "pg_recvlogical to stream", func() bool {
		var active bool
		testenv.QueryRow(b, db, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, []any{slot}, &active)
		return active
	})

	total := rate * int(d/time.Second)
	total -= total % per
	start := time.Now()
	warmEnd := start.Add(time.Second)
	var wrote time.Duration
	writeDone := steadyWriter(conn, rate, per, total, start, nil, &wrote)
	type read struct {
		lat  []float64
		seen int
		err  error
	}
	reads := make(chan read, 1)
	go func() {
		var r read
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		rows := 0
		for r.seen < total && sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "table "):
				rows++
			case strings.HasPrefix(line, "COMMIT "):
				now := time.Now()
				at, err := parseFloorTime(line)
				if err != nil {
					r.err = err
					reads <- r
					return
				}
				if at.After(warmEnd) {
					for range rows {
						r.lat = append(r.lat, float64(now.Sub(at).Microseconds())/1000)
					}
				}
				r.seen += rows
				rows = 0
			}
		}
		if r.seen < total && r.err == nil {
			r.err = fmt.Errorf("pg_recvlogical's output ended after %d of %d events: %v", r.seen, total, sc.Err())
		}
		reads <- r
	}()
	if err := <-writeDone; err != nil {
		b.Fatal(err)
	}
	var r read
	select {
	case r = <-reads:
	case <-time.After(2 * time.Minute):
		b.Fatalf("pg_recvlogical: the floor's events did not all arrive within 2 minutes of the last write")
	}
	if r.err != nil {
		b.Fatal(r.err)
	}
	if len(r.lat) == 0 {
		b.Fatal("pg_recvlogical: no event after the warm-up")
	}
	slices.Sort(r.lat)
	return r.lat
}

// parseFloorTime reads the commit timestamp of test_decoding's line
// "COMMIT 123 (at 2026-12-07 02:00:00.123456+00)".
func parseFloorTime(line string) (time.Time, error) {
	i, j := strings.Index(line, "(at "), strings.LastIndexByte(line, ')')
	if i < 0 || j < i {
		return time.Time{}, fmt.Errorf("pg_recvlogical: a COMMIT line without its timestamp (include-timestamp): %q", line)
	}
	ts := line[i+len("(at ") : j]
	for _, layout := range []string{"2006-01-02 15:04:05.999999-07", "2006-01-02 15:04:05.999999-07:00"} {
		if at, err := time.Parse(layout, ts); err == nil {
			return at, nil
		}
	}
	return time.Time{}, fmt.Errorf("pg_recvlogical: a COMMIT line's timestamp %q is not in ISO style", ts)
}

// TestParseFloorTime: the floor reads test_decoding's commit timestamps,
// whole seconds and a zone with minutes included; a line without one is
// an error, not a latency of zero.
func TestParseFloorTime(t *testing.T) {
	for line, want := range map[string]string{
		"COMMIT 740 (at 2026-12-07 02:00:00.123456+00)": "2026-12-07T02:00:00.123456Z",
		"COMMIT 741 (at 2026-12-07 02:00:01+00)":        "2026-12-07T02:00:01Z",
		"COMMIT 742 (at 2026-12-07 07:30:00.5+05:30)":   "2026-12-07T02:00:00.5Z",
	} {
		at, err := parseFloorTime(line)
		if err != nil || at.UTC().Format(time.RFC3339Nano) != want {
			t.Errorf("parseFloorTime(%q) = %v, %v; want %s", line, at.UTC().Format(time.RFC3339Nano), err, want)
		}
	}
	for _, line := range []string{"COMMIT 743", "COMMIT 744 (at yesterday)"} {
		if _, err := parseFloorTime(line); err == nil {
			t.Errorf("parseFloorTime(%q): no error", line)
		}
	}
}
