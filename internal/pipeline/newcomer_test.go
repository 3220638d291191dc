package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/replay"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/setup"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// A newcomer's first hour (issue 39): the advice every error gives works
// as written.

// TestPoisonEventAdviceWorks: an event the connector cannot deliver stops
// it (on_invalid: fail). The error says an UPDATE of the row changes
// nothing, and it does not: the same error comes back. What it says to run
// instead, cdc skip with the event's LSN and id, sends that one event to
// the dead-letter topic, with why, and the stream goes on; the event after
// it arrives, and the next poison event stops it again.
func TestPoisonEventAdviceWorks(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Tables[0].DeadLetterTopic = e.kafka.Prefix + "dead-letters"
	r := e.start(t)
	conn := testenv.Connect(t, e.db)
	poison, _ := insertEventTx(t, conn, "bad/type", "p-1", "X", `'{}'`)
	after := insertEvent(t, conn, "p-1", "After")
	err := waitFatal(t, r)
	var ee *outbox.EventError
	if !errors.As(err, &ee) || ee.EventID != poison {
		t.Fatalf("Run returned %v; want the poison event's error", err)
	}
	skip := fmt.Sprintf("cdc skip --lsn %s --id %s", ee.CommitLSN, poison)
	for _, want := range []string{skip, "An UPDATE of the row changes nothing", "on_invalid: dead-letter"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error:\n%v\nwant it to say %q", err, want)
		}
	}

	// What does not work: fixing the row.
	testenv.Exec(t, e.db, `UPDATE outbox SET aggregatetype = 'order' WHERE id = '`+poison+`'`)
	err = waitFatal(t, e.launch(t, discard{}))
	if !errors.As(err, &ee) || ee.EventID != poison {
		t.Fatalf("after an UPDATE of the row: %v; want the same error (the INSERT is in the WAL)", err)
	}

	// What the error says to run.
	admin, err := pipeline.New(e.cfg, hclog.NewNullLogger(), pipeline.Options{})
	if err != nil {
		t.Fatal(err)
	}
	topic, err := admin.Ops().Skip(context.Background(), ee.CommitLSN, poison)
	if err != nil || topic != e.cfg.Tables[0].DeadLetterTopic {
		t.Fatalf("cdc skip: %q, %v", topic, err)
	}
	e.start(t)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	c.WaitFor(t, time.Minute, "the poison event dead-lettered and the event after it", func(recs []*kgo.Record) bool {
		return ids(recs)[after] == 1 && len(deadLetters(recs, e.cfg.Tables[0].DeadLetterTopic, poison)) == 1
	})
	dl := deadLetters(c.Records, e.cfg.Tables[0].DeadLetterTopic, poison)[0]
	reason := testenv.Header(dl, route.HeaderDeadLetterError)
	if !strings.Contains(reason, "bad/type") || !strings.Contains(reason, "cdc skip") || strings.Contains(reason, "To go on") {
		t.Errorf("dead letter reason %q; want why, that cdc skip sent it, and no advice", reason)
	}
	// The skip was for that one event: the next one stops again.
	insertEventTx(t, conn, "bad/again", "p-2", "X", `'{}'`)
	testenv.Eventually(t, time.Minute, "the skip to be dropped from the checkpoint", func() bool {
		rec, _ := loadCheckpoint(t, e)
		return len(rec.Skips) == 0
	})
}

func deadLetters(recs []*kgo.Record, topic, id string) []*kgo.Record {
	var out []*kgo.Record
	for _, r := range recs {
		if r.Topic == topic && testenv.Header(r, route.HeaderDeadLetterID) == id {
			out = append(out, r)
		}
	}
	return out
}

// TestMissingColumnsAllAtOnce: a table whose columns are named otherwise
// than the config's defaults (aggregate_type, aggregate_id, event_type)
// is reported in one error, with every missing column and a columns:
// block to paste; a camelCase column comes quoted, as the config must
// write it. The block, pasted, works.
func TestMissingColumnsAllAtOnce(t *testing.T) {
	db := testenv.Require(t, pg).NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text, "aggregateId" text, event_type text, payload jsonb)`)
	kafka := testenv.NewKafka(t)
	cfg := newEnvConfig(db, kafka)
	p, err := pipeline.New(cfg, hclog.NewNullLogger(), pipeline.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Ops().Check(context.Background())
	var ce *setup.CheckError
	if !errors.As(err, &ce) {
		t.Fatalf("check: %v; want a CheckError", err)
	}
	want := `outbox table public.outbox has no column aggregatetype, aggregateid, type;`
	block := `columns: {aggregate_type: aggregate_type, aggregate_id: '"aggregateId"', event_type: event_type}`
	if len(ce.Problems) != 1 || !strings.Contains(ce.Problems[0], want) || !strings.Contains(ce.Problems[0], block) {
		t.Fatalf("problems:\n%s\nwant one that says %q and suggests %q", strings.Join(ce.Problems, "\n"), want, block)
	}
	// Pasted as it is.
	cfg.Tables[0].Columns[outbox.FieldAggregateType] = "aggregate_type"
	cfg.Tables[0].Columns[outbox.FieldAggregateID] = "aggregateId"
	cfg.Tables[0].Columns[outbox.FieldEventType] = "event_type"
	e := &env{db: db, kafka: kafka, cfg: cfg}
	e.start(t)
	var id string
	testenv.QueryRow(t, db, `INSERT INTO outbox (aggregate_type, "aggregateId", event_type, payload) VALUES ('order', 'a-1', 'Created', '{}') RETURNING id::text`, nil, &id)
	kafka.NewConsumer(t, kafka.AllTopics()).WaitFor(t, time.Minute, "the event", func(recs []*kgo.Record) bool { return ids(recs)[id] == 1 })
}

var _ = pglogrepl.LSN(0)

// TestDroppedSlotLosslessWayFirst: a slot dropped while the connector is
// stopped, with a replay window that still holds the WAL from the
// checkpoint: the refusal offers cdc rewind to the checkpoint's position
// first, and following it loses nothing: the event committed while the
// connector was stopped arrives, once.
func TestDroppedSlotLosslessWayFirst(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Replay.Window = time.Hour
	r := e.start(t)
	conn := testenv.Connect(t, e.db)
	first := insertEvent(t, conn, "a-1", "Before")
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	c.WaitFor(t, time.Minute, "the first event", func(recs []*kgo.Record) bool { return ids(recs)[first] == 1 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	missed := insertEvent(t, conn, "a-1", "WhileStopped")
	testenv.Exec(t, e.db, `SELECT pg_drop_replication_slot('outbox_cdc')`)
	err := waitFatal(t, e.launch(t, discard{}))
	rec, _ := loadCheckpoint(t, e)
	want := fmt.Sprintf("cdc rewind --config <config file> --to-lsn %s", rec.Confirmed)
	if err == nil || !strings.Contains(err.Error(), want) || strings.Index(err.Error(), "cdc rewind") > strings.Index(err.Error(), "cdc reset") {
		t.Fatalf("the refusal: %v; want it to offer %q before cdc reset", err, want)
	}
	admin, err := pipeline.New(e.cfg, hclog.NewNullLogger(), pipeline.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Ops().Rewind(context.Background(), replay.Range{FromLSN: rec.Confirmed}); err != nil {
		t.Fatalf("the rewind it offers: %v", err)
	}
	e.start(t)
	c.WaitFor(t, time.Minute, "the event committed while the slot was gone", func(recs []*kgo.Record) bool { return ids(recs)[missed] == 1 })
	c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
	if n := ids(c.Records)[first]; n != 1 {
		t.Errorf("the event before the checkpoint arrived %d times, want once", n)
	}
}

// TestFirstStartSaysWhatItWaitsFor: a session left idle in a transaction
// that wrote keeps a first start's slot creation waiting. The connector
// says so, naming the session's pid, in the log and /readyz, every few
// seconds, and streams once the transaction ends.
func TestFirstStartSaysWhatItWaitsFor(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	ctx := context.Background()
	leak := testenv.Connect(t, e.db)
	tx, err := leak.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO other (note) VALUES ('left open')`); err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	var logs testenv.Buffer
	r := e.launch(t, &logs)
	want := fmt.Sprintf("pid %d, idle in transaction", pid)
	testenv.Eventually(t, 30*time.Second, "the first start to say what it waits for", func() bool {
		_, detail := r.p.Ready()
		return strings.Contains(detail, want) && strings.Contains(logs.String(), "pg_terminate_backend")
	})
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the pipeline to stream once the transaction ended", func() bool { return r.tracker.Load() != nil })
}
