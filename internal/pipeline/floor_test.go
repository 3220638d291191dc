package pipeline_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
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
// to (issue 56): pg_recvlogical alone on a slot of its own, with the
// connector's plugin and publication (pgoutput, protocol 1), the same
// writer at the same rate for d, after the connector's run in the same
// database, the connector stopped. Each event's latency is the time its
// transaction's Commit message reached us, minus the commit's timestamp
// in it: what Postgres's decoding and a walsender's send cost before
// anything of the connector's. (test_decoding's text, tried first, cost
// the walsender so much more that its own lag passed the connector's at
// 20k events/s, and reached seconds at 40k.) The first second is warm-up
// and not counted, as in latencyWith. It returns the latencies in ms,
// sorted.
func latencyFloor(b *testing.B, p *testenv.Postgres, db string, conn *pgx.Conn, rate, per int, d time.Duration) []float64 {
	b.Helper()
	const slot = "latency_floor"
	testenv.Exec(b, db, `SELECT pg_create_logical_replication_slot('`+slot+`', 'pgoutput')`)
	defer func() {
		testenv.Eventually(b, time.Minute, "the floor's slot released", func() bool {
			var active bool
			testenv.QueryRow(b, db, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, []any{slot}, &active)
			return !active
		})
		testenv.Exec(b, db, `SELECT pg_drop_replication_slot('`+slot+`')`)
	}()
	cmd := exec.Command(filepath.Join(p.Bin, "pg_recvlogical"), "-d", db, "--slot", slot, "--start",
		"-o", "proto_version=1", "-o", "publication_names=outbox_cdc", "-f", "-")
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
		in := bufio.NewReaderSize(out, 1<<20)
		rows := 0
		for r.seen < total {
			kind, at, err := nextFloorMessage(in)
			if err != nil {
				r.err = fmt.Errorf("pg_recvlogical's output after %d of %d events: %w", r.seen, total, err)
				break
			}
			switch kind {
			case 'I':
				rows++
			case 'C':
				now := time.Now()
				if at.After(warmEnd) {
					for range rows {
						r.lat = append(r.lat, float64(now.Sub(at).Microseconds())/1000)
					}
				}
				r.seen += rows
				rows = 0
			}
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

// pgEpoch is where pgoutput's timestamps count from.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// nextFloorMessage reads one pgoutput message (protocol 1) of
// pg_recvlogical's output, each followed by a newline, and returns its
// kind and, for a Commit, the commit's time. pg_recvlogical writes the
// messages as they are, so each is read by its own layout: a newline can
// be one of its bytes.
func nextFloorMessage(in *bufio.Reader) (kind byte, at time.Time, err error) {
	kind, err = in.ReadByte()
	if err != nil {
		return 0, at, err
	}
	skip := func(n int) {
		if err == nil {
			_, err = in.Discard(n)
		}
	}
	cstring := func() {
		if err == nil {
			_, err = in.ReadBytes(0)
		}
	}
	uint16At := func() int {
		var buf [2]byte
		if err == nil {
			_, err = io.ReadFull(in, buf[:])
		}
		return int(binary.BigEndian.Uint16(buf[:]))
	}
	switch kind {
	case 'B': // final LSN, commit time, xid
		skip(20)
	case 'C': // flags, commit LSN, end LSN, commit time
		skip(17)
		var buf [8]byte
		if err == nil {
			_, err = io.ReadFull(in, buf[:])
		}
		at = pgEpoch.Add(time.Duration(int64(binary.BigEndian.Uint64(buf[:]))) * time.Microsecond)
	case 'R': // relation id, schema, name, replica identity, columns
		skip(4)
		cstring()
		cstring()
		skip(1)
		for n := uint16At(); n > 0 && err == nil; n-- {
			skip(1)
			cstring()
			skip(8)
		}
	case 'Y': // type id, schema, name
		skip(4)
		cstring()
		cstring()
	case 'O': // origin LSN, name
		skip(8)
		cstring()
	case 'I': // relation id, 'N', the tuple
		skip(5)
		for n := uint16At(); n > 0 && err == nil; n-- {
			var col byte
			if col, err = in.ReadByte(); err == nil && col == 't' {
				var buf [4]byte
				if _, err = io.ReadFull(in, buf[:]); err == nil {
					skip(int(binary.BigEndian.Uint32(buf[:])))
				}
			}
		}
	default:
		return kind, at, fmt.Errorf("a pgoutput message of kind %q, which the floor does not read", kind)
	}
	if err == nil {
		var nl byte
		if nl, err = in.ReadByte(); err == nil && nl != '\n' {
			err = fmt.Errorf("pgoutput message %q not followed by a newline: its layout was misread", kind)
		}
	}
	return kind, at, err
}

// TestNextFloorMessage: the floor reads pgoutput's messages as
// pg_recvlogical writes them, a newline after each, newlines inside them
// included, and a Commit's time exactly; a message it does not know, or
// one misread, is an error, not a latency.
func TestNextFloorMessage(t *testing.T) {
	be := binary.BigEndian
	at := time.Date(2026, 12, 7, 2, 0, 0, 123456000, time.UTC)
	var stream []byte
	stream = append(stream, 'B')
	stream = be.AppendUint64(stream, 0x0a0a)
	stream = be.AppendUint64(stream, uint64(at.Sub(pgEpoch).Microseconds()))
	stream = be.AppendUint32(stream, 10)
	stream = append(stream, '\n', 'R')
	stream = be.AppendUint32(stream, 16384)
	stream = append(stream, "public\x00outbox\x00"...)
	stream = append(stream, 'd')
	stream = be.AppendUint16(stream, 2)
	for _, c := range []string{"id", "payload"} {
		stream = append(stream, 1)
		stream = append(stream, c+"\x00"...)
		stream = be.AppendUint32(stream, 25)
		stream = be.AppendUint32(stream, 0xffffffff)
	}
	stream = append(stream, '\n', 'I')
	stream = be.AppendUint32(stream, 16384)
	stream = append(stream, 'N')
	stream = be.AppendUint16(stream, 2)
	stream = append(stream, 't')
	stream = be.AppendUint32(stream, 3)
	stream = append(stream, "a\nb"...)
	stream = append(stream, 'n', '\n', 'C', 0)
	stream = be.AppendUint64(stream, 0x0a)
	stream = be.AppendUint64(stream, 0x0a0a0a)
	stream = be.AppendUint64(stream, uint64(at.Sub(pgEpoch).Microseconds()))
	stream = append(stream, '\n')
	in := bufio.NewReader(bytes.NewReader(stream))
	var kinds []byte
	var commit time.Time
	for {
		kind, when, err := nextFloorMessage(in)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, kind)
		if kind == 'C' {
			commit = when
		}
	}
	if string(kinds) != "BRIC" || !commit.Equal(at) {
		t.Errorf("read %q, commit at %v; want BRIC at %v", kinds, commit, at)
	}
	for _, bad := range [][]byte{{'T', 0, '\n'}, append([]byte{'B'}, make([]byte, 21)...)} {
		if _, _, err := nextFloorMessage(bufio.NewReader(bytes.NewReader(bad))); err == nil || err == io.EOF {
			t.Errorf("nextFloorMessage(%q): %v, want an error", bad, err)
		}
	}
}
