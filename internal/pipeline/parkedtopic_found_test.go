package pipeline_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// Parked topics that are not what they were when a key parked (rules 33
// and 36): one deleted and made again, one a table's parked_topic no
// longer names. Found by an attack; each failed before its fix.

// TestAcceptGapSendsWhatTheRemadeParkedTopicHolds pins that a redrive
// finds every record of a parking the parked topic holds, wherever its
// offsets begin. A parking reads its records by offset from p.Start, the
// parked topic's end when it began (relay/park.go park). The parked topic
// is deleted and made again (same partitions) while a key is parked, with
// other records before the parking's: the new topic's offsets start at 0,
// below Start. The key's next event parks behind, at offset 0 of the new
// topic. cdc redrive --accept-gap ("send what the topic still holds and
// accept the loss", docs/operations.md) read only from Start to the end,
// which is nothing, so it sent nothing and un-parked the key: the event
// parked after the topic was made again, which the topic does hold and the
// slot is past, was in no topic for consumers. Now a pass that finds
// records missing reads again from where the partition begins
// (redrive.Runner.scan).
//
// Expected: K's event 3 (parked into the new topic) and 4 (after the
// redrive) on K's topic, in order.
func TestAcceptGapSendsWhatTheRemadeParkedTopicHolds(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	adm := kadm.NewClient(d.kafka.Client(t))
	ctx := context.Background()
	if _, err := adm.CreateTopic(ctx, 1, -1, nil, d.parked); err != nil {
		t.Fatal(err)
	}
	r := d.start(t)
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	d.emit(t, conn, "A", 1, "", true) // another key's parking first: K's starts past offset 0
	for s := 2; s <= 5; s++ {
		d.emit(t, conn, "A", s, "", false)
	}
	d.waitParked(t, c, "A", 5, 5)
	d.emit(t, conn, "K", 1, "", true)
	d.emit(t, conn, "K", 2, "", false)
	if p := d.waitParked(t, c, "K", 2, 2); p.Start == 0 {
		t.Fatalf("K's parking starts at offset 0; the test needs it past A's records")
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if _, err := adm.DeleteTopic(ctx, d.parked); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the parked topic made again, with 1 partition", func() bool {
		_, err := adm.CreateTopic(ctx, 1, -1, nil, d.parked)
		return err == nil
	})
	d.start(t)
	c = d.consumer(t) // the first one's positions are past the new topic's end
	d.emit(t, conn, "K", 3, "", false)
	d.waitParked(t, c, "K", 3, 3)
	used := d.redrive(t, park.Selector{Key: "K"}, false, true)
	if !allDone(used) {
		t.Fatalf("redrive --accept-gap: %+v", used)
	}
	d.emit(t, conn, "K", 4, "", false)
	c.WaitFor(t, time.Minute, "K's event 4 on its topic", func(recs []*kgo.Record) bool { return slices.Contains(seqs(t, recs, d.topic)["K"], 4) })
	c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
	if got := seqs(t, c.Records, d.topic)["K"]; !slices.Equal(got, []int{3, 4}) {
		t.Fatalf("K on its topic after --accept-gap: %v; want [3 4]: event 3 was parked into the topic made again (%s), which holds it, and the redrive (%s) sent nothing of it",
			got, d.parked, used[0].Outcome)
	}
}

// TestFormerParkedTopicTakesParkedRecordsOfItsSize pins that a topic a
// parking holds records in takes parked records as large as today's
// parked topics do. A table's parked_topic changed while a key is parked
// in the former one: the parking keeps its topic (docs/security.md "One
// gate"), and the key's later events go there. The gate's limit for a
// parked record is its topic's, kafka.dead_letter_max_message_bytes for a
// parked topic (docs/config.md parked_topic); only today's parked topics
// had it (config.Config.Producer), so the former one had
// kafka.max_message_bytes, and the key's next event, too large for its own
// topic (why it parks behind as an event, for a redrive to route again),
// could not join its parking: the connector stopped. Now each session gives
// the topics of the checkpoint's parkings the parked limit
// (sink.Kafka.HoldParked).
//
// Expected: K's second event parks behind its first, in the former parked
// topic (created with max.message.bytes = dead_letter_max_message_bytes),
// and the stream goes on.
func TestFormerParkedTopicTakesParkedRecordsOfItsSize(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	r := d.start(t)
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	d.emit(t, conn, "K", 1, "", true)
	d.waitParked(t, c, "K", 1, 1)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	d.tbl.ParkedTopic = d.kafka.Prefix + "outbox.parked-new" // K's parking stays in the former one
	r = d.start(t)
	d.emit(t, conn, "K", 2, "", true) // too large for its topic as well
	d.emit(t, conn, "L", 1, "", false)
	c.WaitFor(t, time.Minute, "L's event", func(recs []*kgo.Record) bool {
		select {
		case err := <-r.done:
			close(r.done)
			t.Fatalf("the connector stopped on K's second event, which should join K's parking in the former parked topic %s: %v", d.parked, err)
		default:
		}
		return len(seqs(t, recs, d.topic)["L"]) == 1
	})
	d.waitParked(t, c, "K", 2, 2)
}
