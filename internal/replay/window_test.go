package replay

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/setup"
)

// TestWindowStart: where a range starts in the replay slot, which holds
// WAL from held on; before that, an *OutsideWindowError naming the
// window's first position (docs/design.md, rule 17).
func TestWindowStart(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 6, 0, 0, 0, time.UTC)
	rec := checkpoint.Record{
		Marks:  checkpoint.Marks{{LSN: 100, Time: t0}, {LSN: 200, Time: t0.Add(time.Minute)}, {LSN: 300, Time: t0.Add(2 * time.Minute)}},
		Window: checkpoint.Mark{LSN: 150, Time: t0.Add(30 * time.Second)},
	}
	const held = pglogrepl.LSN(150)
	for _, tc := range []struct {
		name    string
		r       Range
		want    pglogrepl.LSN
		outside bool
	}{
		{"the window's start", Range{}, held, false},
		{"an LSN in the window", Range{FromLSN: 250}, 250, false},
		{"an LSN before it", Range{FromLSN: 120}, 0, true},
		// The newest mark at least Skew before the time.
		{"a time after a mark", Range{FromTime: t0.Add(time.Minute + time.Second + checkpoint.Skew)}, 200, false},
		{"a time too close to a mark", Range{FromTime: t0.Add(time.Minute + time.Second)}, 150, false},
		{"a time before the window", Range{FromTime: t0.Add(10 * time.Second)}, 0, true},
	} {
		got, err := WindowStart(tc.r, rec, held, time.Hour, "outbox_cdc_replay")
		var outside *OutsideWindowError
		switch {
		case tc.outside && (!errors.As(err, &outside) || outside.First != held || outside.ReplaySlot != "outbox_cdc_replay"):
			t.Errorf("%s: %v, %v; want an OutsideWindowError from %s", tc.name, got, err, held)
		case !tc.outside && (err != nil || got != tc.want):
			t.Errorf("%s: %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}

// TestWindowLostNamesItsCause: the replay window's keeper says why the
// replay slot went, with the fix for that cause: WAL removed
// (max_slot_wal_keep_size), or idle longer than
// idle_replication_slot_timeout, which the replay slot is by design.
func TestWindowLostNamesItsCause(t *testing.T) {
	for _, tt := range []struct {
		st   setup.SlotState
		want []string
		not  string
	}{
		{setup.SlotState{}, []string{"the replay slot is gone (dropped)"}, "max_slot_wal_keep_size"},
		{setup.SlotState{Exists: true, WALStatus: "lost", Invalidated: postgres.ReasonWALRemoved},
			[]string{"Postgres removed WAL it still needed (max_slot_wal_keep_size)", "raise max_slot_wal_keep_size above the WAL the window needs"}, "idle_replication_slot_timeout"},
		{setup.SlotState{Exists: true, WALStatus: "lost", Invalidated: postgres.ReasonIdleTimeout},
			[]string{"longer than idle_replication_slot_timeout", "sits idle for the window, 1h0m0s, by design", "set idle_replication_slot_timeout above the window plus the longest stop"}, "max_slot_wal_keep_size"},
		{setup.SlotState{Exists: true, WALStatus: "lost", Invalidated: postgres.ReasonRowsRemoved},
			[]string{"the primary removed catalog rows it needed", "hot_standby_feedback = on"}, "max_slot_wal_keep_size"},
	} {
		got := windowLost(tt.st, time.Hour)
		for _, w := range append(tt.want, "replays can only reach back to now") {
			if !strings.Contains(got, w) {
				t.Errorf("%+v: %q does not say %q", tt.st, got, w)
			}
		}
		if strings.Contains(got, tt.not) {
			t.Errorf("%+v: %q names %s, which did not do it", tt.st, got, tt.not)
		}
	}
}
