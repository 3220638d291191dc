package pipeline_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/delivery"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/relay"
	"github.com/outboxcdc/cdc/internal/replay"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// Detours (issue 53, issue 54; rules 32 to 36 of the design): a parked
// key's events leave the parked topic whole and in commit order, or stay;
// one parking a key; no record reaches an internal topic by any path; a
// request works once, for what the operator saw; every remedy an error
// names works from the state that prints it.

// detour is a parking table whose rows choose their topic (payload.topic,
// a string; anything else is invalid), and whose key is payload.k, with a
// record limit a padded payload exceeds (and half of which, the parked
// keys' share of the checkpoint record, holds a few parkings).
type detour struct {
	*env
	tbl               *outbox.Source
	topic             string // where a row goes without payload.topic
	parked, dead, cpt string
	// pad is how many bytes make an event too large (emit's pad): 20,000
	// when 0, over the 16 KiB limit newDetour sets.
	pad int
}

func newDetour(t *testing.T, mode string) *detour {
	return newDetourOn(t, mode, testenv.NewKafka(t))
}

// newDetourOn is newDetour on kafka: testenv.NewFakeKafka's for a test
// that injects faults.
func newDetourOn(t *testing.T, mode string, kafka *testenv.Kafka) *detour {
	e := newEnv(t, kafka)
	e.cfg.Delivery = mode
	e.cfg.Kafka.MaxMessageBytes = 16384
	d := &detour{env: e, tbl: e.cfg.Tables[0], topic: e.kafka.Prefix + "orders",
		parked: e.kafka.Prefix + "outbox.parked", dead: e.kafka.Prefix + "outbox.dead-letter", cpt: e.cfg.Checkpoint.Topic}
	d.tbl.Topic, d.tbl.Key = "", ""
	d.tbl.OnInvalid, d.tbl.ParkedTopic, d.tbl.DeadLetterTopic = outbox.OnInvalidPark, d.parked, d.dead
	d.route(`has(payload.topic) ? payload.topic : "` + d.topic + `"`)
	return d
}

// route sets the table's topic expression.
func (d *detour) route(topic string) {
	d.tbl.Expressions = outbox.Expressions{Topic: topic, Key: `payload.k`}
}

// emit commits one event of key k with seq, and extra members (JSON,
// without braces), each in its transaction; pad makes it too large.
func (d *detour) emit(t *testing.T, conn *pgx.Conn, k string, seq int, extra string, pad bool) string {
	t.Helper()
	doc := fmt.Sprintf(`{"k": %q, "seq": %d`, k, seq)
	if extra != "" {
		doc += ", " + extra
	}
	if pad {
		doc += `, "pad": "` + strings.Repeat("x", cmp.Or(d.pad, 20000)) + `"`
	}
	doc += "}"
	var id string
	if err := conn.QueryRow(context.Background(), `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', $1, 'E', $2::jsonb) RETURNING id::text`, k, doc).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// consumer reads every topic of the test, read_committed exactly once.
func (d *detour) consumer(t *testing.T) *testenv.Consumer {
	if d.cfg.IsExactlyOnce() {
		return d.kafka.NewCommittedConsumer(t, d.kafka.AllTopics())
	}
	return d.kafka.NewConsumer(t, d.kafka.AllTopics())
}

// parkedSeqs is, by key, the seqs of the parked topic's records.
func (d *detour) parkedSeqs(t *testing.T, recs []*kgo.Record) map[string][]int {
	return seqs(t, recs, d.parked)
}

// waitParked waits until the parked topic holds key k's event of seq
// last, and the checkpoint lists k's parking with at least events events.
func (d *detour) waitParked(t *testing.T, c *testenv.Consumer, k string, last, events int) checkpoint.Parked {
	t.Helper()
	c.WaitFor(t, time.Minute, fmt.Sprintf("%s's event %d parked", k, last), func(recs []*kgo.Record) bool {
		return slices.Contains(d.parkedSeqs(t, recs)[k], last)
	})
	var p checkpoint.Parked
	testenv.Eventually(t, 30*time.Second, fmt.Sprintf("the checkpoint to list %s parked with %d events", k, events), func() bool {
		rec, _ := loadCheckpoint(t, d.env)
		for _, q := range rec.Parked {
			if q.Key == park.KeyID(k) && q.Events >= int64(events) {
				p = q
				return true
			}
		}
		return false
	})
	return p
}

// redrive asks for a redrive of key k (or every key) and waits until the
// pipeline ran it, returning what it did.
func (d *detour) redrive(t *testing.T, sel park.Selector, dropFirst, acceptGap bool) []checkpoint.Used {
	t.Helper()
	p := d.newPipeline(t)
	rd, err := p.Ops().RequestRedrive(context.Background(), sel, dropFirst, acceptGap)
	if err != nil {
		t.Fatalf("redrive %s: %v", sel, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	done, err := p.Ops().WatchRedrive(ctx, rd)
	if err != nil {
		t.Fatalf("redrive %s: %v", sel, err)
	}
	return done
}

func allDone(used []checkpoint.Used) bool {
	for _, u := range used {
		if !u.Done {
			return false
		}
	}
	return len(used) > 0
}

// TestRedriveRefusesWhatIsGone (item 1; rule 33): a redrive checks what
// it reads back against what the checkpoint says is parked. Records
// deleted from the parked topic (DeleteRecords, the topic made again)
// refuse the redrive: nothing is sent, the key stays parked and says how
// to recover, and the key's later events park behind it. --accept-gap,
// the remedy the refusal names for what cannot be read back, sends what
// is left in order and un-parks the key. Partitions added to the parked
// topic meanwhile do not spread a parking: it reads one partition by
// offset.
func TestRedriveRefusesWhatIsGone(t *testing.T) {
	for _, loss := range []string{"delete-records", "topic-made-again", "none, partitions added"} {
		t.Run(loss, func(t *testing.T) {
			d := newDetour(t, config.DeliveryAtLeastOnce)
			r := d.start(t)
			conn := testenv.Connect(t, d.db)
			c := d.consumer(t)
			d.emit(t, conn, "K", 1, "", true)
			for s := 2; s <= 5; s++ {
				d.emit(t, conn, "K", s, "", false)
			}
			d.emit(t, conn, "L", 1, "", false)
			p := d.waitParked(t, c, "K", 5, 5)
			d.cfg.Kafka.MaxMessageBytes = 1 << 20 // the cause fixed
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
			adm := kadm.NewClient(d.kafka.Client(t))
			ctx := context.Background()
			switch loss {
			case "delete-records":
				// Records 1 to 3 of K's parking gone.
				var third int64 = -1
				for _, rec := range c.Records {
					if rec.Topic == d.parked && string(rec.Key) == "K" && seqOf(t, rec) == 3 {
						third = rec.Offset
					}
				}
				o := kadm.Offsets{}
				o.Add(kadm.Offset{Topic: d.parked, Partition: p.Partition, At: third + 1})
				if resp, err := adm.DeleteRecords(ctx, o); err != nil || resp.Error() != nil {
					t.Fatalf("delete records: %v %v", err, resp.Error())
				}
			case "topic-made-again":
				if _, err := adm.DeleteTopic(ctx, d.parked); err != nil {
					t.Fatal(err)
				}
				var made kadm.CreateTopicResponse
				testenv.Eventually(t, 30*time.Second, "the parked topic to be made again", func() bool {
					var err error
					made, err = adm.CreateTopic(ctx, 3, -1, nil, d.parked)
					return err == nil
				})
				// A broker serves the new topic a moment after its
				// controller made it (Apache Kafka): a consumer that
				// looked it up before then fetched with the old topic's
				// id, UNKNOWN_TOPIC_ID, for a minute.
				testenv.Eventually(t, 30*time.Second, "the parked topic made again to be listed by its new id", func() bool {
					topics, err := adm.ListTopics(ctx, d.parked)
					return err == nil && topics.Has(d.parked) && topics[d.parked].Err == nil && topics[d.parked].ID == made.ID && len(topics[d.parked].Partitions) == 3
				})
				c = d.consumer(t) // the first one's positions are past the new topic's end
			default:
				if _, err := adm.CreatePartitions(ctx, 5, d.parked); err != nil {
					t.Fatal(err)
				}
			}
			r = d.start(t)
			used := d.redrive(t, park.Selector{Key: "K"}, false, false)
			if loss != "none, partitions added" {
				if allDone(used) || !strings.Contains(used[0].Outcome, "stays parked") || !strings.Contains(used[0].Outcome, "no longer holds") {
					t.Fatalf("redrive of a parking that lost records: %+v; want it refused, the key parked", used)
				}
				if n := testenv.Value(t, r.p.Metrics().Registry, "cdc_parked_keys"); n != 1 {
					t.Fatalf("cdc_parked_keys %v after a refused redrive, want 1", n)
				}
				d.emit(t, conn, "K", 6, "", false)
				d.waitParked(t, c, "K", 6, 6)
				c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
				if on := seqs(t, c.Records, d.topic)["K"]; len(on) != 0 {
					t.Fatalf("K on its topic after a refused redrive: %v; want nothing", on)
				}
				// The remedy for what cannot be read back: send what is left,
				// accepting the gap.
				used = d.redrive(t, park.Selector{Key: "K"}, false, true)
			}
			if !allDone(used) {
				t.Fatalf("redrive: %+v", used)
			}
			d.emit(t, conn, "K", 7, "", false)
			want := map[string][]int{"delete-records": {4, 5, 6, 7}, "topic-made-again": {6, 7}, "none, partitions added": {1, 2, 3, 4, 5, 7}}[loss]
			c.WaitFor(t, time.Minute, fmt.Sprintf("K's events %v on its topic", want), func(recs []*kgo.Record) bool {
				return len(seqs(t, recs, d.topic)["K"]) >= len(want)
			})
			c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
			if got := seqs(t, c.Records, d.topic)["K"]; !slices.Equal(got, want) {
				t.Fatalf("K on its topic: %v, want %v", got, want)
			}
			if n := testenv.Value(t, r.p.Metrics().Registry, "cdc_parked_keys"); n != 0 {
				t.Fatalf("cdc_parked_keys %v after the redrive, want 0", n)
			}
		})
	}
}

// seqOf is a record's payload seq.
func seqOf(t *testing.T, rec *kgo.Record) int {
	t.Helper()
	var v struct{ Seq int }
	if err := json.Unmarshal(rec.Value, &v); err != nil {
		t.Fatalf("record %s/%d: %v", rec.Topic, rec.Offset, err)
	}
	return v.Seq
}

// TestOneParkingPerKey (item 2): a key parks once, whatever makes its
// events invalid and in whatever order: a topic that cannot be worked
// out, then a record too large for another topic. Its events come back
// out of one parking, in commit order.
func TestOneParkingPerKey(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	x := d.kafka.Prefix + "x"
	r := d.start(t)
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	d.emit(t, conn, "K", 1, `"topic": 7`, false)                  // its topic cannot be worked out
	d.emit(t, conn, "K", 2, fmt.Sprintf(`"topic": %q`, x), false) // behind it
	d.emit(t, conn, "K", 3, fmt.Sprintf(`"topic": %q`, x), true)  // too large, for another topic
	d.emit(t, conn, "K", 4, fmt.Sprintf(`"topic": %q`, x), false)
	d.waitParked(t, c, "K", 4, 4)
	rec, _ := loadCheckpoint(t, d.env)
	if len(rec.Parked) != 1 {
		t.Fatalf("the checkpoint lists %d parkings, want K's one: %+v", len(rec.Parked), rec.Parked)
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	// The causes fixed: every event of K now goes to x.
	d.cfg.Kafka.MaxMessageBytes = 1 << 20
	d.route(`has(payload.topic) && type(payload.topic) == string ? payload.topic : "` + x + `"`)
	d.start(t)
	if used := d.redrive(t, park.Selector{Key: "K"}, false, false); !allDone(used) {
		t.Fatalf("redrive: %+v", used)
	}
	d.emit(t, conn, "K", 5, "", false)
	c.WaitFor(t, time.Minute, "K's 5 events on x", func(recs []*kgo.Record) bool { return len(seqs(t, recs, x)["K"]) >= 5 })
	c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
	if got := seqs(t, c.Records, x)["K"]; !slices.Equal(got, []int{1, 2, 3, 4, 5}) {
		t.Fatalf("K on x: %v; want 1 to 5 in order", got)
	}
}

// TestRedriveAllOrNothing (item 3): a redrive that meets an event invalid
// still (its fourth) sends nothing, in either mode: the key stays parked,
// the outcome names the event, and nothing reaches its topic; once that
// is fixed too, the next redrive sends all of them, each once.
func TestRedriveAllOrNothing(t *testing.T) {
	for _, mode := range []string{config.DeliveryAtLeastOnce, config.DeliveryExactlyOnce} {
		t.Run(mode, func(t *testing.T) {
			d := newDetour(t, mode)
			r := d.start(t)
			conn := testenv.Connect(t, d.db)
			c := d.consumer(t)
			d.emit(t, conn, "K", 1, "", true)
			d.emit(t, conn, "K", 2, "", false)
			d.emit(t, conn, "K", 3, "", false)
			fourth := d.emit(t, conn, "K", 4, `"topic": 7`, false)
			d.emit(t, conn, "K", 5, "", false)
			d.waitParked(t, c, "K", 5, 5)
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
			d.cfg.Kafka.MaxMessageBytes = 1 << 20 // the first's cause fixed, not the fourth's
			r = d.start(t)
			used := d.redrive(t, park.Selector{Key: "K"}, false, false)
			if allDone(used) || !strings.Contains(used[0].Outcome, "event 4 of 5 (id "+fourth+")") {
				t.Fatalf("redrive with event 4 invalid still: %+v; want it refused, naming event 4", used)
			}
			d.emit(t, conn, "L", 1, "", false)
			c.WaitFor(t, time.Minute, "L's event", func(recs []*kgo.Record) bool { return len(seqs(t, recs, d.topic)["L"]) >= 1 })
			c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
			if on := seqs(t, c.Records, d.topic)["K"]; len(on) != 0 {
				t.Fatalf("K on its topic after a redrive that met an invalid event: %v; want nothing", on)
			}
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
			d.route(`has(payload.topic) && type(payload.topic) == string ? payload.topic : "` + d.topic + `"`)
			d.start(t)
			if used := d.redrive(t, park.Selector{Key: "K"}, false, false); !allDone(used) {
				t.Fatalf("redrive: %+v", used)
			}
			c.WaitFor(t, time.Minute, "K's 5 events", func(recs []*kgo.Record) bool { return len(seqs(t, recs, d.topic)["K"]) >= 5 })
			c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
			if got := seqs(t, c.Records, d.topic)["K"]; !slices.Equal(got, []int{1, 2, 3, 4, 5}) {
				t.Fatalf("K on its topic: %v; want 1 to 5, each once", got)
			}
		})
	}
}

// TestDropFirstOfATooLargeEvent (item 4): --drop-first of an event parked
// for its size sends it, whole, to the dead-letter topic (whose limit is
// kafka.dead_letter_max_message_bytes on a park table too), the rest on,
// and the connector starts again as usual.
func TestDropFirstOfATooLargeEvent(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	r := d.start(t)
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	first := d.emit(t, conn, "K", 1, "", true)
	d.emit(t, conn, "K", 2, "", false)
	d.waitParked(t, c, "K", 2, 2)
	if used := d.redrive(t, park.Selector{Key: "K"}, true, false); !allDone(used) {
		t.Fatalf("redrive --drop-first: %+v", used)
	}
	c.WaitFor(t, time.Minute, "the first dead-lettered, the second on its topic", func(recs []*kgo.Record) bool {
		return len(seqs(t, recs, d.dead)["K"]) >= 1 && len(seqs(t, recs, d.topic)["K"]) >= 1
	})
	for _, rec := range inTopic(c.Records, d.dead) {
		if testenv.Header(rec, route.HeaderDeadLetterID) != first || testenv.Header(rec, route.HeaderDeadLetterTruncated) != "" || len(rec.Value) < 20000 {
			t.Fatalf("the dead letter: id %s, truncated %q, %d bytes; want the first, whole", testenv.Header(rec, route.HeaderDeadLetterID), testenv.Header(rec, route.HeaderDeadLetterTruncated), len(rec.Value))
		}
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	d.start(t)
	d.emit(t, conn, "K", 3, "", false)
	c.WaitFor(t, time.Minute, "K's next event after a restart", func(recs []*kgo.Record) bool { return len(seqs(t, recs, d.topic)["K"]) >= 2 })
	c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
	if got := seqs(t, c.Records, d.topic)["K"]; !slices.Equal(got, []int{2, 3}) {
		t.Fatalf("K on its topic: %v, want 2 and 3", got)
	}
}

// TestRemediesAtMaxParkedKeys (item 5; rule 36): at max_parked_keys the
// connector stops on the next invalid key, with every key parked before
// in the checkpoint; each remedy its error names works from there: a
// redrive requested while it is stopped runs as it starts again (the
// stream could never reach its announcement), and cdc skip sends the
// event it stopped on to the dead-letter topic.
func TestRemediesAtMaxParkedKeys(t *testing.T) {
	for _, remedy := range []string{"redrive", "skip"} {
		t.Run(remedy, func(t *testing.T) {
			d := newDetour(t, config.DeliveryAtLeastOnce)
			d.cfg.MaxParkedKeys = 2
			r := d.start(t)
			conn := testenv.Connect(t, d.db)
			c := d.consumer(t)
			d.emit(t, conn, "A", 1, "", true)
			d.emit(t, conn, "B", 1, "", true)
			third := d.emit(t, conn, "C", 1, "", true)
			err := waitFatal(t, r)
			var full *relay.FullError
			if !errors.As(err, &full) || !strings.Contains(err.Error(), "cdc skip") || !strings.Contains(err.Error(), "cdc redrive") {
				t.Fatalf("got %v; want the max_parked_keys error, naming its remedies", err)
			}
			rec, _ := loadCheckpoint(t, d.env)
			if len(rec.Parked) != 2 {
				t.Fatalf("the checkpoint lists %d parked keys at the stop, want A and B: cdc parked must show what to redrive", len(rec.Parked))
			}
			switch remedy {
			case "redrive":
				// A's first event to the dead-letter topic, which makes room.
				p := d.newPipeline(t)
				rd, err := p.Ops().RequestRedrive(context.Background(), park.Selector{Key: "A"}, true, false)
				if err != nil {
					t.Fatal(err)
				}
				d.start(t)
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				used, err := p.Ops().WatchRedrive(ctx, rd)
				if err != nil || !allDone(used) {
					t.Fatalf("a redrive made while the connector was stopped: %+v, %v", used, err)
				}
				// C parks now (room for it), and the stream goes on.
				d.emit(t, conn, "D", 1, "", false)
				c.WaitFor(t, time.Minute, "A dead-lettered, C parked, D on its topic", func(recs []*kgo.Record) bool {
					return len(seqs(t, recs, d.dead)["A"]) >= 1 && len(seqs(t, recs, d.topic)["D"]) >= 1 && len(d.parkedSeqs(t, recs)["C"]) >= 1
				})
			case "skip":
				if full.Cause.EventID != third {
					t.Fatalf("stopped on %s, want C's event %s", full.Cause.EventID, third)
				}
				if _, err := d.newPipeline(t).Ops().Skip(context.Background(), full.Cause.CommitLSN, third); err != nil {
					t.Fatal(err)
				}
				d.start(t)
				d.emit(t, conn, "C", 2, "", false)
				c.WaitFor(t, time.Minute, "C's first dead-lettered, its second on its topic", func(recs []*kgo.Record) bool {
					return ids(inTopic(recs, d.dead))[third] > 0 && len(seqs(t, recs, d.topic)["C"]) >= 1
				})
			}
		})
	}
}

// TestRedriveAlwaysEnds (item 6): a redrive whose first event is invalid
// still, for the same reason, ends, saying so, and the key stays parked.
func TestRedriveAlwaysEnds(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	d.start(t)
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	d.emit(t, conn, "K", 1, "", true)
	d.waitParked(t, c, "K", 1, 1)
	used := d.redrive(t, park.Selector{Key: "K"}, false, false)
	if allDone(used) || !strings.Contains(used[0].Outcome, "max_message_bytes") {
		t.Fatalf("redrive of an event invalid still: %+v; want it kept parked, saying why", used)
	}
}

// TestRewindWithAParkedKey (item 7): a rewind re-streams events of a key
// whose parking began after the rewind's position: the parking is given
// up, the key parks again where its first event is met, and once
// redriven the key's last event on its topic is its newest. A parking
// that began before keeps its events from before the rewind, and the
// re-streamed ones go behind them, in order.
func TestRewindWithAParkedKey(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	d.cfg.Replay.Window = time.Hour
	r := d.start(t)
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	d.emit(t, conn, "J", 1, "", true) // J parks before the rewind's position
	d.emit(t, conn, "J", 2, "", false)
	for s := 1; s <= 5; s++ {
		d.emit(t, conn, "K", s, "", false)
	}
	c.WaitFor(t, time.Minute, "K's 5 events", func(recs []*kgo.Record) bool { return len(seqs(t, recs, d.topic)["K"]) >= 5 })
	var rewindTo pglogrepl.LSN
	for _, rec := range c.Records {
		if rec.Topic == d.topic && string(rec.Key) == "K" && seqOf(t, rec) == 3 {
			rewindTo = commitOf(c.Records, testenv.Header(rec, route.HeaderID))
		}
	}
	d.emit(t, conn, "J", 3, "", false)
	d.emit(t, conn, "K", 6, "", true) // K parks after it
	for s := 7; s <= 10; s++ {
		d.emit(t, conn, "K", s, "", false)
	}
	d.waitParked(t, c, "K", 10, 5)
	d.waitParked(t, c, "J", 3, 3)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if _, err := d.newPipeline(t).Ops().Rewind(context.Background(), replay.Range{FromLSN: rewindTo}); err != nil {
		t.Fatal(err)
	}
	rec, _ := loadCheckpoint(t, d.env)
	if len(rec.Parked) != 1 || rec.Parked[0].Key != "J" || rec.Parked[0].Events != 2 {
		t.Fatalf("parked after the rewind: %+v; want J's first 2 only (K's parking began after the rewind's position)", rec.Parked)
	}
	r = d.start(t)
	d.waitParked(t, c, "K", 10, 5)
	d.waitParked(t, c, "J", 3, 3)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	d.cfg.Kafka.MaxMessageBytes = 1 << 20
	d.start(t)
	if used := d.redrive(t, park.Selector{All: true}, false, false); !allDone(used) {
		t.Fatalf("redrive: %+v", used)
	}
	c.WaitFor(t, time.Minute, "K and J redriven", func(recs []*kgo.Record) bool {
		on := seqs(t, recs, d.topic)
		return len(on["K"]) >= 5+3+5 && len(on["J"]) >= 3
	})
	c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
	on := seqs(t, c.Records, d.topic)
	if k := on["K"]; !slices.Equal(k, []int{1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 8, 9, 10}) {
		t.Fatalf("K on its topic: %v; want 1-5, then the rewind's 3-10 in order", k)
	}
	if j := on["J"]; !slices.Equal(j, []int{1, 2, 3}) {
		t.Fatalf("J on its topic: %v; want 1 to 3, each once, in order", j)
	}
}

// TestNoRowReachesAnInternalTopic (issue 54, items 1 and 4; rule 34): a
// row that routes its record into the checkpoint topic, the parked topic
// or a topic the brokers refuse is an invalid event of its table, parked
// under park, never a stop of every table and never a record there: not
// directly, not behind a parked key, not through a redrive or
// --drop-first. The checkpoint topic ends with only the connector's own
// records, the parked topic with only sealed parked records.
func TestNoRowReachesAnInternalTopic(t *testing.T) {
	for _, mode := range []string{config.DeliveryAtLeastOnce, config.DeliveryExactlyOnce} {
		t.Run(mode, func(t *testing.T) {
			kafka := testenv.NewFakeKafka(t)
			e := newEnv(t, kafka)
			e.cfg.Delivery = mode
			e.cfg.Kafka.MaxMessageBytes = 16384
			d := &detour{env: e, tbl: e.cfg.Tables[0], topic: kafka.Prefix + "orders",
				parked: kafka.Prefix + "outbox.parked", dead: kafka.Prefix + "outbox.dead-letter", cpt: e.cfg.Checkpoint.Topic}
			d.tbl.Topic, d.tbl.Key = "", ""
			d.tbl.OnInvalid, d.tbl.ParkedTopic, d.tbl.DeadLetterTopic = outbox.OnInvalidPark, d.parked, d.dead
			d.route(`has(payload.topic) ? payload.topic : "` + d.topic + `"`)
			refused := kafka.Prefix + "col.lides"
			kafka.Fake.ControlKey(int16(kmsg.CreateTopics), func(kr kmsg.Request) (kmsg.Response, error, bool) {
				kafka.Fake.KeepControl()
				req := kr.(*kmsg.CreateTopicsRequest)
				if len(req.Topics) != 1 || req.Topics[0].Topic != refused {
					return nil, nil, false
				}
				resp := req.ResponseKind().(*kmsg.CreateTopicsResponse)
				rt := kmsg.NewCreateTopicsResponseTopic()
				rt.Topic, rt.ErrorCode = refused, kerr.InvalidTopicException.Code
				resp.Topics = append(resp.Topics, rt)
				return resp, nil, true
			})
			r := d.start(t)
			conn := testenv.Connect(t, d.db)
			c := d.consumer(t)
			to := func(topic string) string { return fmt.Sprintf(`"topic": %q`, topic) }
			d.emit(t, conn, "K", 1, to(d.cpt), true)  // too large, for the checkpoint topic: parks K
			d.emit(t, conn, "K", 2, to(d.cpt), false) // behind it, for the checkpoint topic
			d.emit(t, conn, "M", 1, to(d.cpt), false) // parks M: not a stop
			d.emit(t, conn, "N", 1, to(d.parked), false)
			d.emit(t, conn, "O", 1, to(refused), false)
			d.emit(t, conn, "L", 1, "", false)
			c.WaitFor(t, time.Minute, "L on its topic, and K, M, N and O parked", func(recs []*kgo.Record) bool {
				select {
				case err := <-r.done:
					t.Fatalf("the connector stopped: %v", err)
				default:
				}
				held := d.parkedSeqs(t, recs)
				return len(seqs(t, recs, d.topic)["L"]) == 1 && len(held["K"]) == 2 && len(held["M"]) == 1 && len(held["N"]) == 1 && len(held["O"]) == 1
			})
			d.waitParked(t, c, "O", 1, 1)
			select {
			case err := <-r.done:
				t.Fatalf("the connector stopped: %v", err)
			default:
			}
			// --drop-first: the first of each to the dead-letter topic; K's
			// second, for the checkpoint topic still, keeps K parked, and
			// nothing of K is sent.
			used := d.redrive(t, park.Selector{All: true}, true, false)
			if allDone(used) || !strings.Contains(used[0].Outcome, `key "K" stays parked`) || !strings.Contains(used[0].Outcome, "checkpoint topic") {
				t.Fatalf("redrive --drop-first --all: %+v; want K kept parked for its second event's topic, the others sent on", used)
			}
			d.emit(t, conn, "L", 2, "", false)
			c.WaitFor(t, time.Minute, "M, N and O dead-lettered, L's second", func(recs []*kgo.Record) bool {
				dl := seqs(t, recs, d.dead)
				return len(dl["M"]) == 1 && len(dl["N"]) == 1 && len(dl["O"]) == 1 && len(seqs(t, recs, d.topic)["L"]) == 2
			})
			c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
			if dl := seqs(t, c.Records, d.dead)["K"]; len(dl) != 0 {
				t.Errorf("K's first dead-lettered by a redrive that kept K parked: %v; a redrive sends all or nothing", dl)
			}
			key := checkpoint.Key("outbox_cdc", systemID(t, d.db))
			cpt := d.kafka.NewConsumer(t, "^"+regexp.QuoteMeta(d.cpt)+"$")
			cpt.WaitCount(t, 30*time.Second, 1)
			cpt.Settle(t)
			for _, rec := range cpt.Records {
				if !strings.HasPrefix(string(rec.Key), key) || testenv.Header(rec, route.HeaderID) != "" {
					t.Errorf("a record in the checkpoint topic that is not the connector's: key %q headers %v", rec.Key, rec.Headers)
				}
			}
			for _, rec := range inTopic(c.Records, d.parked) {
				if !park.Sealed(rec, d.cfg.Checkpoint.SigningKeys, key) {
					t.Errorf("a record in the parked topic without the connector's seal: key %q offset %d", rec.Key, rec.Offset)
				}
			}
			if n := testenv.Value(t, r.p.Metrics().Registry, "cdc_parked_keys"); n != 1 {
				t.Errorf("cdc_parked_keys %v, want 1 (K)", n)
			}
		})
	}
}

// TestReplayedRedriveDoesNothing (issue 54, item 2; rule 35): a redrive
// request runs once, for the parkings the operator saw: announced again
// (pg_logical_emit_message, which any role may write) after its key
// parked again, it changes nothing.
func TestReplayedRedriveDoesNothing(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	d.start(t)
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	d.emit(t, conn, "K", 1, "", true)
	d.emit(t, conn, "K", 2, "", false)
	d.waitParked(t, c, "K", 2, 2)
	used := d.redrive(t, park.Selector{Key: "K"}, true, false)
	if !allDone(used) {
		t.Fatalf("redrive --drop-first: %+v", used)
	}
	d.emit(t, conn, "K", 3, "", true) // parks K again, another episode
	d.emit(t, conn, "K", 4, "", false)
	p := d.waitParked(t, c, "K", 4, 2)
	b, _ := json.Marshal(map[string]string{"type": park.ControlRequest, "id": used[0].ID})
	testenv.Exec(t, d.db, `SELECT pg_logical_emit_message(true, '`+decode.ControlPrefix+`', '`+string(b)+`')`)
	d.emit(t, conn, "L", 1, "", false)
	c.WaitFor(t, time.Minute, "the event after the replayed announcement", func(recs []*kgo.Record) bool {
		return len(seqs(t, recs, d.topic)["L"]) == 1
	})
	testenv.Eventually(t, 30*time.Second, "the checkpoint to pass the replayed announcement", func() bool {
		rec, _ := loadCheckpoint(t, d.env)
		return rec.CommitLSN > p.FirstLSN
	})
	c.Settle(t)
	if dl := seqs(t, c.Records, d.dead)["K"]; !slices.Equal(dl, []int{1}) {
		t.Fatalf("K's dead letters after the replayed request: %v; want only its first, from the request that ran", dl)
	}
	if on := seqs(t, c.Records, d.topic)["K"]; !slices.Equal(on, []int{2}) {
		t.Fatalf("K on its topic: %v; want 2 (3 and 4 parked again)", on)
	}
	rec, _ := loadCheckpoint(t, d.env)
	if len(rec.Parked) != 1 || rec.Parked[0].Episode != p.Episode || rec.Parked[0].Events != 2 {
		t.Fatalf("parked after the replayed request: %+v; want K's second parking as it was", rec.Parked)
	}
}

// TestRedriveIsBounded (issue 53, item 8): a redrive of a parking many
// times max_in_flight sends it a chunk at a time: never more in flight
// than max_in_flight, every event once, in order, in either mode.
func TestRedriveIsBounded(t *testing.T) {
	for _, mode := range []string{config.DeliveryAtLeastOnce, config.DeliveryExactlyOnce} {
		t.Run(mode, func(t *testing.T) {
			d := newDetour(t, mode)
			d.cfg.MaxInFlight = 40
			var peak atomic.Int64
			var tracker atomic.Pointer[delivery.Tracker]
			d.onDelivered = func(*kgo.Record, error) {
				if tr := tracker.Load(); tr != nil {
					if n := int64(tr.InFlight()); n > peak.Load() {
						peak.Store(n)
					}
				}
			}
			r := d.start(t)
			conn := testenv.Connect(t, d.db)
			c := d.consumer(t)
			d.emit(t, conn, "K", 1, "", true)
			testenv.Exec(t, d.db, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
				SELECT 'order', 'K', 'E', jsonb_build_object('k', 'K', 'seq', i) FROM generate_series(2, 1000) i`)
			d.waitParked(t, c, "K", 1000, 1000)
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
			d.cfg.Kafka.MaxMessageBytes = 1 << 20
			r = d.start(t)
			tracker.Store(r.tracker.Load())
			peak.Store(0)
			if used := d.redrive(t, park.Selector{Key: "K"}, false, false); !allDone(used) {
				t.Fatalf("redrive: %+v", used)
			}
			c.WaitFor(t, time.Minute, "K's 1,000 events", func(recs []*kgo.Record) bool { return len(seqs(t, recs, d.topic)["K"]) >= 1000 })
			c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
			if got := seqs(t, c.Records, d.topic)["K"]; !inOrder(got, 1, 1000) {
				t.Fatalf("K on its topic: %d events; want 1 to 1,000 in order, each once", len(got))
			}
			if n := peak.Load(); n > int64(d.cfg.MaxInFlight) {
				t.Fatalf("%d records in flight during the redrive; max_in_flight is %d", n, d.cfg.MaxInFlight)
			}
		})
	}
}
