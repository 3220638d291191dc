package replay

import (
	"strings"
	"testing"

	"github.com/outboxcdc/cdc/internal/outbox"
)

// TestReplayFilterNeedsAMappedField: a filter on a field that none of the
// replayed sources maps is refused before anything is read, naming the
// flag; a JSON string (a message source's member) matches by its text.
func TestReplayFilterNeedsAMappedField(t *testing.T) {
	cols := outbox.DefaultColumns
	cols[outbox.FieldAggregateType] = ""
	unmapped := &outbox.Table{Name: outbox.TableName{Schema: "public", Name: "commands"}, Columns: cols}
	_, err := Request{AggregateTypes: []string{"order"}}.fieldFilters([]*outbox.Table{unmapped})
	if err == nil || !strings.Contains(err.Error(), "--aggregate-type: none of the replayed sources maps aggregate_type") {
		t.Fatalf("err = %v", err)
	}
	ffs, err := Request{EventTypes: []string{"Paid"}}.fieldFilters([]*outbox.Table{unmapped})
	if err != nil || len(ffs) != 1 {
		t.Fatalf("event type filter: %v, %d filters", err, len(ffs))
	}
	var ev outbox.Event
	for _, tc := range []struct {
		v    outbox.Value
		want bool
	}{
		{outbox.Value{B: []byte("Paid"), Kind: outbox.KindText}, true},
		{outbox.Value{B: []byte(`"Paid"`), Kind: outbox.KindJSON}, true},
		{outbox.Value{B: []byte("Created"), Kind: outbox.KindText}, false},
		{outbox.Value{}, false}, // NULL
	} {
		ev.Fields[outbox.FieldEventType] = tc.v
		if got := ffs[0].matches(&ev); got != tc.want {
			t.Errorf("event type %q (kind %d): match %v, want %v", tc.v.B, tc.v.Kind, got, tc.want)
		}
	}
}
