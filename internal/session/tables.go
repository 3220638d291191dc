package session

import (
	"slices"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/leaf"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/tablewatch"
)

// repairAt takes repair c's message m: it sends the repair's rows there,
// in m's transaction, less those the stream sent itself, unless they went
// at a fresh event already (fresh), and notes the table's new relation in
// the checkpoint of m's position.
func (s *session) repairAt(c decode.Control, m *decode.Message) error {
	w := s.tables
	r := w.Take(c.ID)
	if r == nil {
		return nil // another session's, read again, or not the connector's
	}
	if r.Early {
		// Every transaction its snapshot showed is behind: nothing
		// more to pass over.
		delete(s.covered, r.Table)
		delete(s.sent, r.Table)
		s.tracker.NoteTables(s.tx, w.Done(r, nil))
		return nil
	}
	if err := s.repairRows(r, m.Commit, m.CommitTime); err != nil {
		return err
	}
	s.tracker.NoteTables(s.tx, w.Done(r, nil))
	if r.Snap == nil {
		return nil // a new Floor only (tablewatch.Watch.checkFiles)
	}
	if err := s.dec.Refresh(); err != nil {
		return err
	}
	s.d.Metrics.TableRepaired(r.Table.String())
	return nil
}

// repairRows sends repair r's rows (none for a new Floor only) in the open
// transaction, committed at commit and at, less those the stream sent
// itself.
func (s *session) repairRows(r *tablewatch.Repair, commit pglogrepl.LSN, at time.Time) error {
	return s.repairRowsNoting(r, commit, at, nil)
}

// maxSentIDs bounds the ids of a repair's rows a session keeps in memory,
// to pass over the stream's events of them (about 100 bytes each).
const maxSentIDs = 200_000

// repairRowsNoting is repairRows, noting in ids the ids of the rows sent
// (as many as maxSentIDs; past them, ids is emptied and its "" key set:
// too many to keep).
func (s *session) repairRowsNoting(r *tablewatch.Repair, commit pglogrepl.LSN, at time.Time, ids map[string]bool) error {
	send := s.event
	if ids != nil {
		send = func(m *decode.Message) error {
			if !ids[""] {
				if ids[m.Event.ID()] = true; len(ids) > maxSentIDs {
					clear(ids)
					ids[""] = true
				}
			}
			return s.event(m)
		}
	}
	began, each := time.Now(), send
	send = func(m *decode.Message) error {
		if err := s.repairOverTime(r, began); err != nil {
			return err
		}
		return each(m)
	}
	read, sent, err := s.tables.Rows(s.ctx, r, commit, at, s.blocking, send, func() error {
		// The held batch goes now: this goroutine lets batches go.
		s.kafka.Release(time.Time{})
		return s.blocking(func() error { return s.room(s.ctx) })
	})
	if err != nil || r.Snap == nil {
		return err
	}
	s.d.Metrics.BackfillRows(r.Table.String()).Add(float64(sent))
	s.d.Log.Named("tables").Info("repaired a recreated table: sent the rows it received before it was published", "table", r.Table.String(), "rows_read", read, "rows_sent", sent, "commit_lsn", commit.String())
	return nil
}

// repairOverTime is the error that stops a repair begun at began in
// exactly-once mode once it has taken three quarters of
// exactly_once.transaction_timeout: its rows go in one Kafka transaction,
// which the brokers abort past the timeout, and the next session would
// begin the repair again, for ever.
func (s *session) repairOverTime(r *tablewatch.Repair, began time.Time) error {
	limit := s.d.Config.ExactlyOnce.TransactionTimeout * 3 / 4
	if s.eos == nil || time.Since(began) < limit {
		return nil
	}
	return errtext.Fatalf("the repair of %s has sent its rows for %s, and in exactly-once mode they go in one Kafka transaction, which exactly_once.transaction_timeout (%s) bounds: raise it (and the brokers' transaction.max.timeout.ms) to more than the repair takes, and start again; nothing past the table's first new event was confirmed",
		r.Table.String(), time.Since(began).Round(time.Second), s.d.Config.ExactlyOnce.TransactionTimeout)
}

// fresh takes event m of a relation the checkpoint does not name for its
// table (a table recreated, swapped, added back): it reports whether the
// stream passes over it, which the repair's snapshot sent.
//
// An aggregate keeps its order across the repair's point (docs/design.md,
// "Table changes"): the rows the new table received before it joined the
// publication, which only the repair's snapshot holds, were committed
// before any event of it that the stream carries. So at the first such
// event the stream waits (tablewatch.Watch.Before) for the repair's
// snapshot, sends its rows there, in this transaction, records the
// relation as the table's in this transaction's checkpoint note, with what
// the snapshot showed (checkpoint.Table.Seen), and from then on passes
// over the relation's events that the snapshot holds (their transactions
// ended before it) and sends the others, which committed after every row
// the snapshot sent. The wait holds nothing in memory: the events after
// this one wait in the WAL, and the stream keeps its slot meanwhile. A
// restart after this transaction's checkpoint passes over the same
// events, from the checkpoint's Seen: in exactly-once mode nothing is
// sent twice.
func (s *session) fresh(m *decode.Message) (passed bool, err error) {
	t := m.Event.Source
	if rel, ok := s.unrepaired[t]; ok && rel == m.Rel {
		s.tables.NoteFresh(&m.Event)
		return false, nil
	}
	// In exactly-once mode the open Kafka transaction holds this
	// transaction's events: it cannot wait longer than the brokers keep
	// it open.
	limit := time.Duration(0)
	if s.eos != nil {
		limit = s.d.Config.ExactlyOnce.TransactionTimeout / 2
	}
	var r *tablewatch.Repair
	err = s.blocking(func() (err error) {
		r, err = s.tables.Before(s.ctx, t, m.Rel, m.XID, limit)
		return err
	})
	if err != nil {
		return false, err
	}
	if r == nil {
		// No repair of this relation is coming: its events go as they
		// come, and one that comes later leaves out those noted (sent
		// twice past tablewatch's bound, never lost).
		if s.unrepaired == nil {
			s.unrepaired = map[*outbox.Source]uint32{}
		}
		s.unrepaired[t] = m.Rel
		s.d.Log.Named("tables").Warn("events of a relation of an outbox table that the connector has not streamed before, and that no repair is under way for (another relation has the table's name): they are sent as they come; were it repaired later, the rows it received before it was published would follow them, out of the order they were committed in",
			"table", t.String(), "relation", m.Rel)
		s.tables.NoteFresh(&m.Event)
		return false, nil
	}
	ids := map[string]bool{}
	if err := s.repairRowsNoting(r, m.Commit, m.Event.CommitTime, ids); err != nil {
		return false, err
	}
	r.Early = true
	seen := r.Snap.Seen
	// The stream passes over an event the snapshot's transactions wrote
	// only when the repair sent its row: one deleted before the snapshot
	// (an INSERT and a DELETE in one transaction, a clean-up) is in no
	// snapshot. The ids are kept in memory for this session, and in the
	// checkpoint when they are few, for a session after a restart; with
	// too many, that one passes over nothing: a row may be sent twice,
	// none lost.
	seen.IDs, seen.All = nil, !ids[""] && len(ids) <= checkpoint.MaxSeenIDs
	if seen.All {
		for id := range ids {
			seen.IDs = append(seen.IDs, id)
		}
		slices.Sort(seen.IDs)
	}
	if ids[""] {
		ids = nil
	}
	if s.sent == nil {
		s.sent = map[*outbox.Source]map[string]bool{}
	}
	s.sent[t] = ids
	s.tracker.NoteTables(s.tx, s.tables.Done(r, &seen))
	if s.covered == nil {
		s.covered = map[*outbox.Source]checkpoint.Table{}
	}
	s.covered[t] = checkpoint.Table{Rel: r.Rel, Seen: &seen}
	if err := s.dec.Refresh(); err != nil {
		return false, err
	}
	s.d.Metrics.TableRepaired(t.String())
	return seen.Sees(m.XID) && s.sentBy(t, &seen, m.Event.ID()), nil
}

// freshEvent handles an event of a relation its table was not streamed
// from (decode.Message.Fresh), and reports whether the stream passes over
// it: one Kafka holds already, one the repair's snapshot holds
// (tablewatch.Watch.NamedAfter: only of a relation the stream names
// otherwise, which it would have passed over as unmapped before the
// naming; one under the table's name is mapped by it, and its event of a
// row deleted since is in no snapshot: TestRepairSendsTheEventOfADeletedRow),
// or one the repair sent (fresh).
func (s *session) freshEvent(m *decode.Message) (passed bool, err error) {
	switch {
	case s.skipping:
		// Kafka holds it: the repair must not send it again.
		s.tables.NoteFresh(&m.Event)
		return true, nil
	case m.Elsewhere && s.tables.NamedAfter(m.Rel, m.XID):
		// Written before the watch named the relation: the repair's
		// snapshot holds its row (docs/design.md, "Published where it is
		// repaired").
		s.d.Log.Debug("passed over an insert of a relation named after it was written: the repair sends its row", "table", m.Event.Source.String(), "relation", m.Rel, "xid", m.XID)
		return true, nil
	}
	return s.fresh(m)
}

// sentBy reports whether the repair of t, whose snapshot showed seen,
// sent the row of event id: by the ids this session noted, or those the
// checkpoint kept.
func (s *session) sentBy(t *outbox.Source, seen *checkpoint.Seen, id string) bool {
	if ids, ok := s.sent[t]; ok {
		return ids[id]
	}
	return seen.Sent(id)
}

// uncover, at the commit of transaction xid, records for each covered
// table whose repair's snapshot xid began after that every transaction the
// snapshot showed is behind: the stream passes over nothing more.
func (s *session) uncover(xid uint32) {
	for t, c := range s.covered {
		if c.Seen.Past(xid) {
			delete(s.covered, t)
			delete(s.sent, t)
			s.tracker.NoteTables(s.tx, s.tables.Uncover(t))
		}
	}
}

// newDecoder is a session's decoder: leaf partitions found through pt,
// and, with a watch, relations known by their ids and the fresh events of
// recreated tables marked.
func (s *session) newDecoder(pt *leaf.Finder, w *tablewatch.Watch) *decode.Decoder {
	d := decode.New(s.d.Config.Tables)
	d.Partition = func(rel decode.Relation) (t *outbox.Source, root uint32, ok bool, err error) {
		err = s.blocking(func() (err error) {
			t, root, ok, err = pt.Lookup(s.ctx, rel, d.XID())
			return err
		})
		if ok && w != nil {
			w.NoteLeaf(rel.ID, t, root)
		}
		return t, root, ok, err
	}
	if w != nil {
		d.Known, d.Fresh, pt.Known = w.Known, w.IsFresh, w.Known
	}
	return d
}
