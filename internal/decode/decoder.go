package decode

import (
	"encoding/hex"
	"fmt"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/outbox"
)

// Kind says what a decoded message means to the pipeline.
type Kind uint8

const (
	// KindOther needs no action: relation and type metadata, origins, and
	// changes that are not INSERTs into a configured table.
	KindOther Kind = iota
	// KindBegin opens a transaction.
	KindBegin
	// KindEvent carries one outbox event of the open transaction.
	KindEvent
	// KindCommit closes the open transaction; Message.EndLSN is set.
	KindCommit
)

// Message is the result of decoding one pgoutput message.
type Message struct {
	Kind   Kind
	Event  outbox.Event  // KindEvent
	EndLSN pglogrepl.LSN // KindCommit: end of the commit record
	XID    uint32        // KindBegin, KindCommit
	Commit pglogrepl.LSN // KindBegin, KindCommit: LSN of the commit record
}

// Type OIDs the decoder treats specially (pg_type.dat).
const (
	oidBytea = 17
)

// relation is a cached Relation message of a configured table, reduced to
// what decoding an INSERT needs.
type relation struct {
	table *outbox.Table
	// index of each mapped column in the tuple, in the order of
	// outbox.Columns.Names.
	idx          [5]int
	payloadBytea bool
}

// Decoder decodes one replication session's pgoutput stream. It is not safe
// for concurrent use; the replication loop owns it.
type Decoder struct {
	tables map[outbox.TableName]*outbox.Table
	rels   map[uint32]*relation // nil entry: a table we do not stream
	begin  Begin
	inTx   bool
	vals   []tupleValue
}

// New returns a Decoder for the given outbox tables.
func New(tables []*outbox.Table) *Decoder {
	d := &Decoder{
		tables: make(map[outbox.TableName]*outbox.Table, len(tables)),
		rels:   make(map[uint32]*relation),
	}
	for _, t := range tables {
		d.tables[t.Name] = t
	}
	return d
}

// Decode decodes one pgoutput message (the WAL data of one XLogData). The
// returned Message's byte slices do not alias data.
func (d *Decoder) Decode(data []byte) (Message, error) {
	if len(data) == 0 {
		return Message{}, fmt.Errorf("decode pgoutput: empty message")
	}
	r := &reader{b: data[1:]}
	var m Message
	var err error
	switch data[0] {
	case msgBegin:
		b := parseBegin(r)
		if r.err == nil {
			if d.inTx {
				err = fmt.Errorf("BEGIN of xid %d inside transaction xid %d", b.XID, d.begin.XID)
				break
			}
			d.begin, d.inTx = b, true
			m = Message{Kind: KindBegin, XID: b.XID, Commit: b.FinalLSN}
		}
	case msgCommit:
		c := parseCommit(r)
		if r.err == nil {
			if !d.inTx {
				err = fmt.Errorf("COMMIT at %s outside a transaction", c.CommitLSN)
				break
			}
			m = Message{Kind: KindCommit, EndLSN: c.EndLSN, XID: d.begin.XID, Commit: c.CommitLSN}
			d.inTx = false
		}
	case msgRelation:
		rel := parseRelation(r)
		if r.err == nil {
			err = d.cacheRelation(rel)
		}
	case msgInsert:
		m, err = d.insert(r)
	case msgOrigin, msgType, msgUpdate, msgDelete, msgTruncate, msgMessage:
		// Not events. The publication publishes inserts only, so updates,
		// deletes and truncates arrive only from a publication changed by
		// hand; they never cancel an INSERT already in the WAL.
	default:
		err = fmt.Errorf("unknown message type %q", data[0])
	}
	if r.err != nil {
		err = r.err
	}
	if err != nil {
		return Message{}, fmt.Errorf("decode pgoutput %q message: %w", data[0], err)
	}
	return m, nil
}

func (d *Decoder) cacheRelation(rel Relation) error {
	t, ok := d.tables[outbox.TableName{Schema: rel.Namespace, Name: rel.Name}]
	if !ok {
		d.rels[rel.ID] = nil
		return nil
	}
	c := &relation{table: t}
	for i, want := range t.Columns.Names() {
		c.idx[i] = -1
		for j, col := range rel.Columns {
			if col.Name == want {
				c.idx[i] = j
				if want == t.Columns.Payload {
					c.payloadBytea = col.TypeOID == oidBytea
				}
				break
			}
		}
		if c.idx[i] < 0 {
			return fmt.Errorf("table %s has no column %s, which the configuration maps; was it renamed or dropped? fix tables[].columns or the table", t.Name, outbox.QuoteIdent(want))
		}
	}
	d.rels[rel.ID] = c
	return nil
}

func (d *Decoder) insert(r *reader) (Message, error) {
	relID := r.uint32()
	if r.uint8() != 'N' && r.err == nil {
		return Message{}, fmt.Errorf("INSERT without new tuple")
	}
	rel, known := d.rels[relID]
	if r.err != nil {
		return Message{}, nil
	}
	if !known {
		return Message{}, fmt.Errorf("INSERT for relation %d before its Relation message", relID)
	}
	if rel == nil {
		return Message{}, nil // not an outbox table
	}
	if !d.inTx {
		return Message{}, fmt.Errorf("INSERT outside a transaction")
	}
	d.vals = parseTuple(r, d.vals)
	if r.err != nil {
		return Message{}, nil
	}
	var fields [5][]byte
	for i, j := range rel.idx {
		if j >= len(d.vals) {
			return Message{}, fmt.Errorf("INSERT into %s has %d columns, relation has more", rel.table.Name, len(d.vals))
		}
		v := d.vals[j]
		switch v.kind {
		case colNull:
			fields[i] = nil
		case colText:
			if i == 4 && rel.payloadBytea {
				b, err := decodeByteaHex(v.data)
				if err != nil {
					return Message{}, fmt.Errorf("payload of %s: %w", rel.table.Name, err)
				}
				fields[i] = b
			} else {
				fields[i] = clone(v.data)
			}
		default:
			// Protocol 1 without the binary option sends text; an
			// unchanged-TOAST marker cannot appear in an INSERT.
			return Message{}, fmt.Errorf("INSERT into %s: unexpected column kind %q", rel.table.Name, v.kind)
		}
	}
	return Message{Kind: KindEvent, XID: d.begin.XID, Commit: d.begin.FinalLSN, Event: outbox.Event{
		Table:         rel.table,
		ID:            fields[0],
		AggregateType: fields[1],
		AggregateID:   fields[2],
		Type:          fields[3],
		Payload:       fields[4],
		CommitLSN:     d.begin.FinalLSN,
		CommitTime:    d.begin.CommitTime,
		XID:           d.begin.XID,
	}}, nil
}

// clone copies b, keeping the difference between empty and nil (NULL).
func clone(b []byte) []byte {
	c := make([]byte, len(b))
	copy(c, b)
	return c
}

// decodeByteaHex decodes bytea's text output format, \x followed by hex.
func decodeByteaHex(b []byte) ([]byte, error) {
	if len(b) < 2 || b[0] != '\\' || b[1] != 'x' {
		return nil, fmt.Errorf("bytea value not in hex format; set bytea_output = 'hex' for the connector's role")
	}
	out := make([]byte, hex.DecodedLen(len(b)-2))
	if _, err := hex.Decode(out, b[2:]); err != nil {
		return nil, fmt.Errorf("bytea value: %w", err)
	}
	return out, nil
}
