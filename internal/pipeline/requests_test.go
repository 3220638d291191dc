package pipeline_test

import (
	"encoding/json"
	"regexp"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestForgedAnnouncementWhileTheFollowerLagsEndsNoSession pins that an
// announced id the requests' follower cannot look up in time (its fetches
// of the checkpoint topic failing) is refused within the look-up's short
// timeout, and the stream goes on: no session restarted, which would meet
// the same announcement again. Any role can announce an id
// (pg_logical_emit_message).
//
// The test first lets the follower's fetches fail with no announcement
// (the control: nothing happens), then again with one forged
// announcement of an unknown id (the fault removed 20 s later).
func TestForgedAnnouncementWhileTheFollowerLagsEndsNoSession(t *testing.T) {
	kafka := testenv.NewFakeKafka(t)
	e := newEnv(t, kafka)
	r := e.start(t)
	c := kafka.NewConsumer(t, "^"+regexp.QuoteMeta(kafka.Prefix+"outbox.event.")+".*$")
	conn := testenv.Connect(t, e.db)
	lag := func() *kfake.FaultHandle {
		return kafka.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Fetch}, Topic: e.cfg.Checkpoint.Topic, Err: kerr.NotLeaderForPartition, Count: -1})
	}
	deliver := func(what string) time.Duration {
		t.Helper()
		start := time.Now()
		id := insertEvent(t, conn, "agg-1", what)
		c.WaitFor(t, time.Minute, what, func(recs []*kgo.Record) bool { return ids(recs)[id] == 1 })
		return time.Since(start)
	}
	deliver("Before")
	// The control: the follower lags, nobody announces anything.
	h := lag()
	time.Sleep(2 * time.Second)
	if d := deliver("Control"); d > 15*time.Second {
		h.Remove()
		t.Fatalf("with the follower lagging and no announcement, an event took %s: the test's fault stalls the stream by itself", d)
	}
	h.Remove()
	if n := counterValue(r.p.Metrics().Restarts); n != 0 {
		t.Fatalf("%v sessions restarted with the follower lagging and no announcement: the test's fault ends sessions by itself", n)
	}
	// The attack: the follower lags, and any role announces one unknown id.
	h = lag()
	defer h.Remove()
	time.AfterFunc(20*time.Second, h.Remove) // the follower catches up 20 s later
	time.Sleep(2 * time.Second)
	testenv.Exec(t, e.db, `SELECT pg_logical_emit_message(true, '`+decode.ControlPrefix+`', '{"type": "redrive-request", "id": "redrive-nobody-wrote-this"}')`)
	d := deliver("After")
	restarts := counterValue(r.p.Metrics().Restarts)
	// The look-up's 5 s and room for a loaded machine (two suites side
	// by side): before, the look waited 15 s, failed the session, and the
	// next met it again (19 s), which the restart shows too.
	if d > 17*time.Second || restarts != 0 {
		t.Fatalf("one forged announcement, with the requests' follower behind: the event after it took %s, %v sessions restarted; want the id refused and the stream going on", d.Round(time.Second), restarts)
	}
}

// TestReplayedRedriveAfterTheLedgerForgotItRunsTwice pins that a request
// taken runs once however small the checkpoint's share for the ledger
// (kafka.max_message_bytes / 8: here 2048 bytes, three or four requests
// with a refusal's outcome): the ledger forgets no request that could
// still be admitted (request.LedgerKeeps), cutting outcomes instead. An
// operator's --drop-first redrive R1, refused (an event behind is
// invalid), then four more requests; announced again by anyone within
// its 10 minutes, after the operator fixed both causes and means to keep
// event 1, R1 is refused as taken: K stays parked, nothing dead-lettered.
func TestReplayedRedriveAfterTheLedgerForgotItRunsTwice(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	r := d.start(t)
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	d.emit(t, conn, "K", 1, "", true)
	d.emit(t, conn, "K", 2, `"topic": 7`, false)
	d.emit(t, conn, "K", 3, "", false)
	d.waitParked(t, c, "K", 3, 3)
	used := d.redrive(t, park.Selector{Key: "K"}, true, false)
	if allDone(used) {
		t.Fatalf("redrive --drop-first with event 2 invalid: %+v; want it refused", used)
	}
	r1 := used[0].ID
	for i := 0; i < 4; i++ { // a few more requests, each refused
		if used := d.redrive(t, park.Selector{Key: "K"}, false, false); allDone(used) {
			t.Fatalf("redrive: %+v", used)
		}
	}
	rec, _ := loadCheckpoint(t, d.env)
	remembered := false
	for _, u := range rec.Used {
		remembered = remembered || u.ID == r1
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	// The operator fixes both causes, and means to keep event 1 now.
	d.cfg.Kafka.MaxMessageBytes = 1 << 20
	d.route(`has(payload.topic) && type(payload.topic) == string ? payload.topic : "` + d.topic + `"`)
	r = d.start(t)
	// Anyone announces R1 again, within its 10 minutes.
	b, _ := json.Marshal(map[string]string{"type": park.ControlRequest, "id": r1})
	testenv.Exec(t, d.db, `SELECT pg_logical_emit_message(true, '`+decode.ControlPrefix+`', '`+string(b)+`')`)
	d.emit(t, conn, "L", 1, "", false)
	c.WaitFor(t, time.Minute, "the event after the replayed announcement", func(recs []*kgo.Record) bool {
		return len(seqs(t, recs, d.topic)["L"]) == 1
	})
	c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
	if dl := seqs(t, c.Records, d.dead)["K"]; len(dl) != 0 {
		t.Fatalf("the --drop-first request %s, taken once and refused, ran again when anyone announced it again (the checkpoint remembered it: %v; it keeps %d requests, not 64): K's dead letters %v, K on its topic %v",
			r1, remembered, len(rec.Used), dl, seqs(t, c.Records, d.topic)["K"])
	}
	_ = r
}
