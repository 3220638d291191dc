package pipeline_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestTruncatedDeadLetterUnderRetention (found by the attack on issue 53):
// an event too large for its topic and for the dead-letter topic went
// there cut to fit, counted as delivered, and retention then deleted its
// row, the only whole copy. Under retention the connector stops on it with
// the remedy, the row stays; with the limit raised the dead letter is
// whole.
func TestTruncatedDeadLetterUnderRetention(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	d.tbl.OnInvalid, d.tbl.ParkedTopic = outbox.OnInvalidDeadLetter, ""
	d.cfg.Kafka.DeadLetterMaxMessageBytes = 8192
	d.tbl.Retention = &outbox.Retention{After: time.Second}
	d.retentionInterval = 200 * time.Millisecond
	r := d.start(t)
	conn := testenv.Connect(t, d.db)
	id := d.emit(t, conn, "K", 1, "", true) // 20 kB: too large for both
	err, ok := waitStop(r, time.Minute)
	if !ok {
		r.stop(t)
		t.Fatal("the connector kept running past an event whose dead letter would be cut, under retention")
	}
	if err == nil || !strings.Contains(err.Error(), "kafka.dead_letter_max_message_bytes") || !strings.Contains(err.Error(), id) {
		t.Fatalf("stopped with %v; want the event %s named and the remedy", err, id)
	}
	var n int
	testenv.QueryRow(t, d.db, `SELECT count(*) FROM outbox WHERE id::text = $1`, []any{id}, &n)
	if n != 1 {
		t.Fatalf("the row of the event whose dead letter would be cut: %d left, want 1", n)
	}
	d.cfg.Kafka.DeadLetterMaxMessageBytes = 65536
	r = d.start(t)
	defer r.stop(t)
	c := d.consumer(t)
	c.WaitFor(t, time.Minute, "K's dead letter", func(recs []*kgo.Record) bool {
		return slices.ContainsFunc(recs, func(rec *kgo.Record) bool { return rec.Topic == d.dead })
	})
	for _, rec := range c.Records {
		if rec.Topic != d.dead {
			continue
		}
		if cut := testenv.Header(rec, route.HeaderDeadLetterTruncated); cut != "" || !strings.Contains(string(rec.Value), strings.Repeat("x", 20000)) {
			t.Fatalf("K's dead letter after the limit was raised: cut %q, %d bytes; want it whole", cut, len(rec.Value))
		}
	}
}
