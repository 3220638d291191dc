package pipeline_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/ops"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/replay"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestDetourModel (issue 53, rules 32, 33 and 36): a generator, not only
// examples. A seeded draw of steps (events of a few keys, valid, too large
// for their topic or routed to the parked topic; restarts; redrives of a
// key, of a table or of every key, with --drop-first, --drop-invalid or
// neither, and with the connector restarted under it; the size limit
// raised; rewinds to before a drawn event; a partition of the parked topic
// emptied by DeleteRecords) runs against a parking table in both delivery
// modes. At the end the causes are fixed and every parking redriven until
// none is left (a refusal for records gone takes the remedy it names, a
// rewind to the parking's start), and each key's consumer-visible sequence
// is checked against the model: every committed event on its topic or,
// only by a drop and only an invalid one, in the dead-letter topic; on its
// topic after every earlier event of its key that was not dropped; none
// twice in exactly-once mode that no rewind sent again.
//
// CDC_MODEL_SEED replays a seed, CDC_MODEL_STEPS sets the steps (40; make
// chaos runs more).
func TestDetourModel(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CDC_MODEL_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seed = n
	}
	steps := 40
	if s := os.Getenv("CDC_MODEL_STEPS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatal(err)
		}
		steps = n
	}
	// Printed whatever the outcome, so that CI's output holds it.
	fmt.Fprintf(os.Stderr, "TestDetourModel: seed %d, %d steps (CDC_MODEL_SEED=%d replays it)\n", seed, steps, seed)
	for i, mode := range []string{config.DeliveryAtLeastOnce, config.DeliveryExactlyOnce} {
		t.Run(mode, func(t *testing.T) {
			m := &detourModel{rng: rand.New(rand.NewPCG(seed, uint64(i))), seed: seed}
			m.run(t, mode, steps)
		})
	}
}

// modelEvent is one committed event of the model.
type modelEvent struct {
	seq  int
	kind string // "ok", "big" (too large until the limit is raised), "bad" (routed to the parked topic)
	// before and after are the WAL's insert position before the event's
	// transaction and after its commit: a rewind to before re-streams it
	// and every later one.
	before, after pglogrepl.LSN
	// rewound: a rewind re-streamed it, so it may be on its topic (and in
	// the dead-letter topic) more than once, in either mode.
	rewound bool
}

type detourModel struct {
	rng  *rand.Rand
	seed uint64
	log  []string // the steps drawn, for the failure message
	t    *testing.T
}

func (m *detourModel) step(format string, args ...any) {
	m.log = append(m.log, fmt.Sprintf(format, args...))
	m.t.Logf("%s step: %s", time.Now().Format("15:04:05.000"), m.log[len(m.log)-1])
}

func (m *detourModel) fail(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Fatalf("seed %d (CDC_MODEL_SEED=%d replays it): %s\nsteps:\n  %s", m.seed, m.seed, fmt.Sprintf(format, args...), joinLines(m.log))
}

func joinLines(l []string) string {
	out := ""
	for i, s := range l {
		if i > 0 {
			out += "\n  "
		}
		out += s
	}
	return out
}

func (m *detourModel) run(t *testing.T, mode string, steps int) {
	m.t = t
	d := newDetour(t, mode)
	d.cfg.Replay.Window = time.Hour // for the rewinds
	// The checkpoint's room for the requests taken is an eighth of the
	// limit: one that holds a run's redrives (2 KiB held about 14).
	d.cfg.Kafka.MaxMessageBytes, d.pad = 256<<10, 300<<10
	keys := []string{"A", "B", "C"}
	events := map[string][]*modelEvent{}
	var order []*modelEvent // every event, in commit order
	r := d.start(t)
	defer func() { r.stop(t) }()
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	rd := d.newPipeline(t) // the commands', one for the run
	adm := kadm.NewClient(d.kafka.Client(t))
	raised := false
	restart := func(why string) {
		t.Helper()
		if err := r.stop(t); err != nil {
			m.fail(t, "stop (%s): %v", why, err)
		}
		r = d.start(t)
	}
	// rewind stops the connector, rewinds it to lsn and starts it again:
	// the events committed since are streamed again.
	rewind := func(lsn pglogrepl.LSN, why string) {
		t.Helper()
		if err := r.stop(t); err != nil {
			m.fail(t, "stop (%s): %v", why, err)
		}
		done, err := rd.Ops().Rewind(context.Background(), replay.Range{FromLSN: lsn})
		if err != nil {
			m.fail(t, "rewind to %s (%s): %v", lsn, why, err)
		}
		n := 0
		for _, ev := range order {
			if ev.after > done.To {
				ev.rewound = true
				n++
			}
		}
		m.step("rewind to %s (%s): %d events again, %d parkings given up", done.To, why, n, done.ParkingsGivenUp)
		r = d.start(t)
	}
	parkings := func() []checkpoint.Parked {
		rec, _ := loadCheckpoint(t, d.env)
		return rec.Parked
	}
	for range steps {
		switch n := m.rng.IntN(100); {
		case n < 60:
			k := keys[m.rng.IntN(len(keys))]
			ev := &modelEvent{seq: len(events[k]) + 1, kind: "ok"}
			switch x := m.rng.IntN(100); {
			case x < 20:
				ev.kind = "big"
			case x < 30:
				ev.kind = "bad"
			}
			extra := ""
			if ev.kind == "bad" {
				extra = fmt.Sprintf(`"topic": %q`, d.parked)
			}
			ev.before = testenv.CurrentWAL(t, d.db)
			d.emit(t, conn, k, ev.seq, extra, ev.kind == "big")
			ev.after = testenv.CurrentWAL(t, d.db)
			events[k] = append(events[k], ev)
			order = append(order, ev)
			m.step("emit %s %d %s", k, ev.seq, ev.kind)
		case n < 70:
			m.step("restart")
			restart("a step")
		case n < 73 && !raised: // rare: a raised limit leaves only one kind invalid
			raised = true
			d.cfg.Kafka.MaxMessageBytes = 1 << 20
			m.step("raise the limit, restart")
			restart("the limit raised")
		case n < 77 && len(order) > 0:
			// Replay by resetting the LSN, to before a drawn event (which
			// the slot is past once everything so far is in).
			c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
			ev := order[m.rng.IntN(len(order))]
			rewind(ev.before, "a step")
		case n < 79:
			// The parked topic loses records (a retention, DeleteRecords):
			// a redrive of a parking in that partition refuses, and the
			// remedy it names, a rewind to the parking's start, is what
			// the end of the run does.
			ps := parkings()
			if len(ps) == 0 {
				m.step("delete parked records: nothing parked")
				continue
			}
			p := ps[m.rng.IntN(len(ps))]
			m.step("delete the parked records of %s's partition %d: %s", p.Key, p.Partition, deleteRecords(t, adm, p.Topic, p.Partition))
		default:
			// On what the checkpoint lists once every event so far is in.
			c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
			ps := parkings()
			if len(ps) == 0 {
				m.step("redrive: nothing parked")
				continue
			}
			sel := park.Selector{Key: ps[m.rng.IntN(len(ps))].Key}
			switch m.rng.IntN(6) {
			case 0:
				sel = park.Selector{All: true}
			case 1:
				sel = park.Selector{Table: d.tbl.String()}
			}
			var opt ops.RedriveOptions
			// A drop hides what it drops from the order check: drawn less.
			switch m.rng.IntN(10) {
			case 0:
				opt.DropFirst = true
			case 1:
				opt.DropInvalid = true
			}
			if m.rng.IntN(3) == 0 {
				// The connector stopped while it may be redriving: the
				// request is taken by the next start, or was done.
				req, err := rd.Ops().Redrive(context.Background(), sel, opt)
				if err != nil {
					m.fail(t, "redrive %s: %v", sel, err)
				}
				restart("a redrive under way")
				m.step("redrive %s %+v, restarted under it: %s", sel, opt, m.watch(t, rd, req))
				continue
			}
			m.step("redrive %s %+v: %s", sel, opt, m.redrive(t, rd, sel, opt))
		}
	}
	// The causes fixed; every parking redriven until none is left.
	if !raised {
		d.cfg.Kafka.MaxMessageBytes = 1 << 20
		restart("the limit raised at the end")
	}
	// Every committed event reached its topic, the dead-letter topic or a
	// parking before the redrives begin.
	c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
	for round := 0; ; round++ {
		ps := parkings()
		if len(ps) == 0 {
			break
		}
		if round > 4*len(order)+8 {
			m.fail(t, "still parked after %d rounds of redrives: %+v", round, ps)
		}
		// What an operator does: a redrive; where an event is invalid
		// still, one that drops what nobody will fix; where records are
		// gone, the remedy the refusal names.
		for _, p := range ps {
			out := m.redrive(t, rd, park.Selector{Key: p.Key}, ops.RedriveOptions{})
			m.step("end: redrive %s: %s", p.Key, out)
			switch {
			case strings.Contains(out, "no longer holds"):
				rewind(p.FirstLSN, "end: "+p.Key+"'s records gone")
			case out != "done":
				m.step("end: redrive %s --drop-invalid: %s", p.Key, m.redrive(t, rd, park.Selector{Key: p.Key}, ops.RedriveOptions{DropInvalid: true}))
			}
			if out != "done" {
				break // the parkings are others now
			}
		}
		c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
	}
	c.WaitFor(t, time.Minute, "every event on its topic or dead-lettered", func(recs []*kgo.Record) bool {
		on, dead := seqs(t, recs, d.topic), seqs(t, recs, d.dead)
		for k, evs := range events {
			for _, ev := range evs {
				if !slices.Contains(on[k], ev.seq) && !slices.Contains(dead[k], ev.seq) {
					return false
				}
			}
		}
		return true
	})
	c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
	m.check(t, events, seqs(t, c.Records, d.topic), seqs(t, c.Records, d.dead), mode == config.DeliveryExactlyOnce)
}

// deleteRecords deletes every record of topic's partition, as a retention
// or an operator's DeleteRecords does, and says up to where.
func deleteRecords(t *testing.T, adm *kadm.Client, topic string, partition int32) string {
	t.Helper()
	ctx := context.Background()
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	end, ok := ends.Lookup(topic, partition)
	if !ok || end.Err != nil {
		t.Fatalf("end offset of %s/%d: %v", topic, partition, end.Err)
	}
	o := kadm.Offsets{}
	o.Add(kadm.Offset{Topic: topic, Partition: partition, At: end.Offset})
	resp, err := adm.DeleteRecords(ctx, o)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("delete records of %s/%d: %v", topic, partition, err)
	}
	return fmt.Sprintf("below offset %d", end.Offset)
}

// redrive runs a redrive of what sel selects with opt, as cdc redrive
// does, and says what it did: "done", or each request's outcome.
func (m *detourModel) redrive(t *testing.T, p *pipeline.Pipeline, sel park.Selector, opt ops.RedriveOptions) string {
	t.Helper()
	req, err := p.Ops().Redrive(context.Background(), sel, opt)
	if err != nil {
		m.fail(t, "redrive %q: %v", sel.Key, err)
	}
	return m.watch(t, p, req)
}

// watch waits for redrive req to be done, and says what it did.
func (m *detourModel) watch(t *testing.T, p *pipeline.Pipeline, req ops.Redriving) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	used, err := p.Ops().WatchRedrive(ctx, req)
	if err != nil {
		m.fail(t, "redrive: %v", err)
	}
	if allDone(used) {
		return "done"
	}
	return fmt.Sprintf("%+v", used)
}

// check compares each key's sequences on its topic (on) and in the
// dead-letter topic (dead) with the events committed. Order is checked as
// a consumer needs it: wherever an event is on its topic, every earlier
// event of its key that was not dead-lettered is on the topic before it.
// That holds of first arrivals, and of each pass a rewind sends again.
func (m *detourModel) check(t *testing.T, events map[string][]*modelEvent, on, dead map[string][]int, once bool) {
	t.Helper()
	count := func(l []int, s int) int {
		n := 0
		for _, x := range l {
			if x == s {
				n++
			}
		}
		return n
	}
	for k, evs := range events {
		for _, ev := range evs {
			inDead, inOn := count(dead[k], ev.seq), count(on[k], ev.seq)
			switch {
			case inDead == 0 && inOn == 0:
				m.fail(t, "%s's event %d is in no topic: on %v, dead %v", k, ev.seq, on[k], dead[k])
			case ev.kind == "bad" && inOn > 0:
				m.fail(t, "%s's event %d, routed to the parked topic, is on its topic: %v", k, ev.seq, on[k])
			case ev.kind == "ok" && inDead > 0:
				m.fail(t, "%s's valid event %d was dead-lettered (only a parking's first, invalid, is dropped): dead %v", k, ev.seq, dead[k])
			case inDead > 0 && inOn > 0 && !ev.rewound:
				m.fail(t, "%s's event %d both on its topic and dead-lettered, and no rewind sent it again (it ended at %s): on %v, dead %v", k, ev.seq, ev.after, on[k], dead[k])
			case once && !ev.rewound && (inOn > 1 || inDead > 1):
				m.fail(t, "%s's event %d twice in exactly-once mode, and no rewind sent it again: on %v, dead %v", k, ev.seq, on[k], dead[k])
			}
		}
		seen := map[int]bool{}
		for i, s := range on[k] {
			if s < 1 || s > len(evs) {
				m.fail(t, "%s's event %d on its topic was never committed: %v", k, s, on[k])
			}
			for _, e := range evs[:s-1] {
				if !seen[e.seq] && count(dead[k], e.seq) == 0 {
					m.fail(t, "%s's event %d on its topic (at %d) before its event %d: on %v, dead-lettered %v", k, s, i, e.seq, on[k], dead[k])
				}
			}
			seen[s] = true
		}
	}
}
