package pipeline_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestSkipOfATooLargeEventKeepsItWhole pins that every table's
// dead_letter_topic takes kafka.dead_letter_max_message_bytes, an
// on_invalid: fail table's too (rule 36: a dead-letter topic too small for
// the event it must take is a defect of the remedy). Found by an attack;
// it failed before its fix. The default table (on_invalid: fail) stops on
// an event larger than kafka.max_message_bytes, and the error names the
// remedy, cdc skip, which sends it to the table's dead-letter topic. Only
// the dead-letter topics of dead-letter and park tables had the larger
// limit (config.Config.Producer); a fail table's kept
// kafka.max_message_bytes, the very limit the event broke, so its dead
// letter was cut (relay.Sender.letter: route.TruncateDeadLetter) and the
// payload the slot then moved past was lost.
//
// Expected: the skipped event is whole in the dead-letter topic
// (dead_letter_max_message_bytes is 1 MiB here).
func TestSkipOfATooLargeEventKeepsItWhole(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Kafka.MaxMessageBytes = 4096
	e.cfg.Kafka.DeadLetterMaxMessageBytes = 1 << 20
	e.cfg.Tables[0].DeadLetterTopic = e.kafka.Prefix + "dead-letters"
	r := e.start(t)
	conn := testenv.Connect(t, e.db)
	big, _ := insertEventTx(t, conn, "order", "p-1", "X", `jsonb_build_object('pad', repeat('x', 6000))`)
	after := insertEvent(t, conn, "p-1", "After")
	err := waitFatal(t, r)
	var ee *outbox.EventError
	if !errors.As(err, &ee) || ee.EventID != big {
		t.Fatalf("Run returned %v; want the large event's error", err)
	}
	if _, err := e.newPipeline(t).Ops().Skip(context.Background(), ee.CommitLSN, big); err != nil {
		t.Fatal(err)
	}
	e.start(t)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	c.WaitFor(t, time.Minute, "the large event dead-lettered and the event after it", func(recs []*kgo.Record) bool {
		return ids(recs)[after] == 1 && len(deadLetters(recs, e.cfg.Tables[0].DeadLetterTopic, big)) == 1
	})
	dl := deadLetters(c.Records, e.cfg.Tables[0].DeadLetterTopic, big)[0]
	if cut := testenv.Header(dl, route.HeaderDeadLetterTruncated); cut != "" || len(dl.Value) < 6000 {
		t.Fatalf("cdc skip of an event too large for kafka.max_message_bytes (4096), on a fail table, with dead_letter_max_message_bytes 1 MiB: its dead letter is cut (%q, %d bytes kept): the payload the slot moved past is lost", cut, len(dl.Value))
	}
}
