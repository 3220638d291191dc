package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// StartLock serialises the starts of the replicas of one slot: from reading the
// slot and the checkpoint to START_REPLICATION, one session at a time decides
// (docs/design.md, "A first start is a state, not a session"). Without it two
// replicas started in the same second both see "no slot, no checkpoint"; and a
// first start releases the slot between CREATE_REPLICATION_SLOT and
// START_REPLICATION (the walsender gives up a new slot once it is created), so
// during the first start's backfill a second replica found the slot free and
// streamed it, running the initial job again.
//
// It is a session-level advisory lock on a plain connection: any role may
// take one, it lives in the slot's database (where every replica
// connects), and it goes away with the connection, so a replica that dies
// mid-start frees it.
type StartLock struct {
	conn *pgx.Conn
	slot string
}

// ErrStarting is the SlotInUseError.Err of a start lock another replica
// holds: it is creating the slot, backfilling, or deciding where to start.
var ErrStarting = errors.New("another replica is starting on it (creating the slot or backfilling)")

// LockStart takes slot's start lock, or returns a *SlotInUseError wrapping
// ErrStarting when another session holds it. It does not wait: a replica
// that finds it held waits as a standby.
func LockStart(ctx context.Context, cfg Config, slot string) (*StartLock, error) {
	conn, err := ConnectSQL(ctx, cfg)
	if err != nil {
		return nil, err
	}
	var got bool
	// hashtextextended is stable across servers and versions (11+); the
	// prefix keeps the key apart from the application's own locks.
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtextextended('outbox-cdc start ' || $1, 0))`, slot).Scan(&got); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("take the start lock of slot %q: %w", slot, err)
	}
	if !got {
		conn.Close(context.WithoutCancel(ctx))
		return nil, &SlotInUseError{Slot: slot, Err: ErrStarting}
	}
	return &StartLock{conn: conn, slot: slot}, nil
}

// Release gives the lock up; it may be called more than once.
func (l *StartLock) Release(ctx context.Context) {
	if l == nil || l.conn == nil {
		return
	}
	// Unlock first, and wait for it: closing the connection ends the
	// session, and with it the lock, only once the server has noticed.
	// Until then the lock is still held, and this replica's own next try
	// (at once, after it ended a frozen holder's walsender) found it taken,
	// "another replica is starting", and waited a whole retry backoff
	// (TestReleaseFreesTheLockAtOnce). If the unlock fails, the close
	// still frees it.
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	_, _ = l.conn.Exec(uctx, `SELECT pg_advisory_unlock(hashtextextended('outbox-cdc start ' || $1, 0))`, l.slot)
	cancel()
	l.conn.Close(context.WithoutCancel(ctx))
	l.conn = nil
}
