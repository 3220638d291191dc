package postgres

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/errtext"
)

// Why Postgres invalidated a slot, as pg_replication_slots.invalidation_reason
// (PostgreSQL 17+) names it, and ReasonConflicting for what PostgreSQL 16
// shows of a standby's conflict.
const (
	ReasonWALRemoved  = "wal_removed"            // max_slot_wal_keep_size
	ReasonRowsRemoved = "rows_removed"           // a standby: the primary removed catalog rows
	ReasonWALLevel    = "wal_level_insufficient" // a standby: the primary's wal_level fell below logical
	ReasonIdleTimeout = "idle_timeout"           // idle_replication_slot_timeout (PostgreSQL 18)
	// ReasonConflicting is PostgreSQL 16's conflicting = true on a
	// standby: rows_removed or wal_level_insufficient, which 16 does not
	// tell apart.
	ReasonConflicting = "conflicting"
)

// InvalidationReason is why Postgres invalidated a slot, in PostgreSQL
// 17's words, from the pg_replication_slots columns of any supported
// server: reason is invalidation_reason ("" when NULL, or before 17),
// conflicting is PostgreSQL 16's column (false before 16), walStatus
// 'lost' is all PostgreSQL 14 and 15 show. "" is a slot Postgres has not
// invalidated.
func InvalidationReason(reason, walStatus string, conflicting bool) string {
	switch {
	case reason != "":
		return reason
	case conflicting:
		return ReasonConflicting
	case walStatus == "lost":
		return ReasonWALRemoved
	}
	return ""
}

// due is PostgreSQL 17's errdetail for an invalidated slot: "This
// replication slot has been invalidated due to \"idle_timeout\"."
var due = regexp.MustCompile(`invalidated due to "([a-z_]+)"`)

// ReasonFromDetail reads the invalidation reason from the detail of
// START_REPLICATION's refusal of an invalidated slot ("can no longer get
// changes from replication slot"): PostgreSQL 17+ quotes it, 14 to 16
// describe it. "" when the detail says neither.
func ReasonFromDetail(detail string) string {
	switch m := due.FindStringSubmatch(detail); {
	case m != nil:
		return m[1]
	case strings.Contains(detail, "exceeded the maximum reserved size"):
		return ReasonWALRemoved
	case strings.Contains(detail, "conflicting with recovery"):
		return ReasonConflicting
	}
	return ""
}

// SlotLost is why Postgres invalidated a slot, told for the person who
// must recover and keep it from happening again. As an error it is
// ErrSlotLost (errors.Is), and a *errtext.Fatal wraps it with the message
// (LostSlotError), so that a caller can name the cause (errors.As).
type SlotLost struct {
	// Reason is InvalidationReason's: invalidation_reason, or
	// ReasonConflicting; another server's reason verbatim.
	Reason string
	// Setting is the setting that did it ("max_slot_wal_keep_size"), or
	// the reason itself when it is not one this code knows.
	Setting string
	// Cause says what happened, naming Setting.
	Cause string
	// Fix is what keeps it from happening again.
	Fix string
}

func (l *SlotLost) Error() string {
	if l.Reason == "" {
		return ErrSlotLost.Error()
	}
	return fmt.Sprintf("%v (%s)", ErrSlotLost, l.Reason)
}
func (l *SlotLost) Unwrap() error { return ErrSlotLost }

// LostBecause is the SlotLost of reason (InvalidationReason's).
func LostBecause(reason string) *SlotLost {
	switch reason {
	case ReasonWALRemoved:
		return &SlotLost{Reason: reason, Setting: "max_slot_wal_keep_size",
			Cause: "Postgres removed WAL it still needed (max_slot_wal_keep_size)",
			Fix:   "raise max_slot_wal_keep_size to hold the WAL written during the longest stop the connector must survive"}
	case ReasonIdleTimeout:
		return &SlotLost{Reason: reason, Setting: "idle_replication_slot_timeout",
			Cause: "Postgres invalidated it because nothing streamed from it for longer than idle_replication_slot_timeout",
			Fix:   "raise idle_replication_slot_timeout above the longest stop the connector must survive, or turn it off (as a superuser: ALTER SYSTEM SET idle_replication_slot_timeout = 0; SELECT pg_reload_conf())"}
	case ReasonRowsRemoved:
		return &SlotLost{Reason: reason, Setting: "hot_standby_feedback",
			Cause: "Postgres invalidated it on this standby because the primary removed catalog rows it needed (hot_standby_feedback off, or no physical slot for the standby on the primary)",
			Fix:   "set hot_standby_feedback = on on the standby and primary_slot_name to a physical slot on the primary"}
	case ReasonWALLevel:
		return &SlotLost{Reason: reason, Setting: "wal_level",
			Cause: "Postgres invalidated it on this standby because the primary's wal_level fell below logical",
			Fix:   "set wal_level = logical on the primary and restart it"}
	case ReasonConflicting:
		return &SlotLost{Reason: reason, Setting: "hot_standby_feedback",
			Cause: "Postgres invalidated it on this standby because the primary removed catalog rows it needed (hot_standby_feedback off, or no physical slot for the standby on the primary) or its wal_level fell below logical",
			Fix:   "set hot_standby_feedback = on on the standby (and keep wal_level = logical on the primary)"}
	case "":
		return &SlotLost{Cause: "Postgres invalidated it",
			Fix: "find why in the server's log (or pg_replication_slots.invalidation_reason, PostgreSQL 17+) and keep it from happening"}
	}
	return &SlotLost{Reason: reason, Setting: reason,
		Cause: fmt.Sprintf("Postgres invalidated it (invalidation_reason %s)", reason),
		Fix:   fmt.Sprintf("find what %s means in PostgreSQL's documentation of pg_replication_slots and keep it from happening", reason)}
}

// LostSlotError is the one-line error that stops the connector on slot,
// lost for l's cause with events after confirmed (0: unknown) in it: the
// cause, its fix, and the recovery (docs/operations.md, "Lost slot").
func LostSlotError(slot string, confirmed pglogrepl.LSN, l *SlotLost) error {
	lost := fmt.Sprintf("replication slot %q is lost", slot)
	if l.Reason != "" {
		lost += " (" + l.Reason + ")"
	}
	after := "its confirmed position"
	if confirmed != 0 {
		after += " " + confirmed.String()
	}
	return &errtext.Fatal{Err: l, Msg: fmt.Sprintf(
		"%s: %s, and events after %s can no longer be streamed; %s, recover those events from the outbox table if it still holds them, "+
			"then accept the gap with cdc reset --accept-gap (with your --config), which drops the slot and creates a new one at the current position",
		lost, l.Cause, after, l.Fix)}
}
