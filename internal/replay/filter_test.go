package replay

import (
	"strings"
	"testing"
	"time"

	"github.com/outboxcdc/cdc/internal/outbox"
)

// TestReplayFilterNeedsAMappedField: a filter on a field that none of the
// replayed sources maps is refused before anything is read, naming the
// flag; a JSON string (a message source's member) matches by its text.
func TestReplayFilterNeedsAMappedField(t *testing.T) {
	cols := outbox.DefaultColumns
	cols[outbox.FieldAggregateType] = ""
	unmapped := &outbox.Source{Name: outbox.TableName{Schema: "public", Name: "commands"}, Columns: cols}
	_, err := Request{AggregateTypes: []string{"order"}}.fieldFilters([]*outbox.Source{unmapped})
	if err == nil || !strings.Contains(err.Error(), "--aggregate-type: none of the replayed sources maps aggregate_type") {
		t.Fatalf("err = %v", err)
	}
	ffs, err := Request{EventTypes: []string{"Paid"}}.fieldFilters([]*outbox.Source{unmapped})
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

// TestOutsideWindowNamesATimeInside: the first time the window holds is
// printed in whole seconds rounded up, so a --from-time of what the error
// says is inside the window.
func TestOutsideWindowNamesATimeInside(t *testing.T) {
	first := time.Date(2026, 11, 25, 15, 3, 14, 500_000_000, time.UTC)
	err := &OutsideWindowError{Asked: "2026-11-25T15:03:14Z", FirstTime: first, Window: time.Hour, ReplaySlot: "outbox_cdc_replay"}
	if !strings.Contains(err.Error(), "committed from 2026-11-25T15:03:15Z on") {
		t.Errorf("error = %v; want the window's first time rounded up to 15:03:15", err)
	}
	err.FirstTime = first.Truncate(time.Second)
	if !strings.Contains(err.Error(), "committed from 2026-11-25T15:03:14Z on") {
		t.Errorf("error = %v; a whole second is printed as it is", err)
	}
}
