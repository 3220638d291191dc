package pipeline_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/ops"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestDetourModel (issue 53, rules 32, 33 and 36): a generator, not only
// examples. A seeded draw of steps (events of a few keys, valid, too large
// for their topic or routed to the parked topic; restarts; redrives of a
// key, of a table or of every key, with --drop-first, --drop-invalid or
// neither, and with the connector restarted under it; the size limit
// raised) runs against a parking table in both delivery modes. At the end
// the causes are fixed and every parking redriven until none is left, and
// each key's consumer-visible sequence is checked against the model: every
// committed event on its topic or, only by --drop-first and only an
// invalid one, in the dead-letter topic; on its topic in commit order
// (first arrivals); none twice in exactly-once mode.
//
// CDC_MODEL_SEED replays a seed, CDC_MODEL_STEPS sets the steps (40; make
// chaos and make soak run more).
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
	keys := []string{"A", "B", "C"}
	events := map[string][]modelEvent{}
	r := d.start(t)
	defer func() { r.stop(t) }()
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	rd := d.newPipeline(t) // the redrive command's, one for the run
	raised := false
	restart := func(why string) {
		t.Helper()
		if err := r.stop(t); err != nil {
			m.fail(t, "stop (%s): %v", why, err)
		}
		r = d.start(t)
	}
	parkedKeys := func() []string {
		rec, _ := loadCheckpoint(t, d.env)
		var out []string
		for _, p := range rec.Parked {
			out = append(out, p.Key)
		}
		return out
	}
	for range steps {
		switch n := m.rng.IntN(100); {
		case n < 65:
			k := keys[m.rng.IntN(len(keys))]
			ev := modelEvent{seq: len(events[k]) + 1, kind: "ok"}
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
			d.emit(t, conn, k, ev.seq, extra, ev.kind == "big")
			events[k] = append(events[k], ev)
			m.step("emit %s %d %s", k, ev.seq, ev.kind)
		case n < 75:
			m.step("restart")
			restart("a step")
		case n < 78 && !raised: // rare: a raised limit leaves only one kind invalid
			raised = true
			d.cfg.Kafka.MaxMessageBytes = 1 << 20
			m.step("raise the limit, restart")
			restart("the limit raised")
		default:
			// On what the checkpoint lists once every event so far is in.
			c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
			parked := parkedKeys()
			if len(parked) == 0 {
				m.step("redrive: nothing parked")
				continue
			}
			sel := park.Selector{Key: parked[m.rng.IntN(len(parked))]}
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
	total := 0
	for _, evs := range events {
		total += len(evs)
	}
	// Every committed event reached its topic, the dead-letter topic or a
	// parking before the redrives begin.
	c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
	for round := 0; ; round++ {
		parked := parkedKeys()
		if len(parked) == 0 {
			break
		}
		if round > 4*total+8 {
			m.fail(t, "still parked after %d rounds of redrives: %v", round, parked)
		}
		// What an operator does: a redrive; where an event is invalid
		// still, one that drops what nobody will fix.
		for _, k := range parked {
			out := m.redrive(t, rd, park.Selector{Key: k}, ops.RedriveOptions{})
			m.step("end: redrive %s: %s", k, out)
			if out != "done" {
				m.step("end: redrive %s --drop-invalid: %s", k, m.redrive(t, rd, park.Selector{Key: k}, ops.RedriveOptions{DropInvalid: true}))
			}
		}
	}
	c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
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
// dead-letter topic (dead) with the events committed.
func (m *detourModel) check(t *testing.T, events map[string][]modelEvent, on, dead map[string][]int, once bool) {
	t.Helper()
	for k, evs := range events {
		var want []int // on the topic, in commit order: what was not dropped
		for _, ev := range evs {
			inDead := slices.Contains(dead[k], ev.seq)
			switch {
			case ev.kind == "bad" && !inDead:
				m.fail(t, "%s's event %d, routed to the parked topic, is not in the dead-letter topic: on %v, dead %v", k, ev.seq, on[k], dead[k])
			case ev.kind == "ok" && inDead:
				m.fail(t, "%s's valid event %d was dead-lettered (only a parking's first, invalid, is dropped): dead %v", k, ev.seq, dead[k])
			case !inDead:
				want = append(want, ev.seq)
			}
			if inDead && slices.Contains(on[k], ev.seq) {
				m.fail(t, "%s's event %d both on its topic and dead-lettered: on %v, dead %v", k, ev.seq, on[k], dead[k])
			}
		}
		var first []int
		for _, s := range on[k] {
			if !slices.Contains(first, s) {
				first = append(first, s)
			} else if once {
				m.fail(t, "%s's event %d on its topic twice in exactly-once mode: %v", k, s, on[k])
			}
		}
		if !slices.Equal(first, want) {
			m.fail(t, "%s on its topic (first arrivals) %v, want %v (all: %v; dead-lettered %v)", k, first, want, on[k], dead[k])
		}
		if once && len(dead[k]) != len(slices.Compact(slices.Sorted(slices.Values(dead[k])))) {
			m.fail(t, "%s dead-lettered twice in exactly-once mode: %v", k, dead[k])
		}
	}
}
