package wal

import (
	"errors"
	"fmt"
)

var (
	// ErrSlotLost means Postgres removed WAL the slot still needed
	// (wal_status = lost, max_slot_wal_keep_size exceeded).
	ErrSlotLost = errors.New("replication slot is lost")
	// ErrSlotVanished means the slot existed earlier in this process and no
	// longer does: it was dropped, or Postgres failed over to a standby
	// without failover slots.
	ErrSlotVanished = errors.New("replication slot vanished")
)

// SetupError is a precondition the operator must fix; reconnecting cannot
// help, so the connector exits.
type SetupError struct {
	Msg string
	Err error // ErrSlotLost, ErrSlotVanished, or nil
}

func (e *SetupError) Error() string { return e.Msg }
func (e *SetupError) Unwrap() error { return e.Err }

func setupErrorf(format string, args ...any) error {
	return &SetupError{Msg: fmt.Sprintf(format, args...)}
}

// SlotInUseError means another connection streams from the slot: a second
// connector instance, or a walsender left behind by a dropped connection
// that Postgres ends after wal_sender_timeout. Retry with backoff.
type SlotInUseError struct {
	Slot string
	Err  error
}

func (e *SlotInUseError) Error() string {
	return fmt.Sprintf("replication slot %q is in use (%v); another instance holds it, or Postgres has not yet noticed a dropped connection (up to wal_sender_timeout)", e.Slot, e.Err)
}
func (e *SlotInUseError) Unwrap() error { return e.Err }
