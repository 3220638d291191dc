package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
)

// NextXID reads, on conn's server, the 64-bit xid the next transaction to
// write will get at the earliest (a snapshot's xmax): every transaction
// with an xid at or above it started writing after this call, so its
// changes are in the WAL after this moment.
func NextXID(ctx context.Context, conn *pgx.Conn) (uint64, error) {
	var next uint64
	if err := conn.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint`).Scan(&next); err != nil {
		return 0, fmt.Errorf("read the next transaction id: %w", err)
	}
	return next, nil
}

// Snapshot reads the snapshot q's transaction has now (or a statement's,
// outside one): its xmin and xmax, and the transactions in progress
// between them, 64-bit (checkpoint.Seen holds such a snapshot).
func Snapshot(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (xmin, xmax uint64, xip []uint64, err error) {
	err = q.QueryRow(ctx, `SELECT pg_snapshot_xmin(s)::text::bigint, pg_snapshot_xmax(s)::text::bigint,
		array(SELECT x::text::bigint FROM pg_snapshot_xip(s) x) FROM pg_current_snapshot() s`).Scan(&xmin, &xmax, &xip)
	return xmin, xmax, xip, err
}

// Visible reports whether a snapshot taken now on conn's server shows
// transaction xid as ended: the 32-bit xid a pgoutput message carries, of
// the epoch of the snapshot's xmax, or of the one before when it is above
// xmax's low 32 bits (an xid the server assigned lies within 2^31 below
// xmax). A transaction the walsender sent is committed, but may not show
// yet: its commit record is flushed before the committing backend makes it
// visible.
func Visible(ctx context.Context, conn *pgx.Conn, xid uint32) (bool, error) {
	const q = `SELECT pg_visible_in_snapshot((x - ((x % 4294967296 - $1::int8 + 4294967296) % 4294967296))::text::xid8, s)
		FROM (SELECT pg_current_snapshot() AS s) AS cur, LATERAL (SELECT pg_snapshot_xmax(s)::text::int8 AS x) AS xmax`
	var visible bool
	if err := conn.QueryRow(ctx, q, int64(xid)).Scan(&visible); err != nil {
		return false, fmt.Errorf("check whether transaction %d shows in a snapshot: %w", xid, err)
	}
	return visible, nil
}

// VisibleWait bounds a WaitVisible for a transaction the stream read (a
// look at the catalog, a leaf's lookup): it is committed, and its commit
// shows in new snapshots within moments.
const VisibleWait = 10 * time.Second

// WaitVisible waits, up to limit, until a snapshot on conn's server shows
// transaction xid as ended (Visible): the catalog holds what a transaction
// the stream read did. Its error says what the commit may wait for.
func WaitVisible(ctx context.Context, conn *pgx.Conn, xid uint32, limit time.Duration) error {
	for deadline := time.Now().Add(limit); ; {
		visible, err := Visible(ctx, conn, xid)
		if err != nil || visible {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("transaction %d, which the stream read, shows in no snapshot after %s: its commit waits, for a synchronous standby (synchronous_standby_names) or the disk, and the catalog does not hold its changes yet", xid, limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// WritableNextXID is NextXID on the server that assigns xids: postgres.url's
// while it is a primary, postgres.primary_url's while it is a standby
// (whose own snapshot may lag the primary's). ok is false on a standby
// without a primary_url: nothing can be said then.
func WritableNextXID(ctx context.Context, cfg Config) (next uint64, ok bool, err error) {
	conn, standby, err := ConnectWritable(ctx, cfg)
	if err != nil {
		return 0, false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if standby {
		return 0, false, nil
	}
	next, err = NextXID(ctx, conn)
	return next, err == nil, err
}

// WaitForOlder waits until every transaction that was running when it was
// called has ended, on the server that assigns xids (postgres.primary_url's
// while conn's is a standby), and then, on a standby, until the standby has
// replayed that far (CatchUp).
//
// A table joins the stream at a point in the WAL, not at a moment
// (docs/design.md, "Table changes"): an INSERT written before the ALTER
// PUBLICATION that added its table committed is never streamed, even when
// its transaction commits later, and a snapshot taken right after the
// ALTER does not see that transaction's rows either. Called after the
// table is published, it makes a snapshot taken afterwards see every row
// the stream will not carry. It logs, every minute, what it still waits
// for: a transaction left open (or prepared) holds it.
func WaitForOlder(ctx context.Context, cfg Config, conn *pgx.Conn, log hclog.Logger) error {
	target := conn
	standby, err := InRecovery(ctx, conn)
	if err != nil {
		return err
	}
	if standby {
		primary, err := ConnectPrimary(ctx, cfg, "wait for the transactions older than a table's publication", "")
		if err != nil {
			return err
		}
		defer primary.Close(context.WithoutCancel(ctx))
		target = primary
	}
	next, err := NextXID(ctx, target)
	if err != nil {
		return err
	}
	start, told := time.Now(), time.Now()
	for {
		var oldest uint64
		if err := target.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint`).Scan(&oldest); err != nil {
			return fmt.Errorf("read the oldest running transaction: %w", err)
		}
		if oldest >= next {
			break
		}
		if time.Since(told) >= time.Minute {
			told = time.Now()
			log.Warn("waiting for a transaction that began before an outbox table joined the publication to end: its rows are sent once it has; a transaction left open (or prepared) holds this",
				"oldest_xid", oldest, "waiting_for_below", next, "waited", time.Since(start).Round(time.Second))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond): // the poll's pace
		}
	}
	return CatchUp(ctx, cfg, conn)
}

// XID64 is SQL for the 64-bit xid of col, a 32-bit xid column (a row's
// xmin), in the epoch of next (SQL for the server's next 64-bit xid, as a
// snapshot's xmax), or in the one before when col is above next's low 32
// bits: no xid is ahead of the next one. An xid older than 2^32
// transactions (a frozen row's, which freezing keeps) is placed an epoch
// late, as the newer one it cannot be told from.
func XID64(col, next string) string {
	return `((CASE WHEN ` + col + `::text::bigint <= (` + next + ` & 4294967295) THEN ` + next + ` >> 32 ELSE (` + next + ` >> 32) - 1 END) << 32 | ` + col + `::text::bigint)`
}
