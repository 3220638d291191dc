package pipeline_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxcdc/cdc/internal/backfill"
	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/request"
	"github.com/outboxcdc/cdc/internal/route"
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
	var logs testenv.Buffer
	r := e.launch(t, &logs)
	testenv.Eventually(t, 30*time.Second, "the pipeline to stream", func() bool { return r.tracker.Load() != nil })

	key := checkpoint.Key("outbox_cdc", systemID(t, e.db))
	cl := kafka.Client(t)
	for i, secret := range []string{"", "another key that is at least 32 characters"} {
		req := checkpoint.Request{ID: []string{"forged1", "forged2"}[i], Table: "public.outbox", Where: "spy()", RequestedAt: time.Now()}
		if secret != "" {
			req.Sign([]byte(secret), key)
		}
		v, _ := json.Marshal(req)
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: e.cfg.Checkpoint.Topic, Key: []byte(checkpoint.RequestKey(key, req.ID)), Value: v}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		sql, args := decode.ControlMessage(req.ID)
		testenv.Exec(t, e.db, strings.Replace(strings.Replace(sql, "$1", "'"+args[0].(string)+"'", 1), "$2::text", "'"+args[1].(string)+"'", 1))
	}
	testenv.Eventually(t, 30*time.Second, "both requests refused", func() bool {
		return counterValue(r.p.Metrics().ForgedRequests) == 2
	})
	// An event after the announcements: the stream went past them.
	id := insertEvent(t, testenv.Connect(t, e.db), "agg-1", "After")
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
	e.cfg.Tables = []*outbox.Source{pollerTable(kafka.Prefix, &outbox.BackfillOptions{ChunkSize: 20})}
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
	job, err := admin.Ops().WatchBackfill(ctx, req, func(checkpoint.Job) {})
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
			conn := testenv.Connect(t, e.db)
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
			c.Settle(t)
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
	var logs testenv.Buffer
	r := e.launch(t, &logs)
	testenv.Eventually(t, 30*time.Second, "the pipeline to stream", func() bool { return r.tracker.Load() != nil })
	sql, args := decode.ControlMessage("nobody-wrote-this")
	testenv.Exec(t, e.db, strings.Replace(strings.Replace(sql, "$1", "'"+args[0].(string)+"'", 1), "$2::text", "'"+args[1].(string)+"'", 1))
	id := insertEvent(t, testenv.Connect(t, e.db), "agg-1", "After")
	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.WaitFor(t, time.Minute, "the event after the unknown request", func(recs []*kgo.Record) bool { return ids(recs)[id] == 1 })
	if n := counterValue(r.p.Metrics().Restarts); n != 0 {
		t.Errorf("%v sessions restarted; want none", n)
	}
	if !strings.Contains(logs.String(), "ignored a backfill request that the checkpoint topic does not hold") {
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
	// In keyset chunks of order_by id, the job reads the last row last (a
	// Cursor, in commit order, reads every row's condition at its start).
	e.cfg.Tables = []*outbox.Source{pollerTable(kafka.Prefix, &outbox.BackfillOptions{OrderBy: []string{"id"}, ChunkSize: 20})}
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
	job, err := admin.Ops().WatchBackfill(ctx, req, func(checkpoint.Job) {})
	if err == nil || !job.Done() {
		t.Fatalf("the job: %+v, %v; want it ended on the bad value", job, err)
	}
	if !strings.Contains(job.Error, "SQLSTATE 22P02") || strings.Contains(job.Error, "secret-value") {
		t.Errorf("the checkpoint keeps %q; want the SQLSTATE and not the row's value", job.Error)
	}
}

// forgeJob writes a copy of the pipeline's latest checkpoint record with an
// unfinished job of the forger's added, under the same key, as a principal
// that may produce to the checkpoint topic can, while the connector is
// stopped.
func forgeJob(t *testing.T, e *env, where string) {
	t.Helper()
	rec, ok := loadCheckpoint(t, e)
	if !ok {
		t.Fatal("no checkpoint to copy")
	}
	rec.Backfills = append(rec.Backfills, checkpoint.Job{ID: "f00df00df00df00d", Table: "public.outbox", Where: where, Started: time.Now()})
	v, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.kafka.Client(t).ProduceSync(context.Background(), &kgo.Record{Topic: e.cfg.Checkpoint.Topic, Key: []byte(rec.Key()), Value: v}).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// TestForgedCheckpointRecordRunsNothing (issue 37): a principal that may
// produce to the checkpoint topic copies the latest record, adds an
// unfinished job with a condition of its own (which would fail loudly,
// and would store its message in the checkpoint), and writes it under the
// same key while the connector is stopped. With
// checkpoint.signing_key_file, the record is not signed: it is skipped
// and counted, and the last genuine record stands. Without a key, the
// record is taken, but the job is no signed request's: refused and
// counted. Either way the condition never runs, and the stream goes on.
func TestForgedCheckpointRecordRunsNothing(t *testing.T) {
	for _, signed := range []bool{true, false} {
		t.Run(map[bool]string{true: "records signed", false: "no signing key"}[signed], func(t *testing.T) {
			kafka := testenv.NewKafka(t)
			e := newEnv(t, kafka)
			if !signed {
				e.cfg.Checkpoint.SigningKeys = nil
			}
			testenv.Exec(t, e.db, `CREATE FUNCTION public.spy() RETURNS bool LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'the forged condition ran'; END $$`)
			r := e.start(t)
			insertEvent(t, testenv.Connect(t, e.db), "agg-1", "Before")
			kafka.NewConsumer(t, kafka.AllTopics()).WaitCount(t, 30*time.Second, 1)
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
			forgeJob(t, e, "public.spy()")

			var logs testenv.Buffer
			r = e.launch(t, &logs)
			testenv.Eventually(t, 30*time.Second, "the pipeline to stream", func() bool { return r.tracker.Load() != nil })
			id := insertEvent(t, testenv.Connect(t, e.db), "agg-1", "After")
			c := kafka.NewConsumer(t, kafka.AllTopics())
			c.WaitFor(t, 30*time.Second, "the event after the forged record", func(recs []*kgo.Record) bool { return ids(recs)[id] == 1 })
			if signed {
				testenv.Eventually(t, time.Minute, "the record counted as foreign", func() bool { return counterValue(r.p.Metrics().ForeignRecords) >= 1 })
			} else {
				testenv.Eventually(t, time.Minute, "the job counted as refused", func() bool { return counterValue(r.p.Metrics().ForgedRequests) == 1 })
			}
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
			out := logs.String()
			if strings.Contains(out, "the forged condition ran") || strings.Contains(out, "backfill starting") {
				t.Errorf("log:\n%s\nwant the forged job never started", out)
			}
			rec, _ := loadCheckpoint(t, e)
			for _, j := range rec.Backfills {
				if j.ID == "f00df00df00df00d" && (signed || !strings.Contains(out, "ignored a backfill job in the checkpoint")) {
					t.Errorf("the checkpoint %s the forged job %+v", map[bool]string{true: "took", false: "kept, without refusing,"}[signed], j)
				}
			}
		})
	}
}

// TestReplayedBackfillRequestRunsNothing (issue 37): any role may write a
// logical decoding message, and so announce again the id of a request cdc
// backfill wrote long ago (the request stays in the checkpoint topic).
// Announced within checkpoint.RequestMaxAge, the job is still in the
// checkpoint (finished jobs are kept that long, however many ran since):
// passed over. A request older than that, signed and all, is refused when
// announced. Either way no row is sent again.
func TestReplayedBackfillRequestRunsNothing(t *testing.T) {
	kafka := testenv.NewKafka(t)
	db := testenv.Require(t, pg).NewDatabase(t)
	testenv.Exec(t, db, pollerSchema, `INSERT INTO event_outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', 'agg-' || (i % 3), 'old', '{}' FROM generate_series(1, 5) i`)
	e := &env{db: db, kafka: kafka, cfg: newEnvConfig(db, kafka)}
	e.cfg.Tables = []*outbox.Source{pollerTable(kafka.Prefix, nil)}
	r := e.start(t)
	admin, err := pipeline.New(e.cfg, hclog.NewNullLogger(), pipeline.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Twelve backfills: more than the ten finished jobs a checkpoint
	// used to keep, so the first one's job would be forgotten.
	var first backfill.Requested
	for i := 0; i < 12; i++ {
		req, err := admin.Ops().RequestBackfill(ctx, e.cfg.Tables[0], "")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Ops().WatchBackfill(ctx, req, func(checkpoint.Job) {}); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = req
		}
	}
	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.WaitCount(t, time.Minute, 60)
	announce := func(id string) {
		sql, args := decode.ControlMessage(id)
		testenv.Exec(t, db, strings.Replace(strings.Replace(sql, "$1", "'"+args[0].(string)+"'", 1), "$2::text", "'"+args[1].(string)+"'", 1))
	}
	announce(first.ID)

	// A request made long ago, written and signed with the real key: as
	// if it had been announced then, and its job forgotten since.
	key := checkpoint.Key("outbox_cdc", systemID(t, db))
	stale := checkpoint.Request{ID: "stale-request", Table: e.cfg.Tables[0].String(), RequestedAt: time.Now().Add(-time.Hour)}
	stale.Sign(e.cfg.Checkpoint.SigningKeys[0], key)
	v, _ := json.Marshal(stale)
	if err := kafka.Client(t).ProduceSync(ctx, &kgo.Record{Topic: e.cfg.Checkpoint.Topic, Key: []byte(checkpoint.RequestKey(key, stale.ID)), Value: v}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	announce(stale.ID)
	testenv.Eventually(t, 30*time.Second, "the stale request refused", func() bool { return counterValue(r.p.Metrics().ForgedRequests) == 1 })
	var id string
	testenv.QueryRow(t, db, `INSERT INTO event_outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'agg-1', 'After', '{}') RETURNING id::text`, nil, &id)
	c.WaitFor(t, 30*time.Second, "the event after the announcements", func(recs []*kgo.Record) bool { return ids(recs)[id] == 1 })
	c.SettleConfirmed(t, time.Minute, db, "outbox_cdc")
	if len(c.Records) != 61 {
		t.Fatalf("%d records; want the 60 the twelve backfills sent and the one event, nothing sent again", len(c.Records))
	}
}

// TestAnnouncementFloodDoesNotStallTheStream (issues 37 and 54): any role
// may announce backfill and redrive request ids at will; thousands of
// unknown ones cost the replication loop a few look-ups of the checkpoint
// topic a second (counted at the broker), not one each: the event
// committed after them arrives, and the look-ups stay within the budget
// (request.LookupsPerSecond) for however long the flood took to read.
func TestAnnouncementFloodDoesNotStallTheStream(t *testing.T) {
	kafka := testenv.NewFakeKafka(t)
	e := newEnv(t, kafka)
	var logs testenv.Buffer
	e.logOut = &logs
	r := e.start(t)
	var lookups atomic.Int64
	counting := time.Now()
	kafka.Fake.ControlKey(int16(kmsg.ListOffsets), func(kmsg.Request) (kmsg.Response, error, bool) {
		kafka.Fake.KeepControl()
		lookups.Add(1)
		return nil, nil, false
	})
	// Backfill and redrive announcements alike (a pipeline without a park
	// table included): one way in, one budget.
	testenv.Exec(t, e.db, `SELECT pg_logical_emit_message(true, '`+decode.ControlPrefix+`', json_build_object('type', 'backfill-request', 'id', 'flood-' || i)::text) FROM generate_series(1, 3000) i`)
	testenv.Exec(t, e.db, `SELECT pg_logical_emit_message(true, '`+decode.ControlPrefix+`', json_build_object('type', 'redrive-request', 'id', 'redrive-flood-' || i)::text) FROM generate_series(1, 3000) i`)
	id := insertEvent(t, testenv.Connect(t, e.db), "agg-1", "After")
	c := kafka.NewConsumer(t, kafka.AllTopics())
	// A loop that waited for the budget at each id would take 6,000 /
	// LookupsPerSecond (20 minutes); a minute tells it apart from one
	// that reads the flood at whatever pace the machine allows.
	c.WaitFor(t, time.Minute, "the event after the flood", func(recs []*kgo.Record) bool { return ids(recs)[id] == 1 })
	if n := counterValue(r.p.Metrics().Restarts); n != 0 {
		t.Errorf("%v sessions restarted", n)
	}
	// The budget: a bucket of LookupsPerSecond, refilled at that rate,
	// for the time the counting lasted; and a few look-ups of the
	// consumer's and the session's own (where each partition starts).
	const own = 10
	n := lookups.Load()
	elapsed := time.Since(counting)
	if budget := int64(float64(request.LookupsPerSecond)*(1+elapsed.Seconds())) + own; n > budget {
		t.Errorf("%d look-ups of the checkpoint topic's end in %s for 6,000 unknown announcements; the budget allows %d", n, elapsed.Round(time.Millisecond), budget)
	}
	t.Logf("%d look-ups in %s", n, elapsed.Round(time.Millisecond))
	// Nor does it flood the log (a line a refused id, 6,000 lines, until
	// the attack on the gate): a few a minute, and every one counted.
	reg := r.p.Metrics().Registry
	if b, rd := testenv.Counter(t, reg, "cdc_requests_refused_total", "kind", "backfill"), testenv.Counter(t, reg, "cdc_requests_refused_total", "kind", "redrive"); b != 3000 || rd != 3000 {
		t.Errorf("cdc_requests_refused_total: backfill %v, redrive %v; want 3,000 each", b, rd)
	}
	lines := strings.Count(logs.String(), "request that the checkpoint topic does not hold") + strings.Count(logs.String(), "too many to look up")
	if minutes := int(elapsed/time.Minute) + 1; lines > request.MaxRefusalLines*(minutes+1) {
		t.Errorf("%d log lines of refused announcements in %s; want at most %d a minute", lines, elapsed.Round(time.Millisecond), request.MaxRefusalLines)
	}
}

// TestRowProblemsAreDeadLettered (issue 37): with on_invalid: dead-letter,
// whatever a row's content causes is that row's problem, and the stream
// goes on: a topic name the brokers refuse (a collision), a dead letter
// larger than kafka.dead_letter_max_message_bytes (cut and marked), and
// 10,000 distinct aggregate types past tables[].max_topics, which create
// no topic and no metric series beyond the bound.
func TestRowProblemsAreDeadLettered(t *testing.T) {
	kafka := testenv.NewFakeKafka(t)
	e := newEnv(t, kafka)
	tbl := e.cfg.Tables[0]
	tbl.Topic = kafka.Prefix + "{aggregate_type}"
	tbl.MaxTopics = 3
	tbl.OnInvalid = outbox.OnInvalidDeadLetter
	tbl.DeadLetterTopic = kafka.Prefix + "dead-letters"
	e.cfg.Kafka.MaxMessageBytes = 10000
	e.cfg.Kafka.DeadLetterMaxMessageBytes = 20000
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
		msg := "Topic '" + refused + "' collides with existing topic: " + kafka.Prefix + "col_lides"
		rt.ErrorMessage = &msg
		resp.Topics = append(resp.Topics, rt)
		return resp, nil, true
	})
	r := e.start(t)
	conn := testenv.Connect(t, e.db)
	insertEventTx(t, conn, "order", "a-1", "Created", `'{}'`) // a topic of its own: 1 of 3
	collided, _ := insertEventTx(t, conn, "col.lides", "a-2", "Created", `'{}'`)
	huge, _ := insertEventTx(t, conn, "order", "a-3", "Huge",
		`jsonb_build_object('blob', (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 2000)))`)
	testenv.Exec(t, e.db, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
		SELECT 'type' || i, 'a-' || i, 'Created', '{}' FROM generate_series(1, 10000) i`)
	after, _ := insertEventTx(t, conn, "order", "a-4", "After", `'{}'`)

	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.WaitFor(t, 2*time.Minute, "the event after the problems, and 10,001 dead letters", func(recs []*kgo.Record) bool {
		dead := 0
		for _, rec := range recs {
			if rec.Topic == tbl.DeadLetterTopic {
				dead++
			}
		}
		return ids(recs)[after] == 1 && dead >= 10001
	})
	c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
	dead := map[string]*kgo.Record{}
	topics := map[string]bool{}
	for _, rec := range c.Records {
		topics[rec.Topic] = true
		if rec.Topic == tbl.DeadLetterTopic {
			dead[testenv.Header(rec, route.HeaderDeadLetterID)] = rec
		}
	}
	if rec := dead[collided]; rec == nil || !strings.Contains(testenv.Header(rec, route.HeaderDeadLetterError), "the brokers refuse topic") {
		t.Errorf("the event whose topic the brokers refuse: %v; want it dead-lettered with the broker's reason", rec)
	}
	if rec := dead[huge]; rec == nil || testenv.Header(rec, route.HeaderDeadLetterTruncated) == "" || sink.RecordSize(rec) > 20000 {
		t.Errorf("the event too large even to dead-letter: %v; want a dead letter cut to fit and marked", rec)
	}
	// One of the 10,000 types fits under max_topics: "order" and the
	// refused name took the others.
	if over := len(dead) - 2; over != 9999 {
		t.Errorf("%d events dead-lettered past max_topics, want 9,999", over)
	}
	if n := len(topics); n > 4 {
		t.Errorf("records in %d topics: %v; want at most max_topics (3) and the dead-letter topic", n, topics)
	}
	series := 0
	fams, _ := r.p.Metrics().Registry.Gather()
	for _, f := range fams {
		if f.GetName() == "cdc_events_total" {
			series = len(f.GetMetric())
		}
	}
	if series > 3 {
		t.Errorf("%d series of cdc_events_total; want one per template and dead-letter topic", series)
	}
	if n := counterValue(r.p.Metrics().Restarts); n != 0 {
		t.Errorf("%v sessions restarted: a row's problem stopped the stream", n)
	}
}

// TestBackfillReaderRole (issue 37): with backfill.reader_role, a
// condition runs as a role that may only read the outbox table: one that
// reads another table is refused by Postgres (and the checkpoint keeps
// only the SQLSTATE), while the first start's backfill, which reads in the
// slot's snapshot as that role, sends every row.
func TestBackfillReaderRole(t *testing.T) {
	kafka := testenv.NewKafka(t)
	db := testenv.Require(t, pg).NewDatabase(t)
	reader := fmt.Sprintf("cdc_reader_%d", time.Now().UnixNano())
	testenv.Exec(t, db, pollerSchema, `CREATE TABLE secrets (v text)`, `INSERT INTO secrets VALUES ('hunter2')`,
		`INSERT INTO event_outbox (aggregate_type, aggregate_id, event_type, payload) SELECT 'order', 'agg-' || (i % 3), 'old', '{}' FROM generate_series(1, 50) i`,
		`CREATE ROLE `+reader+` NOLOGIN`, `GRANT SELECT ON event_outbox TO `+reader)
	t.Cleanup(func() { testenv.Exec(t, db, `DROP OWNED BY `+reader, `DROP ROLE `+reader) })
	e := &env{db: db, kafka: kafka, cfg: newEnvConfig(db, kafka)}
	e.cfg.Tables = []*outbox.Source{pollerTable(kafka.Prefix, &outbox.BackfillOptions{ChunkSize: 20})}
	e.cfg.Backfill.ReaderRole = reader
	e.start(t)
	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.WaitCount(t, time.Minute, 50)
	admin, err := pipeline.New(e.cfg, hclog.NewNullLogger(), pipeline.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = admin.Ops().RequestBackfill(ctx, e.cfg.Tables[0], "EXISTS (SELECT 1 FROM public.secrets WHERE v = 'hunter2')")
	if err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("a condition reading another table as the reader role: %v; want permission denied", err)
	}
}
