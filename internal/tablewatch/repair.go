package tablewatch

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/backfill"
	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/setup"
	"github.com/outboxcdc/cdc/internal/tableread"
)

// Repair is a recreated table's rows still to send, where the stream
// reaches its ControlRepair message.
type Repair struct {
	ID    string
	Table *outbox.Source
	Rel   uint32 // the table's relation id now
	// Member is the publication's membership that publishes Rel
	// (checkpoint.Table.Member).
	Member string
	// Old is the relation streamed before, when it still exists under
	// another name (a swap): it stays the table's (checkpoint.Table.Former).
	Old  uint32
	Snap *tableread.Snapshot // nil: no rows to send, only Floor and Files to record
	// Floor and Files are the table's from the message on
	// (checkpoint.Table): 0 and nil once a snapshot sent its rows.
	Floor uint64
	Files map[uint32]uint32
	// Early: its rows went where the stream met the first fresh event of
	// its relation, before its message (Before), and Done recorded it
	// there; the stream's goroutine sets it.
	Early bool
}

// startRepair opens a repair of table t, whose relation is rs now and
// published: a snapshot of its rows, then the message that tells the
// stream where to send them. old is the relation streamed before, 0 when
// none was or it is gone.
//
// The snapshot is taken only once every transaction that was running when
// the table joined the publication has ended (postgres.WaitForOlder): an
// insert written before the ALTER PUBLICATION committed is never streamed,
// and a snapshot taken while its transaction is open does not see it
// either, so without the wait such a row is in neither.
//
// A table published through FOR ALL TABLES or its schema is snapshotted
// too: such a publication holds a relation from its creation only when it
// was created under that name in that schema. One renamed into the
// configured name, or moved into the schema (ALTER TABLE ... SET SCHEMA),
// carries rows the stream passed over as another relation's, and only the
// snapshot holds them; those the stream did send are in Fresh.
func (w *Watch) startRepair(ctx context.Context, conn *pgx.Conn, t *outbox.Source, rs setup.RelState, old uint32, role string) error {
	r := &Repair{ID: backfill.NewID(), Table: t, Rel: rs.OID, Member: rs.Member, Old: old}
	if err := postgres.WaitForOlder(ctx, w.deps.Postgres, conn, w.log); err != nil {
		return err
	}
	snap, err := w.deps.OpenSnapshot(ctx, t)
	if err != nil {
		return readError(t, role, err)
	}
	r.Snap = snap
	return w.announce(ctx, conn, r, "repair of a recreated table under way: its rows go where the stream reaches this point", "rows", r.Snap.Total)
}

// announce makes repair r pending, for a stream waiting in Before, and
// writes its message; then logs msg.
func (w *Watch) announce(ctx context.Context, conn *pgx.Conn, r *Repair, msg string, args ...any) error {
	w.mu.Lock()
	w.pending[r.ID] = r
	w.repairing[r.Table] = true
	w.changedLocked() // a stream waiting in Before takes it now
	w.mu.Unlock()
	if err := EmitRepair(ctx, w.deps.Postgres, conn, r.ID); err != nil {
		w.drop(ctx, r)
		return err
	}
	w.log.Info(msg, append([]any{"table", r.Table.String()}, args...)...)
	return nil
}

// checkFiles sets a new Floor for table t, streamed as prev, when the
// relation was rewritten since its Floor was set (checkpoint.Table.Files):
// the rows below the Floor may carry the rewrite's xid now, and retention,
// which checks the files itself, deletes nothing of the table meanwhile.
// The new Floor and the files, read just before it as Baseline reads
// them, go into the checkpoint where the stream reaches a ControlRepair
// message without rows; every row from before it is kept.
func (w *Watch) checkFiles(ctx context.Context, conn *pgx.Conn, t *outbox.Source, prev checkpoint.Table) error {
	if prev.Floor == 0 || prev.Floor == checkpoint.NoFloor || prev.Files == nil {
		return nil
	}
	files, err := setup.RelFiles(ctx, conn, prev.Rel)
	if err != nil || !setup.Rewritten(prev.Files, files) {
		return err
	}
	next, ok, err := postgres.WritableNextXID(ctx, w.deps.Postgres)
	if err != nil || !ok {
		return err // a standby without primary_url: retention does not run either
	}
	w.log.Warn("outbox table was rewritten (ALTER TABLE ... TYPE, a column with a volatile default, VACUUM FULL or CLUSTER) while it held rows the connector never streamed: their transactions no longer tell them from the rows streamed, so retention keeps every row of it from before now; delete those by hand once Kafka holds them",
		"table", t.String())
	r := &Repair{ID: backfill.NewID(), Table: t, Rel: prev.Rel, Member: prev.Member, Floor: next, Files: files}
	w.mu.Lock()
	w.pending[r.ID] = r
	w.repairing[t] = true
	w.mu.Unlock()
	if err := EmitRepair(ctx, w.deps.Postgres, conn, r.ID); err != nil {
		w.drop(ctx, r)
		return err
	}
	return nil
}

// Take returns the pending repair id and forgets it, or nil; one whose
// rows went early (Before) too, with Early set.
func (w *Watch) Take(id string) *Repair {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.pending[id]
	if r == nil {
		r = w.early[id]
	}
	delete(w.pending, id)
	delete(w.early, id)
	return r
}

// Before returns the repair whose rows must go before an event of table
// t's relation rel that is fresh (decode.Message.Fresh), written by
// transaction xid: its snapshot,
// taken once every transaction older than the relation's joining the
// publication had ended, holds the rows the relation received before it
// joined, which were committed before the event. Once Before returned
// it, the repair is the stream's, which sends its rows there (Rows),
// records it (Done, with what its snapshot showed) and passes over the
// relation's events the snapshot holds (Snap.Seen).
//
// When no repair of rel is announced yet (the table was published and
// the watch waits for an older transaction, or has not looked since),
// Before asks for a look and waits, until one announces it, or until a
// look that began after the call, and whose catalog shows xid's work
// (waitVisible), ends without one: then it returns nil, and no repair of
// rel is coming (the relation is no longer the one
// under t's name, or another of t's is repaired). It returns an error
// when ctx ends, the watch stopped, or it waited limit (0: no limit) and
// the repair is still not announced. The stream's goroutine calls it,
// while the stream keeps its slot (wal.Stream.While): the stream reads
// nothing past the event meanwhile, so the event, and every later one,
// waits in the WAL, which holds them without a bound in memory.
func (w *Watch) Before(ctx context.Context, t *outbox.Source, rel, xid uint32, limit time.Duration) (*Repair, error) {
	w.mu.Lock()
	since := w.began
	w.visible = xid
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.visible = 0
		w.mu.Unlock()
	}()
	start, told := time.Now(), time.Now()
	for {
		select {
		case w.poke <- struct{}{}:
		default:
		}
		w.mu.Lock()
		var r *Repair
		for _, p := range w.pending {
			if p.Table == t && p.Rel == rel && p.Snap != nil {
				r = p
			}
		}
		if r != nil {
			delete(w.pending, r.ID)
			w.early[r.ID] = r
		}
		none, changed := w.looked > since, w.changed
		w.mu.Unlock()
		switch {
		case r != nil:
			return r, nil
		case none:
			return nil, nil
		}
		if limit > 0 && time.Since(start) >= limit {
			return nil, fmt.Errorf("the stream waited %s, at an event of recreated table %s, for the repair's snapshot of the rows the table received before it was published, which go first; "+
				"the repair waits for a transaction older than the table's joining the publication (the log names it every minute), and the open Kafka transaction cannot wait as long (exactly_once.transaction_timeout): the session ends, with nothing past the event confirmed, and the next one waits again", limit, t)
		}
		if time.Since(told) >= time.Minute {
			told = time.Now()
			w.log.Warn("the stream waits, at an event of a recreated table, for the repair's snapshot of the rows the table received before it was published, which go first", "table", t.String())
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-w.ended:
			return nil, fmt.Errorf("the repair of %s did not start: the tables' watch stopped", t)
		case <-changed:
		case <-time.After(time.Second): // a look that failed is tried again
		}
	}
}

// drop forgets repair r, which will not be sent, and lets the watch open
// another for its table.
func (w *Watch) drop(ctx context.Context, r *Repair) {
	w.mu.Lock()
	delete(w.pending, r.ID)
	delete(w.repairing, r.Table)
	w.mu.Unlock()
	if r.Snap != nil {
		r.Snap.Close(ctx)
	}
}

// Done records that r's table's relation is streamed from here on, every
// row of it delivered (checkpoint.Table.Floor 0: the repair sent those the
// stream did not carry; or r's Floor, set anew), forgets the fresh events
// the stream noted of it, and returns the tables' state for the checkpoint
// note. seen, for a repair whose rows went at the first of its relation's
// events (Before), is what its snapshot showed (checkpoint.Table.Seen),
// until its message (Done again, with nil) or Uncover. The stream's
// goroutine calls it.
func (w *Watch) Done(r *Repair, seen *checkpoint.Seen) map[string]checkpoint.Table {
	if r.Snap != nil {
		// Sent by the repair, or in its snapshot: none to tell apart
		// any more. A new Floor alone sent nothing: a repair still to
		// come needs them.
		delete(w.fresh, r.Table)
		delete(w.overflow, r.Table)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	prev := w.streamed[r.Table]
	st := checkpoint.Table{Rel: r.Rel, Member: r.Member, Former: slices.Clone(prev.Former), Floor: r.Floor, Files: r.Files, Seen: seen}
	if r.Old != 0 && r.Old != r.Rel && !slices.Contains(st.Former, r.Old) {
		st.Former = append(st.Former, r.Old)
	}
	w.streamed[r.Table] = st
	w.knowLocked(r.Table, st)
	delete(w.suspect, r.Table)
	delete(w.repairing, r.Table)
	return w.tablesLocked()
}

// Covered returns the tables whose checkpoint records a repair's snapshot
// the stream passes over events of (checkpoint.Table.Seen), with their
// relations: a session that starts after such a repair's rows went
// passes over them as the one that sent them did.
func (w *Watch) Covered() map[*outbox.Source]checkpoint.Table {
	w.mu.Lock()
	defer w.mu.Unlock()
	covered := map[*outbox.Source]checkpoint.Table{}
	for t, st := range w.streamed {
		if st.Seen != nil {
			covered[t] = st
		}
	}
	return covered
}

// Uncover records that the stream is past every transaction table t's
// repair's snapshot showed (checkpoint.Table.Seen) and returns the tables'
// state for the checkpoint note. The stream's goroutine calls it.
func (w *Watch) Uncover(t *outbox.Source) map[string]checkpoint.Table {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.streamed[t]
	st.Seen = nil
	w.streamed[t] = st
	return w.tablesLocked()
}

// tablesLocked is the tables' state for a checkpoint note. w.mu is held.
func (w *Watch) tablesLocked() map[string]checkpoint.Table {
	tables := map[string]checkpoint.Table{}
	for t, st := range w.streamed {
		tables[t.String()] = st
	}
	return tables
}

// closeRepairs closes the snapshots of repairs the stream did not reach:
// the next session repairs their tables again.
func (w *Watch) closeRepairs(ctx context.Context) {
	w.mu.Lock()
	pending := maps.Clone(w.pending)
	w.mu.Unlock()
	for _, r := range pending {
		w.drop(ctx, r)
	}
}

// ControlRepair announces, in the stream, the point at which a table the
// pipeline found recreated (or added back to its publication) is published
// again: the stream sends there the rows of the table's tableread.Snapshot, taken
// after the table was published and before this message was written, less
// those it streamed itself (docs/design.md, "Table changes"). Its ID is
// random, and known only to the session that wrote it: one another role
// writes, or an earlier session's read again, names no repair and is
// passed over.
const ControlRepair = "table-repair"

// EmitRepair writes the ControlRepair message with id, in a transaction of
// its own on conn, or on cfg's primary_url while conn's server is a hot
// standby.
func EmitRepair(ctx context.Context, cfg postgres.Config, conn *pgx.Conn, id string) error {
	b, _ := json.Marshal(decode.Control{Type: ControlRepair, ID: id})
	return postgres.EmitMessage(ctx, cfg, conn, decode.ControlPrefix, string(b), "a table repair's message")
}

// Rows hands send the rows of repair r, decoded as if committed at commit
// and at, the repair message's transaction, less those the stream sent
// itself (the fresh events the watch noted), a chunk of the snapshot at a
// time. blocking runs each read of the snapshot (it may block for
// seconds); after each chunk, chunkSent lets what it holds go and waits
// for room. It returns the rows read and sent, and closes the snapshot.
func (w *Watch) Rows(ctx context.Context, r *Repair, commit pglogrepl.LSN, at time.Time, blocking func(func() error) error,
	send func(*decode.Message) error, chunkSent func() error) (read, sent int, err error) {
	if r.Snap == nil {
		return 0, 0, nil // a new Floor (checkFiles): nothing to send
	}
	defer r.Snap.Close(ctx)
	// An imported snapshot (lockedRepair) reads its plan once its
	// transaction committed, maybe after the stream reached its message.
	if err := blocking(func() error { return r.Snap.Ready(ctx) }); err != nil {
		return 0, 0, fmt.Errorf("repair of %s: %w", r.Table, err)
	}
	dec, seen := r.Snap.Decoder(), w.Fresh(r.Table)
	for final := false; !final; {
		var rows [][][]byte
		err := blocking(func() (err error) {
			rows, final, err = r.Snap.Next(ctx)
			return err
		})
		if err != nil {
			return read, sent, fmt.Errorf("repair of %s: %w", r.Table, err)
		}
		for _, row := range rows {
			read++
			ev, err := dec.Row(row, commit, at)
			if err != nil {
				return read, sent, err
			}
			if _, ok := seen[ev.Event.ID()]; ok {
				continue // the stream sent it, in its place
			}
			if err := send(&ev); err != nil {
				return read, sent, err
			}
			sent++
		}
		if err := chunkSent(); err != nil {
			return read, sent, err
		}
	}
	return read, sent, nil
}
