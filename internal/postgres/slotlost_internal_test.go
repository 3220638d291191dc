package postgres

import (
	"errors"
	"strings"
	"testing"

	"github.com/outboxcdc/cdc/internal/errtext"
)

// TestLostSlotNamesItsCause: each reason Postgres invalidates a slot for
// is told with the setting that did it and that setting's fix, never
// another's; the recovery (cdc reset --accept-gap) is the same for all,
// and the error is one line, ErrSlotLost, and a *SlotLost.
func TestLostSlotNamesItsCause(t *testing.T) {
	settings := []string{"max_slot_wal_keep_size", "idle_replication_slot_timeout", "hot_standby_feedback", "wal_level"}
	for _, tt := range []struct {
		reason string
		names  []string // in the message; the other settings are not
	}{
		{ReasonWALRemoved, []string{"Postgres removed WAL it still needed (max_slot_wal_keep_size)", "raise max_slot_wal_keep_size"}},
		{ReasonIdleTimeout, []string{"longer than idle_replication_slot_timeout", "raise idle_replication_slot_timeout", "ALTER SYSTEM SET idle_replication_slot_timeout = 0"}},
		{ReasonRowsRemoved, []string{"invalidated it on this standby", "the primary removed catalog rows it needed", "hot_standby_feedback = on", "primary_slot_name"}},
		{ReasonWALLevel, []string{"the primary's wal_level fell below logical", "set wal_level = logical on the primary"}},
		{ReasonConflicting, []string{"the primary removed catalog rows it needed", "or its wal_level fell below logical", "hot_standby_feedback = on"}},
		{"some_future_reason", []string{"(invalidation_reason some_future_reason)", "find what some_future_reason means"}},
	} {
		t.Run(tt.reason, func(t *testing.T) {
			err := LostSlotError("outbox_cdc", 0x16B3748, LostBecause(tt.reason))
			msg := err.Error()
			for _, want := range append(tt.names, `replication slot "outbox_cdc" is lost (`+tt.reason+`)`, "events after its confirmed position 0/16B3748",
				"recover those events from the outbox table", "cdc reset --accept-gap (with your --config)") {
				if !strings.Contains(msg, want) {
					t.Errorf("the message does not say %q: %s", want, msg)
				}
			}
			for _, s := range settings {
				named := false
				for _, n := range tt.names {
					named = named || strings.Contains(n, s)
				}
				if !named && strings.Contains(msg, s) {
					t.Errorf("the message names %s, which did not do it: %s", s, msg)
				}
			}
			var fatal *errtext.Fatal
			var lost *SlotLost
			if !errors.As(err, &fatal) || !errors.Is(err, ErrSlotLost) || !errors.As(err, &lost) || lost.Reason != tt.reason {
				t.Errorf("%T %v: want a *errtext.Fatal wrapping a *SlotLost of %s, which is ErrSlotLost", err, err, tt.reason)
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("not one line: %q", msg)
			}
		})
	}
}

// TestInvalidationReason: what each server shows of an invalidated slot
// is read as PostgreSQL 17's invalidation_reason: 17+ says it, 16's
// conflicting is a standby's conflict, and wal_status 'lost' alone (14,
// 15; 16 without a conflict) is WAL removed.
func TestInvalidationReason(t *testing.T) {
	for _, tt := range []struct {
		reason, walStatus string
		conflicting       bool
		want              string
	}{
		{"", "reserved", false, ""},
		{"", "unreserved", false, ""},
		{"", "lost", false, ReasonWALRemoved},                       // 14, 15, 16
		{"", "lost", true, ReasonConflicting},                       // 16 on a standby
		{ReasonIdleTimeout, "lost", false, ReasonIdleTimeout},       // 18
		{ReasonRowsRemoved, "lost", true, ReasonRowsRemoved},        // 17+ on a standby
		{ReasonWALLevel, "lost", true, ReasonWALLevel},              // 17+ on a standby
		{ReasonWALRemoved, "lost", false, ReasonWALRemoved},         // 17+
		{"some_future_reason", "lost", false, "some_future_reason"}, // verbatim
	} {
		if got := InvalidationReason(tt.reason, tt.walStatus, tt.conflicting); got != tt.want {
			t.Errorf("InvalidationReason(%q, %q, %v) = %q; want %q", tt.reason, tt.walStatus, tt.conflicting, got, tt.want)
		}
	}
}

// TestReasonFromDetail: START_REPLICATION's refusal of an invalidated
// slot, as each major words its detail.
func TestReasonFromDetail(t *testing.T) {
	for _, tt := range []struct{ detail, want string }{
		{"This slot has been invalidated because it exceeded the maximum reserved size.", ReasonWALRemoved}, // 14 to 16
		{"This slot has been invalidated because it was conflicting with recovery.", ReasonConflicting},     // 16
		{`This replication slot has been invalidated due to "wal_removed".`, ReasonWALRemoved},              // 17+
		{`This replication slot has been invalidated due to "idle_timeout".`, ReasonIdleTimeout},            // 18
		{`This replication slot has been invalidated due to "rows_removed".`, ReasonRowsRemoved},
		{"", ""},
		{"Something else.", ""},
	} {
		if got := ReasonFromDetail(tt.detail); got != tt.want {
			t.Errorf("ReasonFromDetail(%q) = %q; want %q", tt.detail, got, tt.want)
		}
	}
}
