package backfill

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/request"
	"github.com/outboxcdc/cdc/internal/tableread"
)

// The watermark state machine without Postgres: what a chunk sends at its
// high watermark, and what the checkpoint notes (docs/design.md,
// "Backfill").

func testTable() *outbox.Source {
	return &outbox.Source{Name: outbox.TableName{Schema: "public", Name: "outbox"}, Columns: outbox.DefaultColumns}
}

var testColumns = []decode.Column{{Name: "id", TypeOID: 25}, {Name: "aggregatetype", TypeOID: 25}, {Name: "aggregateid", TypeOID: 25}, {Name: "type", TypeOID: 25}, {Name: "payload", TypeOID: 25}}

func row(id string) [][]byte {
	return [][]byte{[]byte(id), []byte("order"), []byte("a-" + id), []byte("created"), []byte(`{"n":1}`)}
}

// chunkOf sets up job's chunk n as the runner does before its low
// watermark.
func chunkOf(t *testing.T, b *Jobs, tbl *outbox.Source, job string, n int) *liveChunk {
	t.Helper()
	dec, err := decode.NewRowDecoder(tbl, testColumns)
	if err != nil {
		t.Fatal(err)
	}
	ch := &liveChunk{run: b.Run(), job: job, n: n, table: tbl, dec: dec, total: 3, until: []string{"3"}, done: make(chan struct{})}
	b.setChunk(ch)
	return ch
}

func TestWatermarksSendWhatTheStreamDidNot(t *testing.T) {
	tbl := testTable()
	b := NewJobs()
	b.Reset([]checkpoint.Job{{ID: "j1", Table: tbl.String(), Started: time.Now()}})
	ch := chunkOf(t, b, tbl, "j1", 0)
	c := decode.Control{Type: decode.ControlLow, Run: b.Run(), Job: "j1", Chunk: 0}

	// A watermark of another run (an earlier session's, read again) opens
	// no window, and an event before the low watermark is not noted.
	b.Low(decode.Control{Type: decode.ControlLow, Run: "other", Job: "j1"}, 100)
	if b.window != nil {
		t.Fatal("another run's low watermark opened the window")
	}
	b.Low(c, 110)
	if b.window != ch || ch.low != 110 {
		t.Fatalf("the low watermark did not open the chunk's window: %+v", b.window)
	}
	// The stream sends row 2 between the watermarks; an event of another
	// table with the same id does not count.
	live := outbox.Event{Source: tbl}
	live.Fields[outbox.FieldID] = outbox.Value{B: []byte("2")}
	b.Seen(&live)
	other := outbox.Event{Source: &outbox.Source{Name: outbox.TableName{Schema: "public", Name: "other"}}}
	other.Fields[outbox.FieldID] = outbox.Value{B: []byte("3")}
	b.Seen(&other)

	b.setRows(ch, &tableread.Chunk{Rows: [][][]byte{row("1"), row("2"), row("3")}, Last: []string{"3"}, Final: true})
	high := decode.Control{Type: decode.ControlHigh, Run: b.Run(), Job: "j1", Chunk: 0}
	if _, ok, err := b.High(decode.Control{Type: decode.ControlHigh, Run: b.Run(), Job: "j1", Chunk: 1}, 120, time.Now()); ok || err != nil {
		t.Fatalf("another chunk's high watermark was taken: ok %v, err %v", ok, err)
	}
	at := time.Now()
	rows, ok, err := b.High(high, 120, at)
	if !ok || err != nil {
		t.Fatalf("High: ok %v, err %v", ok, err)
	}
	var ids []string
	for _, m := range rows {
		ids = append(ids, m.Event.ID())
		if m.Event.CommitLSN != 120 || !m.Event.CommitTime.Equal(at) {
			t.Errorf("row %s is not in the high watermark's transaction: %s at %v", m.Event.ID(), m.Event.CommitLSN, m.Event.CommitTime)
		}
	}
	if !slices.Equal(ids, []string{"1", "3"}) {
		t.Fatalf("the chunk sends %v; want 1 and 3 (the stream sent 2 in its place)", ids)
	}
	select {
	case <-ch.done:
		t.Fatal("the runner was let go before the rows were sent")
	default:
	}

	jobs, sent := b.Sent(len(rows))
	if want := (ChunkSent{Table: tbl.String(), Low: 110, High: 120, Read: 3, Sent: 2}); sent != want {
		t.Errorf("Sent = %+v, want %+v", sent, want)
	}
	if len(jobs) != 1 || jobs[0].Rows != 2 || !slices.Equal(jobs[0].After, []string{"3"}) || jobs[0].Total != 3 || !jobs[0].Done() {
		t.Errorf("the checkpoint note is %+v; want 2 rows after key 3 of 3, done", jobs)
	}
	select {
	case <-ch.done:
	default:
		t.Fatal("Sent did not let the runner go on")
	}
	if b.window != nil {
		t.Fatal("the window is still open after its high watermark")
	}
	if _, ok := b.next(); ok {
		t.Fatal("the finished job is still to run")
	}
}

func TestWatermarksFail(t *testing.T) {
	b := NewJobs()
	b.Reset([]checkpoint.Job{{ID: "j1", Table: "public.outbox"}})
	if _, ok := b.Fail(decode.Control{Type: decode.ControlFail, Run: "forged", Job: "j1", Error: "x"}); ok {
		t.Fatal("a failure another run wrote ended the job")
	}
	if _, ok := b.Fail(decode.Control{Type: decode.ControlFail, Run: b.Run(), Job: "nope", Error: "x"}); ok {
		t.Fatal("a failure of an unknown job was taken")
	}
	jobs, ok := b.Fail(decode.Control{Type: decode.ControlFail, Run: b.Run(), Job: "j1", Error: "SQLSTATE 42703"})
	if !ok || len(jobs) != 1 || !jobs[0].Done() || jobs[0].Error != "SQLSTATE 42703" {
		t.Fatalf("Fail = %+v, %v", jobs, ok)
	}
}

// TestTrustedJobs (issue 37): a checkpoint read back from the topic runs
// only the jobs that the configuration or a signed request started; a job
// someone wrote into a record (a copy of the latest with a condition of
// theirs) is refused, whatever it claims; a first start's job runs with
// the configuration's condition, whatever the record says.
func TestTrustedJobs(t *testing.T) {
	tbl := testTable()
	tbl.Backfill = &outbox.BackfillOptions{Where: "published_at IS NULL"}
	key := []byte("0123456789abcdef0123456789abcdef")
	req := checkpoint.Request{ID: "a1", Table: tbl.String(), Where: "true", RequestedAt: time.Now()}
	req.Sign(key, "slot/1")
	signedJob := checkpoint.Job{ID: req.ID, Table: req.Table, Where: req.Where, RequestedAt: req.RequestedAt, MAC: req.MAC}
	first := InitialJobs([]*outbox.Source{tbl}, true, nil)[0]
	tampered := signedJob
	tampered.Where = "public.seen()"
	forgedFirst := first
	forgedFirst.Where = "public.seen()"
	done := checkpoint.Job{ID: "old", Table: tbl.String(), Finished: time.Now()}
	for _, tc := range []struct {
		name string
		job  checkpoint.Job
		keys [][]byte
		ok   bool
	}{
		{"a signed request's", signedJob, [][]byte{key}, true},
		{"the first start's, as configured", first, nil, true},
		{"a finished one (runs nothing)", done, nil, true},
		{"a signed request's, condition changed", tampered, [][]byte{key}, false},
		{"unsigned", checkpoint.Job{ID: "f00df00df00df00d", Table: tbl.String(), Where: "public.seen()"}, [][]byte{key}, false},
		{"a signed request's, no key to check it", signedJob, nil, false},
		// Kept with the configuration's condition: the forged one never
		// runs, and an operator's edit continues the job.
		{"the first start's, another condition", forgedFirst, [][]byte{key}, true},
		{"the first start's, of a table not configured", checkpoint.Job{ID: "first-start:public.other", Table: "public.other"}, nil, false},
	} {
		kept, refused := Trusted([]checkpoint.Job{tc.job}, tc.keys, "slot/1", []*outbox.Source{tbl})
		if got := len(kept) == 1 && len(refused) == 0; got != tc.ok {
			t.Errorf("%s: kept %v refused %v; want kept %v", tc.name, kept, refused, tc.ok)
		}
		if len(kept) == 1 && configured(kept[0]) && !kept[0].Done() && kept[0].Where != tbl.Backfill.Where {
			t.Errorf("%s: kept with the condition %q; want the configuration's %q", tc.name, kept[0].Where, tbl.Backfill.Where)
		}
	}
}

// TestAdmit: a request package request admitted becomes a job for a
// configured table only, keeps its signature (so that read back from the
// checkpoint it still verifies) and wakes the runner. Its signature, age
// and announcement are request.Admit's (TestAdmitRefuses there).
func TestAdmit(t *testing.T) {
	tbl := testTable()
	key := []byte("0123456789abcdef0123456789abcdef")
	signed := func(table string) checkpoint.Request {
		r := checkpoint.Request{ID: "r-" + table, Table: table, Where: "true", RequestedAt: time.Now()}
		r.Sign(key, "slot/1")
		return r
	}
	b := NewJobs()
	b.Reset(nil)
	_, err := b.Admit(signed("public.secrets"), []*outbox.Source{tbl})
	var refused *request.Refused
	if !errors.As(err, &refused) || b.Has("r-public.secrets") {
		t.Fatalf("a table not configured: Admit = %v; want refused, and no job", err)
	}
	jobs, err := b.Admit(signed(tbl.String()), []*outbox.Source{tbl})
	if err != nil || len(jobs) != 1 || jobs[0].Table != tbl.String() || jobs[0].Where != "true" {
		t.Fatalf("Admit = %+v, %v", jobs, err)
	}
	if kept, refused := Trusted(jobs, [][]byte{key}, "slot/1", []*outbox.Source{tbl}); len(kept) != 1 || len(refused) != 0 {
		t.Fatalf("Trusted(the admitted job) = %v, %v", kept, refused)
	}
	select {
	case <-b.wake:
	default:
		t.Fatal("an admitted job did not wake the runner")
	}
}

// TestFinishedJobsOutliveRequests: a checkpoint record keeps a finished
// job for at least twice the age a request may be announced at, so that a
// request announced again while it could pass for new finds its job, and
// runs nothing twice.
func TestFinishedJobsOutliveRequests(t *testing.T) {
	if checkpoint.KeepFinished < 2*checkpoint.RequestMaxAge {
		t.Fatalf("checkpoint.KeepFinished is %s, less than twice RequestMaxAge (%s)", checkpoint.KeepFinished, checkpoint.RequestMaxAge)
	}
}
