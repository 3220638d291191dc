package pipeline

import (
	"time"

	"github.com/outboxcdc/cdc/internal/backfill"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/tablewatch"
)

// repairAt sends repair c's rows where the stream met its message m, in
// m's transaction, less those the stream sent itself, and notes the
// table's new relation in the checkpoint of m's position.
func (s *session) repairAt(c backfill.Control, m *decode.Message) error {
	w := s.tables
	r := w.Take(c.ID)
	if r == nil {
		return nil // another session's, read again, or not the connector's
	}
	read, sent, err := w.Rows(s.ctx, r, m.Commit, m.CommitTime, s.blocking, s.event, func() error {
		// The held batch goes now: this goroutine lets batches go.
		s.kafka.Release(time.Time{})
		return s.blocking(func() error { return s.room(s.ctx) })
	})
	if err != nil {
		return err
	}
	s.tracker.NoteTables(s.tx, w.Done(r))
	if r.Snap == nil {
		return nil // a new Floor only (tablewatch.Watch.checkFiles)
	}
	s.dec.Refresh()
	s.p.m.TableRepaired(r.Table.String())
	s.p.m.BackfillRows(r.Table.String()).Add(float64(sent))
	s.p.log.Named("tables").Info("repaired a recreated table: sent the rows it received before it was published", "table", r.Table.String(), "rows_read", read, "rows_sent", sent)
	return nil
}

// newDecoder is a session's decoder: leaf partitions found through pt,
// and, with a watch, relations known by their ids and the fresh events of
// recreated tables marked.
func (s *session) newDecoder(pt *tablewatch.Partitions, w *tablewatch.Watch) *decode.Decoder {
	d := decode.New(s.p.cfg.Tables)
	d.Partition = func(rel decode.Relation) (t *outbox.Source, root uint32, ok bool, err error) {
		err = s.blocking(func() (err error) {
			t, root, ok, err = pt.Lookup(s.ctx, rel)
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

// tableDeps is what the tables' watch needs of the pipeline.
func (p *Pipeline) tableDeps() tablewatch.Deps {
	return tablewatch.Deps{
		Postgres: p.cfg.Postgres, Tables: p.cfg.Tables, WALTables: p.cfg.WALTables(),
		ConfigFile: p.configFile(), Metrics: p.m, OpenSnapshot: p.backfills().OpenSnapshot, Log: p.log,
	}
}
