package decode

import (
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/outbox"
)

// RowDecoder turns rows that a backfill read, in Postgres' text format,
// into events exactly as the Decoder turns pgoutput's INSERTs into events:
// the same column mapping and the same text forms, so that a backfilled
// row's record has the same bytes as the live one would have had.
type RowDecoder struct {
	d   *Decoder
	rel *relation
}

// NewRowDecoder maps t's fields onto a query's result columns.
func NewRowDecoder(t *outbox.Source, cols []Column) (*RowDecoder, error) {
	d := New([]*outbox.Source{t})
	if err := d.cacheRelation(Relation{Namespace: t.Name.Schema, Name: t.Name.Name, Columns: cols}); err != nil {
		return nil, err
	}
	return &RowDecoder{d: d, rel: d.rels[0]}, nil
}

// Row decodes one row: vals[i] is column i's text, nil for NULL. The
// event carries lsn and at as its commit LSN and time: where and when the
// backfill read it. The event's values are vals' bytes, not copies of
// them: vals must not change while the event is in use, as a chunk's rows
// do not (each is an allocation of its own, tableread's Plan.collect).
func (rd *RowDecoder) Row(vals [][]byte, lsn pglogrepl.LSN, at time.Time) (Message, error) {
	if len(vals) != len(rd.d.vals) {
		rd.d.vals = make([]tupleValue, len(vals))
	}
	for i, v := range vals {
		if v == nil {
			rd.d.vals[i] = tupleValue{kind: colNull}
		} else {
			rd.d.vals[i] = tupleValue{kind: colText, data: v}
		}
	}
	m, err := rd.d.row(rd.rel, outbox.Event{Source: rd.rel.table, CommitLSN: lsn, CommitTime: at}, true)
	if err != nil {
		return Message{}, fmt.Errorf("backfill row: %w", err)
	}
	m.Commit = lsn
	return m, nil
}
