package tablewatch

import (
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/metrics"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/setup"
	"github.com/outboxcdc/cdc/internal/tableread"
)

// TestNewFloorKeepsFreshEvents: the fresh events the stream noted of a
// table are what keeps a repair still to come from sending them again.
// A new Floor alone (checkFiles' message, without a snapshot) sent
// nothing, and must leave them; a repair that sent its snapshot forgets
// them. A new Floor forgot them: a swap found after it sent each event
// streamed before it a second time, out of order (found by review).
func TestNewFloorKeepsFreshEvents(t *testing.T) {
	src := &outbox.Source{Name: outbox.TableName{Schema: "public", Name: "outbox"}}
	rec := checkpoint.Record{Tables: map[string]checkpoint.Table{"public.outbox": {Rel: 10, Floor: 100, Files: map[uint32]uint32{10: 20}}}}
	w := New(Deps{Tables: []*outbox.Source{src}, Metrics: metrics.New("t"), Log: hclog.NewNullLogger()}, rec, setup.Catalog{})
	ev := &outbox.Event{Source: src}
	ev.Fields[outbox.FieldID] = outbox.Value{B: []byte("e1")}
	w.NoteFresh(ev)

	tables := w.Done(&Repair{ID: "floor", Table: src, Rel: 10, Floor: 200, Files: map[uint32]uint32{10: 21}}, nil)
	if st := tables["public.outbox"]; st.Floor != 200 || st.Files[10] != 21 || st.Rel != 10 {
		t.Fatalf("after a new Floor: %+v", st)
	}
	if _, ok := w.Fresh(src)["e1"]; !ok {
		t.Fatal("a new Floor forgot the fresh events a repair still to come needs")
	}
	tables = w.Done(&Repair{ID: "repair", Table: src, Rel: 11, Snap: &tableread.Snapshot{}}, nil)
	if st := tables["public.outbox"]; st.Floor != 0 || st.Files != nil || st.Rel != 11 {
		t.Fatalf("after a repair: %+v", st)
	}
	if len(w.Fresh(src)) != 0 {
		t.Fatal("a repair that sent its snapshot kept the fresh events")
	}
}
