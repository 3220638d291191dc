package pipeline_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/backfill"
	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/sink"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// Untrusted input (issue 24; rule 23): whoever may produce to the
// checkpoint topic, or write a logical decoding message, must not steer
// the connector.

// TestForgedBackfillRequestIsIgnored: a backfill request written straight
// to the checkpoint topic, unsigned and then signed with another key, and
// announced in the WAL by a role that may write logical decoding
// messages: its condition (which would fail loudly) never runs, no job
// starts, and cdc_backfill_requests_refused_total counts it.
func TestForgedBackfillRequestIsIgnored(t *testing.T) {
	kafka := testenv.NewKafka(t)
	e := newEnv(t, kafka)
	testenv.Exec(t, e.db, `CREATE FUNCTION spy() RETURNS bool LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'the forged condition ran'; END $$`)
	var logs lockedLog
	r := e.launch(t, &logs)
	testenv.Eventually(t, 30*time.Second, "the pipeline to stream", func() bool { return r.tracker.Load() != nil })

	key := checkpoint.Key("outbox_cdc", systemID(t, e.db))
	cl := kafka.Client(t)
	for i, secret := range []string{"", "another key that is at least 32 characters"} {
		req := checkpoint.BackfillRequest{ID: []string{"forged1", "forged2"}[i], Table: "public.outbox", Where: "spy()", RequestedAt: time.Now()}
		if secret != "" {
			req.Sign([]byte(secret), key)
		}
		v, _ := json.Marshal(req)
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: e.cfg.Checkpoint.Topic, Key: []byte(checkpoint.RequestKey(key, req.ID)), Value: v}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		sql, args := backfill.ControlMessage(req.ID)
		testenv.Exec(t, e.db, strings.Replace(strings.Replace(sql, "$1", "'"+args[0].(string)+"'", 1), "$2::text", "'"+args[1].(string)+"'", 1))
	}
	testenv.Eventually(t, 30*time.Second, "both requests refused", func() bool {
		return counterValue(r.p.Metrics().ForgedRequests) == 2
	})
	// An event after the announcements: the stream went past them.
	id := insertEvent(t, connect(t, e.db), "agg-1", "After")
	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.WaitFor(t, 30*time.Second, "the event after the forged requests", func(recs []*kgo.Record) bool { return ids(recs)[id] == 1 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	rec, _ := loadCheckpoint(t, e)
	if len(rec.Backfills) != 0 {
		t.Errorf("the checkpoint holds jobs %+v; want none", rec.Backfills)
	}
	if out := logs.String(); strings.Contains(out, "the forged condition ran") || !strings.Contains(out, "signature does not verify") {
		t.Errorf("log:\n%s\nwant the requests ignored, their condition never run", out)
	}
}

// TestForgedBackfillFailIsIgnored: while a signed backfill runs, another
// role writes a backfill-fail message for it (the job's ID is in cdc
// status; a first start's is first-start:<table>), without the runner's
// run id and then with a made-up one. The job runs to its end.
func TestForgedBackfillFailIsIgnored(t *testing.T) {
	kafka := testenv.NewKafka(t)
	db := testenv.Require(t, pg).NewDatabase(t)
	testenv.Exec(t, db, pollerSchema, `INSERT INTO event_outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', 'agg-' || (i % 10), 'old', jsonb_build_object('i', i) FROM generate_series(1, 4000) i`)
	e := &env{db: db, kafka: kafka, cfg: newEnvConfig(db, kafka)}
	e.cfg.Tables = []*outbox.Table{pollerTable(kafka.Prefix, &outbox.Backfill{ChunkSize: 20})}
	chunks := make(chan struct{}, 1000)
	e.onChunk = func(_, _ pglogrepl.LSN, _, _ int) { chunks <- struct{}{} }
	r := e.start(t)
	admin, err := pipeline.New(e.cfg, hclog.NewNullLogger(), pipeline.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, err := admin.Ops().RequestBackfill(ctx, e.cfg.Tables[0], "")
	if err != nil {
		t.Fatal(err)
	}
	<-chunks // running
	for _, run := range []string{"", "0123456789abcdef"} {
		b, _ := json.Marshal(map[string]string{"type": "backfill-fail", "run": run, "job": req.ID, "error": "forged"})
		testenv.Exec(t, db, "SELECT pg_logical_emit_message(true, '"+decode.ControlPrefix+"', '"+string(b)+"')")
	}
	job, err := admin.Ops().WatchBackfill(ctx, req, func(checkpoint.Backfill) {})
	if err != nil {
		t.Fatalf("the backfill ended on %v; want it to run to its end", err)
	}
	if job.Rows != 4000 || job.Error != "" {
		t.Errorf("job: %d rows, error %q; want 4000 rows and no error", job.Rows, job.Error)
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
}

// lockedLog is a log output the test reads while the pipeline writes it.
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// counterValue is a counter's value.
func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// TestRowRoutedToCheckpointTopic: a role with INSERT on the outbox writes a
// row whose aggregate type routes it, through the template, into the
// checkpoint topic, keyed like a backfill request. Nothing reaches that
// topic: with on_invalid: dead-letter the row goes to the dead-letter
// topic, with fail the connector stops naming the checkpoint topic; and a
// record someone else wrote there (not JSON) is skipped and counted when
// the checkpoint is loaded, not fatal.
func TestRowRoutedToCheckpointTopic(t *testing.T) {
	for _, policy := range []string{outbox.OnInvalidDeadLetter, outbox.OnInvalidFail} {
		t.Run(policy, func(t *testing.T) {
			kafka := testenv.NewKafka(t)
			e := newEnv(t, kafka)
			e.cfg.Checkpoint.Topic = kafka.Prefix + "checkpoints"
			e.cfg.Tables[0].Topic = kafka.Prefix + "{aggregate_type}"
			e.cfg.Tables[0].OnInvalid = policy
			e.cfg.Tables[0].DeadLetterTopic = kafka.Prefix + "dead-letters"
			cl := kafka.Client(t)
			// Someone else's record in the checkpoint topic, before the start.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := checkpoint.OpenStore(ctx, e.cfg.Checkpoint.Topic, sink.ClientOpts(sink.Config{Brokers: kafka.Brokers}, hclog.NewNullLogger()), hclog.NewNullLogger()); err != nil {
				t.Fatal(err)
			}
			if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: e.cfg.Checkpoint.Topic, Key: []byte("outbox_cdc/1"), Value: []byte("not json")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
			r := e.start(t)
			if n := counterValue(r.p.Metrics().ForeignRecords); n < 1 {
				t.Errorf("cdc_checkpoint_foreign_records_total = %v after a record that is not a checkpoint; want at least 1", n)
			}
			conn := connect(t, e.db)
			key := checkpoint.RequestKey(checkpoint.Key("outbox_cdc", systemID(t, e.db)), "routed")
			if _, err := conn.Exec(context.Background(), `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'E', '{"id": "routed", "table": "public.outbox", "where": "true"}')`,
				"checkpoints", key); err != nil {
				t.Fatal(err)
			}
			c := kafka.NewConsumer(t, kafka.AllTopics())
			if policy == outbox.OnInvalidDeadLetter {
				c.WaitFor(t, 30*time.Second, "the row in the dead-letter topic", func(recs []*kgo.Record) bool {
					for _, rec := range recs {
						if rec.Topic == e.cfg.Tables[0].DeadLetterTopic && strings.Contains(testenv.Header(rec, "dead_letter_error"), "checkpoint topic") {
							return true
						}
					}
					return false
				})
			} else {
				err := waitFatal(t, r)
				if err == nil || !strings.Contains(err.Error(), "checkpoint topic") {
					t.Fatalf("Run returned %v; want it to stop naming the checkpoint topic", err)
				}
			}
			c.Settle(500 * time.Millisecond)
			for _, rec := range c.Records {
				if rec.Topic == e.cfg.Checkpoint.Topic && string(rec.Key) == key {
					t.Fatalf("the row reached the checkpoint topic, keyed %s", rec.Key)
				}
			}
		})
	}
}

// TestUnknownBackfillRequestIsPassedOver: any role can write a WAL message
// naming a request that nobody wrote. The stream passes over it at once
// (it once waited for the request until a timeout, failed the session, and
// read the same message again after every restart).
func TestUnknownBackfillRequestIsPassedOver(t *testing.T) {
	kafka := testenv.NewKafka(t)
	e := newEnv(t, kafka)
	var logs lockedLog
	r := e.launch(t, &logs)
	testenv.Eventually(t, 30*time.Second, "the pipeline to stream", func() bool { return r.tracker.Load() != nil })
	sql, args := backfill.ControlMessage("nobody-wrote-this")
	testenv.Exec(t, e.db, strings.Replace(strings.Replace(sql, "$1", "'"+args[0].(string)+"'", 1), "$2::text", "'"+args[1].(string)+"'", 1))
	id := insertEvent(t, connect(t, e.db), "agg-1", "After")
	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.WaitFor(t, 10*time.Second, "the event after the unknown request", func(recs []*kgo.Record) bool { return ids(recs)[id] == 1 })
	if n := counterValue(r.p.Metrics().Restarts); n != 0 {
		t.Errorf("%v sessions restarted; want none", n)
	}
	if !strings.Contains(logs.String(), "ignored a backfill request that cdc backfill did not write") {
		t.Errorf("log:\n%s\nwant the unknown request named as ignored", logs.String())
	}
}

// TestBackfillDataErrorEndsTheJob: a condition that fails on a row's value
// part-way (the value changed after the request) ends the job, instead of
// retrying it for ever, and the checkpoint keeps the SQLSTATE, not the
// server's message, which quotes the value.
func TestBackfillDataErrorEndsTheJob(t *testing.T) {
	kafka := testenv.NewKafka(t)
	db := testenv.Require(t, pg).NewDatabase(t)
	testenv.Exec(t, db, pollerSchema, `INSERT INTO event_outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', 'agg-' || (i % 10), 'old', jsonb_build_object('n', i) FROM generate_series(1, 4000) i`)
	e := &env{db: db, kafka: kafka, cfg: newEnvConfig(db, kafka)}
	e.cfg.Tables = []*outbox.Table{pollerTable(kafka.Prefix, &outbox.Backfill{ChunkSize: 20})}
	e.start(t)
	admin, err := pipeline.New(e.cfg, hclog.NewNullLogger(), pipeline.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, err := admin.Ops().RequestBackfill(ctx, e.cfg.Tables[0], "(payload->>'n')::int > 0")
	if err != nil {
		t.Fatal(err)
	}
	// The last row, which the job reaches last, no longer has a number.
	testenv.Exec(t, db, `UPDATE event_outbox SET payload = '{"n": "secret-value"}' WHERE id = 4000`)
	job, err := admin.Ops().WatchBackfill(ctx, req, func(checkpoint.Backfill) {})
	if err == nil || !job.Done() {
		t.Fatalf("the job: %+v, %v; want it ended on the bad value", job, err)
	}
	if !strings.Contains(job.Error, "SQLSTATE 22P02") || strings.Contains(job.Error, "secret-value") {
		t.Errorf("the checkpoint keeps %q; want the SQLSTATE and not the row's value", job.Error)
	}
}
