package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/delivery"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/replay"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// newPipeline builds a pipeline on e's config, for the operator commands.
func (e *env) newPipeline(t *testing.T) *pipeline.Pipeline {
	t.Helper()
	p, err := pipeline.New(e.cfg, hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Warn, Output: os.Stderr}), pipeline.Options{ConfigFile: "cdc.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// delivered is one event as the consumer saw it.
type delivered struct {
	id, key, topic string
	commit         pglogrepl.LSN
	at             time.Time
}

func deliveredOf(recs []*kgo.Record) []delivered {
	var out []delivered
	for _, r := range recs {
		lsn, _ := pglogrepl.ParseLSN(testenv.Header(r, route.HeaderCommitLSN))
		out = append(out, delivered{id: testenv.Header(r, route.HeaderID), key: string(r.Key), topic: r.Topic, commit: lsn, at: r.Timestamp})
	}
	return out
}

// commitOf is the commit LSN the records give event id.
func commitOf(recs []*kgo.Record, id string) pglogrepl.LSN {
	for _, d := range deliveredOf(recs) {
		if d.id == id {
			return d.commit
		}
	}
	return 0
}

// writeEvents commits n one-event transactions over keys k-0..k-4 and
// waits until the consumer has seen them; it returns them in commit order.
func writeEvents(t *testing.T, e *env, c *testenv.Consumer, n int, typ string) []string {
	t.Helper()
	conn := testenv.Connect(t, e.db)
	var out []string
	for i := 0; i < n; i++ {
		out = append(out, insertEvent(t, conn, fmt.Sprintf("k-%d", i%5), typ))
	}
	c.WaitFor(t, time.Minute, fmt.Sprintf("%d %s events", n, typ), func(recs []*kgo.Record) bool {
		got := ids(recs)
		for _, id := range out {
			if got[id] == 0 {
				return false
			}
		}
		return true
	})
	return out
}

// replayed reads the replay's suffixed topics and checks that they hold
// exactly want, each once, in commit order per topic and key.
func replayed(t *testing.T, e *env, suffix string, want []string) {
	t.Helper()
	c := e.kafka.NewConsumer(t, "^"+regexp.QuoteMeta(e.kafka.Prefix)+`.*`+regexp.QuoteMeta(suffix)+"$")
	c.WaitCount(t, time.Minute, len(want))
	c.Settle(t)
	got := deliveredOf(c.Records)
	if len(got) != len(want) {
		t.Fatalf("replay delivered %d records, want %d", len(got), len(want))
	}
	pos := map[string]int{}
	for i, id := range want {
		pos[id] = i
	}
	last := map[string]int{} // per topic and key: order holds within a partition
	for _, d := range got {
		i, ok := pos[d.id]
		if !ok {
			t.Fatalf("replay delivered event %s (commit %s), outside the range", d.id, d.commit)
		}
		if prev, seen := last[d.topic+"/"+d.key]; seen && i <= prev {
			t.Fatalf("%s key %s: replayed event %d after %d; per-key order broken", d.topic, d.key, i, prev)
		}
		last[d.topic+"/"+d.key] = i
		delete(pos, d.id)
	}
	if len(pos) != 0 {
		t.Fatalf("replay missed %d events", len(pos))
	}
}

// TestReplayExactLSNRange: a replay of [L, L2) re-sends exactly the
// transactions whose commit LSN is in it, in per-key order, to the
// suffixed topics, while the connector runs.
func TestReplayExactLSNRange(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Replay.Window = time.Hour
	e.start(t)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	events := writeEvents(t, e, c, 30, "E")
	from, to := commitOf(c.Records, events[10]), commitOf(c.Records, events[20])
	sum, err := e.newPipeline(t).Replay(context.Background(), replay.Request{Range: replay.Range{FromLSN: from, ToLSN: to}, TopicSuffix: ".replay"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Events != 10 || sum.Transactions != 10 || sum.FirstCommit != from || sum.LastCommit != commitOf(c.Records, events[19]) || sum.Acked != 10 {
		t.Fatalf("summary %+v; want 10 events from %s", sum, from)
	}
	replayed(t, e, ".replay", events[10:20])
	// Only the main connector's slot and the replay slot are left: the
	// replay's temporary slot goes with its walsender, which ends a moment
	// after the replay closed its connection (on a loaded machine, after
	// Replay returned).
	var slots string
	testenv.Eventually(t, 30*time.Second, "the replay's temporary slot to be gone", func() bool {
		testenv.QueryRow(t, e.db, `SELECT string_agg(slot_name, ',' ORDER BY slot_name) FROM pg_replication_slots`, nil, &slots)
		return slots == "outbox_cdc,outbox_cdc_replay"
	})
}

// TestLiveReplayPastInFlight: a replay of events committed a moment ago
// runs live, where the producer holds each batch until the loop drains its
// reads; with more events than max_in_flight it must still let them go
// (it once held them for ever: the replay's acks lacked the live batching
// methods, and the loop, saturated, waited on acks that could not come).
func TestLiveReplayPastInFlight(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Replay.Window = time.Hour
	e.cfg.MaxInFlight = 4
	e.start(t)
	from := testenv.CurrentWAL(t, e.db)
	conn := testenv.Connect(t, e.db)
	var events []string
	for i := 0; i < 40; i++ {
		events = append(events, insertEvent(t, conn, fmt.Sprintf("k-%d", i%5), "E"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sum, err := e.newPipeline(t).Replay(ctx, replay.Request{Range: replay.Range{FromLSN: from}, TopicSuffix: ".live"}, nil)
	if err != nil {
		t.Fatalf("live replay of 40 events with max_in_flight 4: %v", err)
	}
	if sum.Events != 40 || sum.Acked != 40 {
		t.Fatalf("summary %+v; want 40 events sent and acked", sum)
	}
	replayed(t, e, ".live", events)
}

// TestReplayFromTime: a replay from a time re-sends the transactions that
// committed from then on, and none before.
func TestReplayFromTime(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Replay.Window = time.Minute // marks every second
	e.start(t)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	writeEvents(t, e, c, 20, "Before")
	// Leave more than the skew between the two batches, so that the
	// from-time can only mean the second.
	time.Sleep(checkpoint.Skew + time.Second) // spacing commit times, not synchronisation
	var from time.Time
	testenv.QueryRow(t, e.db, `SELECT now()`, nil, &from)
	after := writeEvents(t, e, c, 20, "After")
	sum, err := e.newPipeline(t).Replay(context.Background(), replay.Request{Range: replay.Range{FromTime: from}, TopicSuffix: ".again"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Events != 20 || sum.FirstTime.Before(from) {
		t.Fatalf("summary %+v; want the 20 events from %s on", sum, from)
	}
	replayed(t, e, ".again", after)
}

// TestReplayWindowAdvancesAndRefusesOlder: with a 3s window under steady
// writes the replay slot keeps about 3s behind: retained WAL stays near the
// window and no more; a replay from before the window is refused with the
// window's start.
func TestReplayWindowAdvancesAndRefusesOlder(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	const window = 3 * time.Second
	e.cfg.Replay.Window = window
	e.start(t)
	conn := testenv.Connect(t, e.db)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	first := writeEvents(t, e, c, 1, "First")[0]
	firstCommit := commitOf(c.Records, first)

	type sample struct {
		at  time.Time
		wal pglogrepl.LSN
	}
	var samples []sample
	deadline := time.Now().Add(window + 8*time.Second)
	for time.Now().Before(deadline) {
		insertEvent(t, conn, "w", "Steady")
		samples = append(samples, sample{time.Now(), testenv.CurrentWAL(t, e.db)})
		time.Sleep(50 * time.Millisecond) // the writer's pace, not synchronisation
	}
	walAt := func(at time.Time) pglogrepl.LSN {
		var l pglogrepl.LSN
		for _, s := range samples {
			if !s.at.After(at) {
				l = s.wal
			}
		}
		return l
	}
	replaySlot := testenv.SlotPosition(t, e.db, "outbox_cdc_replay")
	now := time.Now()
	// The slot holds the window: nothing written within it is gone...
	if newest := walAt(now.Add(-window)); replaySlot > newest {
		t.Fatalf("replay slot at %s is inside the window (the WAL %s ago was at %s)", replaySlot, window, newest)
	}
	// ...and keeps up: it lags the window by at most a mark interval, the
	// skew, the keeper's tick and the checkpoint that must precede it.
	if oldest := walAt(now.Add(-window - delivery.MarkEvery(window) - checkpoint.Skew - 3*time.Second)); replaySlot < oldest {
		t.Fatalf("replay slot at %s lags the window: the WAL was already at %s", replaySlot, oldest)
	}
	var retained int64
	testenv.QueryRow(t, e.db, `SELECT pg_current_wal_lsn() - restart_lsn FROM pg_replication_slots WHERE slot_name = 'outbox_cdc_replay'`, nil, &retained)
	t.Logf("replay slot at %s, %d bytes of WAL retained for a %s window", replaySlot, retained, window)

	_, err := e.newPipeline(t).Replay(context.Background(), replay.Request{Range: replay.Range{FromLSN: firstCommit}}, nil)
	var outside *replay.OutsideWindowError
	if !errors.As(err, &outside) || !strings.Contains(err.Error(), "outside the replay window") || outside.First <= firstCommit {
		t.Fatalf("replay of event %s (commit %s) from before the window: %v; want an OutsideWindowError naming the window's start", first, firstCommit, err)
	}
}

// TestRewindRedelivers: with the connector stopped, a rewind to an LSN
// re-creates the slot there, and the next run re-delivers from it. A
// rewind while the connector runs is refused.
func TestRewindRedelivers(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Replay.Window = time.Hour
	r := e.start(t)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	events := writeEvents(t, e, c, 20, "E")
	commit := commitOf(c.Records, events[12])
	if _, err := e.newPipeline(t).Ops().Rewind(context.Background(), replay.Range{FromLSN: commit}); err == nil || !strings.Contains(err.Error(), "stop the connector") {
		t.Fatalf("rewind while running: %v; want a refusal", err)
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	done, err := e.newPipeline(t).Ops().Rewind(context.Background(), replay.Range{FromLSN: commit})
	if err != nil {
		t.Fatal(err)
	}
	if done.To != commit || done.From <= commit {
		t.Fatalf("rewound %+v, want to %s", done, commit)
	}
	rec, _ := loadCheckpoint(t, e)
	if h := rec.History; len(h) != 1 || h[0].Kind != checkpoint.JumpRewind || h[0].To != commit || rec.Confirmed != commit {
		t.Fatalf("checkpoint after the rewind: %+v", rec)
	}
	e.start(t)
	c.WaitFor(t, time.Minute, "events 12..19 again", func(recs []*kgo.Record) bool {
		got := ids(recs)
		for _, id := range events[12:] {
			if got[id] < 2 {
				return false
			}
		}
		return true
	})
	c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
	for i, id := range events[:12] {
		if n := ids(c.Records)[id]; n != 1 {
			t.Fatalf("event %d, before the rewind point, delivered %d times", i, n)
		}
	}
}

// TestReplayFiltered: a replay filtered by aggregate type and event type
// (seed 004's "by aggregate type and date range"), or by aggregate id,
// delivers exactly the matching events of the range, each once, in order
// per key; the summary counts the others as skipped.
func TestReplayFiltered(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Replay.Window = time.Hour
	e.start(t)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	conn := testenv.Connect(t, e.db)
	type ev struct{ id, aggType, aggID, typ string }
	var evs []ev
	aggTypes, types := []string{"order", "payment", "invoice"}, []string{"Created", "Paid"}
	for i := 0; i < 40; i++ {
		x := ev{aggType: aggTypes[i%3], aggID: fmt.Sprintf("a-%d", i%4), typ: types[i%2]}
		x.id, _ = insertEventTx(t, conn, x.aggType, x.aggID, x.typ, `'{}'`)
		evs = append(evs, x)
	}
	c.WaitCount(t, time.Minute, len(evs))
	from, to := commitOf(c.Records, evs[5].id), commitOf(c.Records, evs[35].id)

	for _, tc := range []struct {
		suffix string
		r      replay.Request
		match  func(ev) bool
	}{
		{".by-type", replay.Request{AggregateTypes: []string{"order", "payment"}, EventTypes: []string{"Created"}},
			func(x ev) bool { return (x.aggType == "order" || x.aggType == "payment") && x.typ == "Created" }},
		{".by-id", replay.Request{AggregateIDs: []string{"a-1"}}, func(x ev) bool { return x.aggID == "a-1" }},
	} {
		var want []string
		for _, x := range evs[5:35] {
			if tc.match(x) {
				want = append(want, x.id)
			}
		}
		tc.r.Range, tc.r.TopicSuffix = replay.Range{FromLSN: from, ToLSN: to}, tc.suffix
		sum, err := e.newPipeline(t).Replay(context.Background(), tc.r, nil)
		if err != nil {
			t.Fatal(err)
		}
		if sum.Events != int64(len(want)) || sum.Skipped < int64(30-len(want)) {
			t.Fatalf("%s: summary %+v; want %d matched and at least %d skipped", tc.suffix, sum, len(want), 30-len(want))
		}
		replayed(t, e, tc.suffix, want)
	}
}
