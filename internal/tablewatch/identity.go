package tablewatch

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/metrics"
	"github.com/outboxcdc/cdc/internal/outbox"
)

// A table is followed by its relation id, not its name (docs/design.md,
// "Table changes"): pgoutput names a relation as the catalog named it where
// the change was written, so a renamed table, a swap's old table and a leaf
// partition (under a publication without publish_via_partition_root, or
// detached since) arrive under names no configured table has. The ids
// below are the decoder's first answer (decode.Decoder.Known); only a
// relation none of them names is looked up by name, then through its
// partition root, and only then reported as unmapped.

// maxFresh bounds the ids of fresh events a session notes per table.
// Past it, a repair may send those rows a second time; none is lost.
const maxFresh = 100_000

// known is a relation known to be a table's: root is the id the decoder
// compares with the table's streamed one (a partition's root's).
type known struct {
	t    *outbox.Source
	root uint32
	// named is the snapshot in which the watch named the relation the
	// table's (Watch.name), nil for one known otherwise.
	named *checkpoint.Seen
}

// knowLocked records st's relations as t's: the one streamed and the
// former ones. w.mu is held (or w not shared yet).
func (w *Watch) knowLocked(t *outbox.Source, st checkpoint.Table) {
	if st.Rel != 0 {
		w.rels[st.Rel] = known{t: t, root: st.Rel}
	}
	for _, id := range st.Former {
		w.rels[id] = known{t: t, root: id}
	}
}

// Known is the decoder's Decoder.Known: the table relation id belongs to,
// whatever it is named now, and the id to compare with the table's.
func (w *Watch) Known(id uint32) (*outbox.Source, uint32, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	k, ok := w.rels[id]
	return k.t, k.root, ok
}

// NoteLeaf records that relation id is a leaf partition of t (whose
// relation is root): found once, it stays t's for the session, detached
// or not, so that an insert the stream meets after the partition was
// detached is still the table's event.
func (w *Watch) NoteLeaf(id uint32, t *outbox.Source, root uint32) {
	w.mu.Lock()
	if _, ok := w.rels[id]; !ok {
		w.rels[id] = known{t: t, root: root}
	}
	w.mu.Unlock()
}

// noteLeaves records the leaf partitions table t's relation rel has now
// (NoteLeaf), at each look: a partition attached and detached between two
// inserts the stream has not reached yet is known by then.
func (w *Watch) noteLeaves(ctx context.Context, conn *pgx.Conn, t *outbox.Source, rel uint32) error {
	rows, err := conn.Query(ctx, `SELECT relid::oid FROM pg_partition_tree($1::oid::regclass) WHERE isleaf`, rel)
	if err != nil {
		return fmt.Errorf("read the partitions of %s: %w", t, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uint32])
	if err != nil {
		return fmt.Errorf("read the partitions of %s: %w", t, err)
	}
	for _, id := range ids {
		w.NoteLeaf(id, t, rel)
	}
	return nil
}

// NamedAfter reports whether transaction xid, which wrote an insert into
// relation rel that the stream reads as a fresh event of a table, and
// names otherwise than the table (decode.Message.Elsewhere), ended
// before the watch named rel the table's (Watch.name): its row is the
// repair's, whose snapshot was taken later, as it is for any insert the
// stream passed over as unmapped before the naming. The stream passes over
// such an event. Taken as the repair's place instead, it would put the
// snapshot's rows, which hold transactions committed after it, ahead of
// events of the table's former relation committed between the two: a
// stream behind the watch met the new relation's first insert, written
// before a swap, only once the watch had named it, and sent the rows
// written after the swap before the former relation's written before it.
func (w *Watch) NamedAfter(rel, xid uint32) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	k, ok := w.rels[rel]
	return ok && k.named != nil && k.named.Sees(xid)
}

// tableOf returns the table whose streamed relation is id, or nil.
func (w *Watch) tableOf(id uint32) *outbox.Source {
	w.mu.Lock()
	defer w.mu.Unlock()
	for t, st := range w.streamed {
		if st.Rel == id {
			return t
		}
	}
	return nil
}

// IsFresh is the decoder's Decoder.Fresh: whether relation id of t is not
// one the connector streamed for t (the table was dropped and created
// again, and not repaired yet).
func (w *Watch) IsFresh(t *outbox.Source, id uint32) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if st, ok := w.streamed[t]; ok {
		return id != st.Rel && !slices.Contains(st.Former, id)
	}
	s, ok := w.suspect[t]
	return ok && id == s
}

// NoteFresh notes a fresh event the stream met, on its goroutine.
func (w *Watch) NoteFresh(ev *outbox.Event) {
	ids := w.fresh[ev.Source]
	if ids == nil {
		ids = map[string]struct{}{}
		w.fresh[ev.Source] = ids
	}
	if len(ids) >= maxFresh {
		if !w.overflow[ev.Source] {
			w.overflow[ev.Source] = true
			w.log.Warn("more events of a recreated table than a repair keeps track of; rows streamed past these may be sent twice by the repair (none is lost)", "table", ev.Source.String(), "tracked", maxFresh)
		}
		return
	}
	ids[ev.ID()] = struct{}{}
}

// Fresh is the ids of the fresh events of t the stream noted. The
// stream's goroutine calls it.
func (w *Watch) Fresh(t *outbox.Source) map[string]struct{} { return w.fresh[t] }

// UnmappedInsert counts an insert into a relation no table maps, by id,
// name or partition root, and logs the first of each relation (at most
// metrics.MaxUnmappedRelations of them, as the metric names). Such a
// relation was never one of the configured tables' in this session or a
// checkpoint: a table someone added to the publication, or any table of a
// FOR ALL TABLES or schema publication.
func (w *Watch) UnmappedInsert(rel string) {
	w.deps.Metrics.Unmapped(rel)
	if w.unmapped[rel] || len(w.unmapped) >= metrics.MaxUnmappedRelations {
		return
	}
	w.unmapped[rel] = true
	w.log.Warn("an insert into a relation of the publication that no configured table maps, by name or by id: not an event; if it is an outbox table, configure it, else remove it from the publication",
		"relation", rel, "publication", w.deps.Postgres.Publication)
}
