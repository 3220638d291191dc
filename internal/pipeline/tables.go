package pipeline

import (
	"fmt"
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
	sent, read := 0, 0
	if r.Snap != nil {
		defer r.Snap.Close(s.ctx)
		dec, seen := r.Snap.Decoder(), w.Fresh(r.Table)
		limit := max(s.p.cfg.MaxInFlight/2, 1)
		bytes := max(s.p.cfg.MaxInFlightBytes-chunkBytes(s.p.cfg.MaxInFlightBytes), 0)
		for final := false; !final; {
			var rows [][][]byte
			err := s.blocking(func() (err error) {
				rows, final, err = r.Snap.Next(s.ctx)
				return err
			})
			if err != nil {
				return fmt.Errorf("repair of %s: %w", r.Table, err)
			}
			for _, row := range rows {
				read++
				ev, err := dec.Row(row, m.Commit, m.CommitTime)
				if err != nil {
					return err
				}
				if _, ok := seen[ev.Event.ID()]; ok {
					continue // the stream sent it, in its place
				}
				if err := s.event(&ev); err != nil {
					return err
				}
				sent++
			}
			// The held batch goes now: the loop that lets batches go is
			// this goroutine, which waits below for their acks.
			s.kafka.Release(time.Time{})
			if err := s.blocking(func() error { return s.tracker.WaitRoom(s.ctx, limit, bytes) }); err != nil {
				return err
			}
		}
	}
	s.tracker.NoteTables(s.tx, w.Done(r))
	s.dec.Refresh()
	s.p.m.TableRepaired(r.Table.String())
	s.p.m.BackfillRows(r.Table.String()).Add(float64(sent))
	s.p.log.Named("tables").Info("repaired a recreated table: sent the rows it received before it was published", "table", r.Table.String(), "rows_read", read, "rows_sent", sent)
	return nil
}

// newDecoder is a session's decoder: leaf partitions found through pt,
// and, with a watch, the fresh events of recreated tables marked.
func (s *session) newDecoder(pt *tablewatch.Partitions, w *tablewatch.Watch) *decode.Decoder {
	d := decode.New(s.p.cfg.Tables)
	d.Partition = func(rel decode.Relation) (t *outbox.Source, root uint32, ok bool, err error) {
		err = s.blocking(func() (err error) {
			t, root, ok, err = pt.Lookup(s.ctx, rel)
			return err
		})
		return t, root, ok, err
	}
	if w != nil {
		d.Fresh = w.IsFresh
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
