package pipeline_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestRedriveAnnouncedAfterAnEventOfItsTransaction (found by the attack on
// issue 53): a redrive settles what came before it with Kafka, in
// exactly-once mode a commit, and saves the checkpoint at the last whole
// transaction. Announced by an application after an outbox event of the
// same transaction, it committed that event in Kafka while the checkpoint
// said the transaction was still to come: a crash then, and the event was
// sent twice. Such an announcement is not taken; the request is left as it
// was, and its announcement in a transaction of its own (cdc redrive's)
// runs it.
func TestRedriveAnnouncedAfterAnEventOfItsTransaction(t *testing.T) {
	d := newDetour(t, config.DeliveryExactlyOnce)
	r := d.start(t)
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	d.emit(t, conn, "K", 1, "", true)
	d.emit(t, conn, "K", 2, "", false)
	p := d.waitParked(t, c, "K", 2, 2)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	d.cfg.Kafka.MaxMessageBytes = 1 << 20 // the cause fixed
	r = d.start(t)
	defer r.stop(t)
	// The request, signed, in the checkpoint topic, as cdc redrive writes
	// it; its announcement is the test's to make.
	key := checkpoint.Key("outbox_cdc", systemID(t, d.db))
	req := park.Request{ID: park.RequestPrefix + "in-an-app-transaction", Parkings: []park.Ref{{Key: p.Key, Episode: p.Episode}}, RequestedAt: time.Now()}
	req.Sign(d.cfg.Checkpoint.SigningKeys[0], key)
	v, _ := json.Marshal(req)
	if err := d.kafka.Client(t).ProduceSync(context.Background(), &kgo.Record{Topic: d.cpt, Key: []byte(checkpoint.RequestKey(key, req.ID)), Value: v}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	announcement, _ := json.Marshal(decode.Control{Type: park.ControlRequest, ID: req.ID})
	tx, err := conn.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(context.Background(), `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'L', 'E', '{"k": "L", "seq": 1}')`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(context.Background(), `SELECT pg_logical_emit_message(true, $1, $2::text)`, decode.ControlPrefix, string(announcement)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	c.WaitFor(t, time.Minute, "L's event", func(recs []*kgo.Record) bool { return len(seqs(t, recs, d.topic)["L"]) == 1 })
	c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
	if on := seqs(t, c.Records, d.topic)["K"]; len(on) != 0 {
		t.Fatalf("K on its topic %v after an announcement behind an event of its transaction; want it parked still", on)
	}
	if rec, _ := loadCheckpoint(t, d.env); rec.FindUsed(req.ID) != nil || len(rec.Parked) != 1 {
		t.Fatalf("after the announcement behind an event: used %+v, parked %+v; want the request untaken, K parked", rec.FindUsed(req.ID), rec.Parked)
	}
	testenv.Exec(t, d.db, `SELECT pg_logical_emit_message(true, '`+decode.ControlPrefix+`', '`+string(announcement)+`')`)
	c.WaitFor(t, time.Minute, "K redriven", func(recs []*kgo.Record) bool { return len(seqs(t, recs, d.topic)["K"]) >= 2 })
	c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
	if on := seqs(t, c.Records, d.topic); len(on["K"]) != 2 || on["K"][0] != 1 || on["K"][1] != 2 || len(on["L"]) != 1 {
		t.Fatalf("on the topic: %v; want K 1, 2 and L 1, each once", on)
	}
}
