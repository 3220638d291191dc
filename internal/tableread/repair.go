package tableread

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/postgres"
)

// Snapshot reads every row of one table in a snapshot of its own, chunk by
// chunk, on a connection of its own: the rows a recreated table received
// before it was published again. Its snapshot is taken when it opens, or
// imported (NewSnapshot), and held, in a read-only repeatable read
// transaction, until Close.
type Snapshot struct {
	// mu guards conn: the watch may close a snapshot (a repair dropped)
	// while the session reads it; a read in progress ends first.
	mu    sync.Mutex
	conn  *pgx.Conn
	d     SnapshotDeps
	t     *outbox.Source
	plan  *Plan
	cur   *Cursor // in commit order
	dec   *decode.RowDecoder
	after []string
	final bool
	// imported: in another transaction's snapshot (Begin).
	imported bool
	// ready is closed once the plan is read (Finish), with failed its
	// error: an imported snapshot is handed over before.
	ready  chan struct{}
	once   sync.Once
	failed error
	// Total is how many rows the snapshot holds, once ready.
	Total int64
	// Seen is what the snapshot shows of the transactions that
	// committed: the stream passes over a repaired table's events of
	// those, since the snapshot sent them.
	Seen checkpoint.Seen
}

// SnapshotDeps is what a Snapshot needs of its backfills.
type SnapshotDeps struct {
	// Connect opens the snapshot's connection.
	Connect func(context.Context) (*pgx.Conn, error)
	// Role is the role the rows are read as (SetRole).
	Role string
	// Plan is the plan of table t's rows, in the leaves the snapshot
	// shows, and their decoder.
	Plan func(ctx context.Context, conn *pgx.Conn, t *outbox.Source, leaves []uint32) (*Plan, *decode.RowDecoder, error)
}

// OpenSnapshot opens a snapshot of table t's rows.
func OpenSnapshot(ctx context.Context, d SnapshotDeps, t *outbox.Source) (*Snapshot, error) {
	s, err := NewSnapshot(ctx, d, t)
	if err != nil {
		return nil, err
	}
	if err := s.Begin(ctx, ""); err != nil {
		return nil, err
	}
	if err := s.Finish(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// NewSnapshot connects a snapshot of table t's rows, to Begin in another
// transaction's exported snapshot (pg_export_snapshot) while that one
// holds the table's writers off: the connection is made first, so that
// they wait for none of it. Finish, once that transaction ended, reads
// the plan and the count, which would hold them off as long as they take;
// Next waits for it.
func NewSnapshot(ctx context.Context, d SnapshotDeps, t *outbox.Source) (*Snapshot, error) {
	conn, err := d.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &Snapshot{conn: conn, d: d, t: t, ready: make(chan struct{})}, nil
}

// Begin opens the snapshot's transaction, in exported when it is not "",
// and reads what it shows; on an error it closes the snapshot.
func (s *Snapshot) Begin(ctx context.Context, exported string) error {
	conn, t := s.conn, s.t
	s.imported = exported != ""
	fail := func(err error) error {
		s.Close(ctx)
		return err
	}
	if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"); err != nil {
		return fail(fmt.Errorf("open a snapshot of %s: %w", t, err))
	}
	if exported != "" {
		if strings.Trim(exported, "0123456789ABCDEFabcdef-") != "" {
			return fail(fmt.Errorf("open a snapshot of %s: %q is not an exported snapshot's name", t, exported))
		}
		if _, err := conn.Exec(ctx, "SET TRANSACTION SNAPSHOT '"+exported+"'"); err != nil {
			return fail(fmt.Errorf("open a snapshot of %s: import %s: %w", t, exported, err))
		}
	}
	if err := SetRole(ctx, conn, s.d.Role); err != nil {
		return fail(err)
	}
	// The lock's read takes the transaction's snapshot, and may then wait
	// for a rewrite or a partition change that would read as fewer rows.
	// An imported one's exporter holds those off until Finish.
	if exported == "" {
		if err := HoldFiles(ctx, conn, t); err != nil {
			return fail(err)
		}
	}
	// The transaction's snapshot, which the lock's read took.
	var err error
	if s.Seen.Xmin, s.Seen.Xmax, s.Seen.Xip, err = postgres.Snapshot(ctx, conn); err != nil {
		return fail(fmt.Errorf("open a snapshot of %s: read what it shows: %w", t, err))
	}
	return nil
}

// Finish reads the snapshot's plan and count, and makes it ready; on an
// error it closes it.
func (s *Snapshot) Finish(ctx context.Context) (err error) {
	s.mu.Lock()
	defer func() {
		s.setReady(err)
		s.mu.Unlock()
		if err != nil {
			s.Close(ctx)
		}
	}()
	if s.conn == nil {
		return errors.New("read a repair's snapshot: it was closed")
	}
	if s.imported {
		if err := HoldFiles(ctx, s.conn, s.t); err != nil {
			return err
		}
	}
	// The leaves the snapshot shows: one attached after it is not read
	// (SnapshotLeaves).
	leaves, err := SnapshotLeaves(ctx, s.conn, s.t)
	if err != nil {
		return err
	}
	if s.plan, s.dec, err = s.d.Plan(ctx, s.conn, s.t, leaves); err != nil {
		return err
	}
	if s.Total, err = s.plan.Count(ctx, s.conn); err != nil {
		return err
	}
	if s.plan.InCommitOrder() {
		s.cur, err = s.plan.Open(ctx, s.conn, nil, 0, false)
	}
	return err
}

// setReady makes the snapshot ready, or failed with err; only the first
// call counts.
func (s *Snapshot) setReady(err error) {
	s.once.Do(func() {
		s.failed = err
		if s.ready != nil {
			close(s.ready)
		}
	})
}

// Ready waits until the snapshot's plan is read, and returns what reading
// it failed with.
func (s *Snapshot) Ready(ctx context.Context) error {
	select {
	case <-s.ready:
		return s.failed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Next reads the next chunk of rows, in the plan's order (the order the
// rows were committed in, unless backfill.order_by says otherwise); final
// once no row is left.
func (s *Snapshot) Next(ctx context.Context) (rows [][][]byte, final bool, err error) {
	if err := s.Ready(ctx); err != nil {
		return nil, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.final {
		return nil, true, nil
	}
	if s.conn == nil {
		return nil, false, errors.New("read a repair's snapshot: it was closed")
	}
	read := func() (Chunk, error) { return s.plan.Read(ctx, s.conn, s.after, nil) }
	if s.cur != nil {
		read = func() (Chunk, error) { return s.cur.Next(ctx) }
	}
	c, err := read()
	if err != nil {
		return nil, false, err
	}
	if c.Last != nil {
		s.after = c.Last
	}
	s.final = c.Final
	return c.Rows, c.Final, nil
}

// Decoder turns the rows Next reads into events.
func (s *Snapshot) Decoder() *decode.RowDecoder { return s.dec }

// Close ends the snapshot's transaction and connection.
func (s *Snapshot) Close(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil {
		s.conn.Close(context.WithoutCancel(ctx))
		s.conn = nil
	}
	// Closed before its plan was read (a repair dropped): whoever waits
	// for it gets an error.
	s.setReady(errors.New("read a repair's snapshot: it was closed"))
}
