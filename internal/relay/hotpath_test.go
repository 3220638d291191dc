package relay

import (
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/sink"
)

// pgoutput protocol 1 messages, written byte by byte as the PostgreSQL
// documentation lays them out ("Logical Replication Message Formats").
func pgBegin(final uint64, xid uint32) []byte {
	b := []byte{'B'}
	b = binary.BigEndian.AppendUint64(b, final)
	b = binary.BigEndian.AppendUint64(b, uint64(time.Hour.Microseconds()))
	return binary.BigEndian.AppendUint32(b, xid)
}

func pgCommit(commit, end uint64) []byte {
	b := []byte{'C', 0}
	b = binary.BigEndian.AppendUint64(b, commit)
	b = binary.BigEndian.AppendUint64(b, end)
	return binary.BigEndian.AppendUint64(b, uint64(time.Hour.Microseconds()))
}

func pgRelation(id uint32, cols []string, oids []uint32) []byte {
	b := binary.BigEndian.AppendUint32([]byte{'R'}, id)
	b = append(b, "public\x00outbox\x00d"...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(cols)))
	for i, c := range cols {
		b = append(b, 0)
		b = append(b, c...)
		b = append(b, 0)
		b = binary.BigEndian.AppendUint32(b, oids[i])
		b = binary.BigEndian.AppendUint32(b, 0xffffffff)
	}
	return b
}

func pgInsert(rel uint32, vals ...string) []byte {
	b := binary.BigEndian.AppendUint32([]byte{'I'}, rel)
	b = append(b, 'N')
	b = binary.BigEndian.AppendUint16(b, uint16(len(vals)))
	for _, v := range vals {
		b = append(b, 't')
		b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
		b = append(b, v...)
	}
	return b
}

// hotPath is what the replication loop does for each 1-row transaction
// of the default outbox layout, up to the Kafka record: decode BEGIN,
// INSERT and COMMIT, route the event and pass its record through the gate
// (gate.go).
type hotPath struct {
	s                     *Sender
	dec                   *decode.Decoder
	begin, insert, commit []byte
}

func newHotPath(t testing.TB) *hotPath { return newHotPathSized(t, 0) }

// fakeKafka is a producer to an in-process cluster that has topics, made
// (EnsureTopic) so that the gate knows them.
func fakeKafka(t testing.TB, topics ...string) *sink.Kafka {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cfg := sink.Config{Brokers: c.ListenAddrs()}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	k, err := sink.New(cfg, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	for _, topic := range topics {
		if err := k.EnsureTopic(context.Background(), topic); err != nil {
			t.Fatal(err)
		}
	}
	return k
}

// newHotPathSized is newHotPath with a payload of size bytes, or the
// benchmarks' usual 120 when size is 0.
func newHotPathSized(t testing.TB, size int) *hotPath { return newHotPathTable(t, size, nil) }

// withExpressions is the table of the expressions' benchmark: a filter
// and a key that read the payload, the key the template's own.
func withExpressions(tbl *outbox.Source) {
	tbl.Filter = `payload.i != 0`
	tbl.Key, tbl.Expressions.Key = "", `"agg-" + string(payload.i)`
}

// newHotPathTable is newHotPathSized with the table changed by mod.
func newHotPathTable(t testing.TB, size int, mod func(*outbox.Source)) *hotPath {
	tbl := &outbox.Source{Name: outbox.TableName{Schema: "public", Name: "outbox"}, Columns: outbox.DefaultColumns, Topic: outbox.DefaultTopic}
	if mod != nil {
		mod(tbl)
	}
	if err := tbl.Validate(); err != nil {
		t.Fatal(err)
	}
	r, err := route.New([]*outbox.Source{tbl})
	if err != nil {
		t.Fatal(err)
	}
	s := &Sender{Router: r, Kafka: fakeKafka(t, "outbox.event.order"), CheckpointTopic: "outbox-cdc.checkpoints",
		Blocking: func(fn func() error) error { return fn() }}
	dec := decode.New([]*outbox.Source{tbl})
	payload := `{"i": 417, "pad": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`
	if size > 0 {
		payload = `{"i": 417, "pad": "` + strings.Repeat("x", size-20) + `"}`
	}
	rel := pgRelation(16384, []string{"id", "aggregatetype", "aggregateid", "type", "payload"}, []uint32{2950, 25, 25, 25, 3802})
	if _, err := dec.Decode(rel); err != nil {
		t.Fatal(err)
	}
	return &hotPath{
		s:      s,
		dec:    dec,
		begin:  pgBegin(0x1000, 7),
		insert: pgInsert(16384, "5f0c7c1e-8b1a-4c57-9a51-3c3f2f1d9e01", "order", "agg-417", "OrderCreated", payload),
		commit: pgCommit(0x1000, 0x1040),
	}
}

func (h *hotPath) run(t testing.TB) {
	for _, data := range [][]byte{h.begin, h.insert, h.commit} {
		m, err := h.dec.Decode(data)
		if err != nil {
			t.Fatal(err)
		}
		if m.Kind != decode.KindEvent {
			continue
		}
		rec, _, err := h.s.record(context.Background(), &m)
		if err == nil {
			err = h.s.admit(context.Background(), rec, KindEvent, &m.Event)
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec.Topic != "outbox.event.order" || string(rec.Key) != "agg-417" {
			t.Fatalf("record topic %q key %q", rec.Topic, rec.Key)
		}
	}
}

// BenchmarkHotPath: allocations per event from pgoutput bytes to the Kafka
// record (docs/benchmarks.md), without expressions and with a filter and a
// key expression that read the payload.
//
//	go test -run '^$' -bench HotPath -benchmem ./internal/relay
func BenchmarkHotPath(b *testing.B) {
	for _, size := range []int{0, 100_000} {
		for _, x := range []struct {
			name string
			mod  func(*outbox.Source)
		}{{"", nil}, {"/expressions=filter+key", withExpressions}} {
			name := "payload=120B"
			if size > 0 {
				name = fmt.Sprintf("payload=%dKB", size/1000)
			}
			b.Run(name+x.name, func(b *testing.B) {
				h := newHotPathTable(b, size, x.mod)
				b.ReportAllocs()
				for i := 0; i < b.N; i++ {
					h.run(b)
				}
			})
		}
	}
}

// bytesPerRun is how many bytes fn allocates per call, averaged over n.
func bytesPerRun(n int, fn func()) float64 {
	fn() // warm up: the decoder's first use of a relation
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := 0; i < n; i++ {
		fn()
	}
	runtime.ReadMemStats(&after)
	return float64(after.TotalAlloc-before.TotalAlloc) / float64(n)
}

// TestHotPathCopiesPayloadOnce: a 100 KB payload costs one copy of
// itself on the way from pgoutput bytes to the Kafka record, the one the
// record holds once the receive buffer is reused, and no more: under
// 1.2 payloads allocated per event, in the same 6 allocations.
func TestHotPathCopiesPayloadOnce(t *testing.T) {
	const size = 100_000
	h := newHotPathSized(t, size)
	if n := testing.AllocsPerRun(100, func() { h.run(t) }); n > 6 {
		t.Fatalf("%.1f allocations per 100 KB event; the budget is 6", n)
	}
	if got := bytesPerRun(200, func() { h.run(t) }); got > 1.2*size {
		t.Fatalf("%.0f bytes allocated per event with a %d-byte payload: the payload is copied %.1f times", got, size, got/size)
	}
}

// TestHotPathAllocations pins the allocation budget of the hot path: at
// most 6 per event from pgoutput bytes to the Kafka record.
func TestHotPathAllocations(t *testing.T) {
	h := newHotPath(t)
	if n := testing.AllocsPerRun(1000, func() { h.run(t) }); n > 6 {
		t.Fatalf("%.1f allocations per event from pgoutput to the Kafka record; the budget is 6", n)
	}
}

// TestHotPathAllocationsWithExpressions pins what a filter and a key
// expression that read the payload add to the hot path, at most 9
// allocations per event, and that a table without expressions pays
// nothing for them: 2, as before expressions existed (docs/benchmarks.md,
// "Expressions"). An event kept by the router while it evaluates once
// made every event escape to the heap: 1.5 KB and 3 allocations more.
func TestHotPathAllocationsWithExpressions(t *testing.T) {
	for _, tc := range []struct {
		mod    func(*outbox.Source)
		budget float64
	}{{nil, 2}, {withExpressions, 11}} {
		h := newHotPathTable(t, 0, tc.mod)
		if raceEnabled && tc.mod != nil {
			tc.budget++ // one more under -race: see raceEnabled
		}
		if n := testing.AllocsPerRun(1000, func() { h.run(t) }); n > tc.budget {
			t.Errorf("expressions %v: %.1f allocations per event; the budget is %v", tc.mod != nil, n, tc.budget)
		}
	}
}
