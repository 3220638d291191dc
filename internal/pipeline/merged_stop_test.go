package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/relay"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestMaxParkedKeysInAMergedFirstStart (found by the attack on issue 53):
// a first start that merges two tables' rows stops at max_parked_keys
// right after a parked key's event, the last row one table's job sent.
// Each remedy the error names works from there: the redrive of A with
// --drop-first, made while the connector is stopped, runs as it starts
// again, and the resumed job does not read A's event again (it sent that
// commit whole, checkpoint.Job.Whole), so A stays released, C parks in
// its room and D arrives once; or cdc skip of C's event.
func TestMaxParkedKeysInAMergedFirstStart(t *testing.T) {
	for _, run := range []struct{ mode, remedy string }{{config.DeliveryAtLeastOnce, "redrive"}, {config.DeliveryAtLeastOnce, "skip"}, {config.DeliveryExactlyOnce, "redrive"}} {
		remedy := run.remedy
		t.Run(run.mode+"/"+remedy, func(t *testing.T) {
			d := newDetour(t, run.mode)
			d.cfg.MaxParkedKeys = 2
			d.tbl.Backfill = &outbox.BackfillOptions{ChunkSize: 10}
			testenv.Exec(t, d.db, `CREATE TABLE outbox2 (LIKE outbox INCLUDING ALL)`)
			tb2 := *d.tbl
			tb2.Name = outbox.TableName{Schema: "public", Name: "outbox2"}
			tb2.Backfill = &outbox.BackfillOptions{ChunkSize: 10}
			d.cfg.Tables = append(d.cfg.Tables, &tb2)
			conn := testenv.Connect(t, d.db)
			emit2 := func(k string, seq int, pad bool) string {
				doc := fmt.Sprintf(`{"k": %q, "seq": %d`, k, seq)
				if pad {
					doc += `, "pad": "` + strings.Repeat("x", 20000) + `"`
				}
				doc += "}"
				var id string
				if err := conn.QueryRow(context.Background(), `INSERT INTO outbox2 (aggregatetype, aggregateid, type, payload) VALUES ('order', $1, 'E', $2::jsonb) RETURNING id::text`, k, doc).Scan(&id); err != nil {
					t.Fatal(err)
				}
				return id
			}
			d.emit(t, conn, "A", 1, "", true)
			emit2("D", 0, false)
			emit2("B", 1, true)
			third := emit2("C", 1, true)
			d.emit(t, conn, "D", 1, "", false)
			r := d.launch(t, ioDiscard{})
			err := waitFatal(t, r)
			var full *relay.FullError
			if !errors.As(err, &full) {
				t.Fatalf("got %v; want the max_parked_keys error", err)
			}
			t.Logf("stopped: %v", err)
			rec, _ := loadCheckpoint(t, d.env)
			t.Logf("checkpoint at the stop: parked %d, jobs %+v", len(rec.Parked), rec.Backfills)
			c := d.consumer(t)
			switch remedy {
			case "redrive":
				if len(rec.Parked) != 2 {
					t.Fatalf("the checkpoint lists %d parked keys at the stop, want A and B: cdc parked must show what to redrive", len(rec.Parked))
				}
				p := d.newPipeline(t)
				rd, err := p.Ops().RequestRedrive(context.Background(), park.Selector{Key: "A"}, true, false)
				if err != nil {
					t.Fatal(err)
				}
				r = d.launch(t, ioDiscard{})
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				used, err := p.Ops().WatchRedrive(ctx, rd)
				t.Logf("redrive outcome: %+v", used)
				if err != nil || !allDone(used) {
					select {
					case ferr := <-r.done:
						close(r.done)
						t.Fatalf("the redrive made while the connector was stopped never ran (%+v, %v): the next start stopped again before it: %v", used, err, ferr)
					default:
					}
					t.Fatalf("a redrive made while the connector was stopped: %+v, %v", used, err)
				}
			case "skip":
				if full.Cause.EventID != third {
					t.Fatalf("stopped on %s, want C's event %s", full.Cause.EventID, third)
				}
				if _, err := d.newPipeline(t).Ops().Skip(context.Background(), full.Cause.CommitLSN, third); err != nil {
					t.Fatalf("cdc skip of the event it stopped on (lsn %s): %v", full.Cause.CommitLSN, err)
				}
				r := d.launch(t, ioDiscard{})
				ok := false
				testenv.Eventually(t, time.Minute, "the connector to stream, or stop again", func() bool {
					select {
					case ferr := <-r.done:
						close(r.done)
						t.Fatalf("after cdc skip the next start stopped again: %v", ferr)
					default:
					}
					ok = r.tracker.Load() != nil
					return ok
				})
			}
			if remedy == "redrive" {
				// The start after the redrive either streams D1 or stops
				// again on C: whichever comes first.
				var stopped error
				testenv.Eventually(t, time.Minute, "D's two events, or a stop", func() bool {
					select {
					case stopped = <-r.done:
						close(r.done)
						return true
					default:
					}
					c.Settle(t) // reads what arrived meanwhile
					return len(seqs(t, c.Records, d.topic)["D"]) >= 2
				})
				if stopped != nil {
					rec, _ := loadCheckpoint(t, d.env)
					t.Fatalf("after the redrive of A (--drop-first, done), the next start stopped again: %v; parked now: %d keys (A parked again: %v)", stopped, len(rec.Parked), len(rec.Parked) > 0 && rec.Parked[0].Key == "A")
				}
			}
			c.WaitFor(t, time.Minute, "D on its topic", func(recs []*kgo.Record) bool { return len(seqs(t, recs, d.topic)["D"]) >= 2 })
			c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
			if got := seqs(t, c.Records, d.topic)["D"]; !slices.Equal(got, []int{0, 1}) {
				t.Fatalf("D on its topic: %v; want its event once", got)
			}
			var keys []string
			rec, _ = loadCheckpoint(t, d.env)
			for _, p := range rec.Parked {
				keys = append(keys, p.Key)
			}
			slices.Sort(keys)
			want := map[string][]string{"redrive": {"B", "C"}, "skip": {"A", "B"}}[remedy]
			if !slices.Equal(keys, want) {
				t.Fatalf("parked after the remedy: %v, want %v", keys, want)
			}
		})
	}
}
