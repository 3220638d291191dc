package decode

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pgident"
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
	// KindInvalid carries an event that cannot be decoded as configured;
	// Message.Invalid says why and Event holds what could be read. The
	// pipeline applies the source's on_invalid policy.
	KindInvalid
	// KindIgnoredMessage is a logical decoding message the connector does
	// not take: non-transactional, or with a prefix no source names.
	KindIgnoredMessage
	// KindCommit closes the open transaction; Message.EndLSN is set.
	KindCommit
	// KindControl is a transactional logical decoding message with the
	// connector's own prefix (ControlPrefix): a backfill's request or
	// watermark. Message.Control holds its content.
	KindControl
	// KindUnmapped is an INSERT into a relation of the publication that
	// no configured table maps, by id (Decoder.Known), name or partition
	// root (Message.Relation names it): a publication broader than the
	// outbox tables, or a table someone added to it. It is not an event;
	// the pipeline counts and reports it.
	KindUnmapped
)

// ControlPrefix is the pg_logical_emit_message prefix of the connector's
// own messages: backfill requests and watermarks (docs/design.md).
const ControlPrefix = "outbox-cdc"

// Message is the result of decoding one pgoutput message.
type Message struct {
	Kind    Kind
	Event   outbox.Event       // KindEvent, KindInvalid
	Invalid *outbox.EventError // KindInvalid
	EndLSN  pglogrepl.LSN      // KindCommit: end of the commit record
	XID     uint32             // KindBegin, KindCommit
	Commit  pglogrepl.LSN      // KindBegin, KindCommit: LSN of the commit record
	// CommitTime is the transaction's commit time (KindBegin, KindCommit).
	CommitTime time.Time
	// Control is a KindControl message's content; it aliases the input.
	Control []byte
	// Relation names the relation of a KindUnmapped insert.
	Relation string
	// Fresh marks an event (KindEvent, KindInvalid) of a relation that
	// Decoder.Fresh says the connector has not streamed for its table
	// before: the table was dropped and created again, or added back to
	// the publication. The pipeline sends what the new table received
	// before it was published first. Rel is the relation's id, as Fresh
	// was asked it (a partition's root's).
	Fresh bool
	Rel   uint32
	// Elsewhere marks a Fresh event of a relation the stream names
	// otherwise than its table (its Relation message's name, say a schema
	// renamed into place since), mapped only because Decoder.Known knows
	// its id: read before the watch named it the table's, it would have
	// been unmapped.
	Elsewhere bool
}

// Type OIDs the decoder reads specially (pg_type.dat).
const (
	oidBool        = 16
	oidBytea       = 17
	oidInt8        = 20
	oidInt2        = 21
	oidInt4        = 23
	oidOID         = 26
	oidJSON        = 114
	oidFloat4      = 700
	oidFloat8      = 701
	oidTimestamp   = 1114
	oidTimestamptz = 1184
	oidNumeric     = 1700
	oidJSONB       = 3802
)

func kindOf(oid uint32) outbox.Kind {
	switch oid {
	case oidJSON, oidJSONB:
		return outbox.KindJSON
	case oidInt2, oidInt4, oidInt8, oidOID, oidFloat4, oidFloat8, oidNumeric:
		return outbox.KindNumber
	case oidBool:
		return outbox.KindBool
	case oidBytea:
		return outbox.KindBytes
	case oidTimestamp, oidTimestamptz:
		return outbox.KindTimestamp
	}
	return outbox.KindText
}

// column is where one needed value sits in a tuple, and how to read it.
type column struct {
	idx  int // -1: unmapped
	kind outbox.Kind
}

// relation is a cached Relation message, reduced to what decoding an
// INSERT needs: for a configured table (or a partition of one) its
// columns, for any other relation its name.
type relation struct {
	table *outbox.Source // nil: no configured table maps it
	name  string         // the relation's qualified name, for an unmapped one
	// raw is an unmapped one's Relation message, mapped again on Refresh
	// once Known names it: pgoutput sends none anew when a schema renamed
	// into place makes it a table's.
	raw *Relation
	// id is the configured table's relation id: the relation's own, or
	// its root's for a partition; fresh is whether that differs from the
	// one Known gave for the table.
	id    uint32
	fresh bool
	// elsewhere: the Relation message names it otherwise than table,
	// and it is no partition (Message.Elsewhere).
	elsewhere bool
	fields    [outbox.NumFields]column
	extra     []column
	// used lists the tuple index of every field and extra read, once per
	// read, to size a row's copy.
	used []int
}

// Decoder decodes one replication session's pgoutput stream. It is not safe
// for concurrent use; the replication loop owns it.
type Decoder struct {
	tables   map[outbox.TableName]*outbox.Source
	messages map[string]*outbox.Source
	rels     map[uint32]*relation
	begin    Begin
	inTx     bool
	vals     []tupleValue

	// Known, when set, names the configured table relation id is known to
	// be (its streamed relation, a former one, or a leaf partition of
	// one), whatever its name, and the id to compare with the table's
	// (a partition's root's). It is asked first, before the name.
	Known func(id uint32) (t *outbox.Source, root uint32, ok bool)
	// Partition, when set, finds the configured table that a relation
	// whose name is not configured is a partition of, at any depth, and
	// that table's relation id: a publication without
	// publish_via_partition_root names the leaf partition that took a
	// row, not the partitioned table (docs/design.md, "Table changes").
	// ok is false for a relation that is no partition of a configured
	// table. An error ends the session, which retries (a *LookupError).
	Partition func(rel Relation) (t *outbox.Source, root uint32, ok bool, err error)
	// Fresh, when set, tells whether relation id of table t is one the
	// connector has not streamed for t before (the table was dropped and
	// created again, or added back to the publication): its events are
	// marked Message.Fresh. It is asked when a Relation message arrives
	// and on Refresh.
	Fresh func(t *outbox.Source, id uint32) bool
}

// LookupError is a failed Partition lookup: the catalog could not be read,
// which a new session retries. It is not a malformed message.
type LookupError struct{ Err error }

func (e *LookupError) Error() string { return "look up relation's partition root: " + e.Err.Error() }
func (e *LookupError) Unwrap() error { return e.Err }

// Refresh asks Fresh again for every cached relation, and maps every
// unmapped one again (by Known, name and Partition, as a Relation message
// would): call it when the answers may have changed (the pipeline took a
// recreated or swapped table's rows). A leaf partition of a table a
// schema's rename put in place is found through its root only now. An
// error is a relation that became a table's without the columns the
// configuration maps, or a failed Partition lookup (a *LookupError).
func (d *Decoder) Refresh() error {
	for _, rel := range d.rels {
		if rel.table != nil {
			rel.fresh = d.Fresh != nil && d.Fresh(rel.table, rel.id)
		} else if rel.raw != nil {
			if err := d.cacheRelation(*rel.raw); err != nil {
				return err
			}
		}
	}
	return nil
}

// XID is the transaction being decoded, 0 between transactions.
func (d *Decoder) XID() uint32 {
	if !d.inTx {
		return 0
	}
	return d.begin.XID
}

// New returns a Decoder for the given sources.
func New(sources []*outbox.Source) *Decoder {
	d := &Decoder{
		tables:   map[outbox.TableName]*outbox.Source{},
		messages: map[string]*outbox.Source{},
		rels:     map[uint32]*relation{},
	}
	for _, t := range sources {
		if t.IsMessage() {
			d.messages[t.MessagePrefix] = t
		} else {
			d.tables[t.Name] = t
		}
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
			m = Message{Kind: KindBegin, XID: b.XID, Commit: b.FinalLSN, CommitTime: b.CommitTime}
		}
	case msgCommit:
		c := parseCommit(r)
		if r.err == nil {
			if !d.inTx {
				err = fmt.Errorf("COMMIT at %s outside a transaction", c.CommitLSN)
				break
			}
			m = Message{Kind: KindCommit, EndLSN: c.EndLSN, XID: d.begin.XID, Commit: c.CommitLSN, CommitTime: c.CommitTime}
			d.inTx = false
		}
	case msgRelation:
		rel := parseRelation(r)
		if r.err == nil {
			err = d.cacheRelation(rel)
		}
	case msgInsert:
		m, err = d.insert(r)
	case msgMessage:
		m, err = d.message(r)
	case msgOrigin, msgType, msgUpdate, msgDelete, msgTruncate:
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
	var t *outbox.Source
	var id uint32
	ok := false
	if d.Known != nil {
		// By id first: a name is not an identity (docs/design.md, "Table
		// changes").
		t, id, ok = d.Known(rel.ID)
	}
	if !ok {
		id = rel.ID
		t, ok = d.tables[outbox.TableName{Schema: rel.Namespace, Name: rel.Name}]
	}
	if !ok && d.Partition != nil {
		var err error
		if t, id, ok, err = d.Partition(rel); err != nil {
			return &LookupError{Err: err}
		}
	}
	if !ok {
		d.rels[rel.ID] = &relation{name: pgident.Qualified(rel.Namespace, rel.Name), raw: &rel}
		return nil
	}
	find := func(name string) (column, error) {
		for j, col := range rel.Columns {
			if col.Name == name {
				return column{idx: j, kind: kindOf(col.TypeOID)}, nil
			}
		}
		return column{}, fmt.Errorf("table %s has no column %s, which the configuration maps; was it renamed or dropped? fix the config or the table", t.Name, pgident.Quote(name))
	}
	c := &relation{table: t, id: id, extra: make([]column, len(t.Extra))}
	c.fresh = d.Fresh != nil && d.Fresh(t, id)
	c.elsewhere = id == rel.ID && (rel.Namespace != t.Name.Schema || rel.Name != t.Name.Name)
	for f, name := range t.Columns {
		c.fields[f] = column{idx: -1}
		if name == "" {
			continue
		}
		col, err := find(name)
		if err != nil {
			return err
		}
		c.fields[f] = col
	}
	for i, name := range t.Extra {
		col, err := find(name)
		if err != nil {
			return err
		}
		c.extra[i] = col
	}
	for _, col := range c.fields {
		if col.idx >= 0 {
			c.used = append(c.used, col.idx)
		}
	}
	for _, col := range c.extra {
		c.used = append(c.used, col.idx)
	}
	d.rels[rel.ID] = c
	return nil
}

// newEvent starts an event of the open transaction from source t.
func (d *Decoder) newEvent(t *outbox.Source) outbox.Event {
	return outbox.Event{Source: t, CommitLSN: d.begin.FinalLSN, CommitTime: d.begin.CommitTime, XID: d.begin.XID}
}

// eventMessage is the KindEvent message for ev.
func (d *Decoder) eventMessage(ev outbox.Event) Message {
	return Message{Kind: KindEvent, Event: ev, XID: d.begin.XID, Commit: d.begin.FinalLSN}
}

// invalidMessage is the KindInvalid message for ev, saying why.
func (d *Decoder) invalidMessage(ev outbox.Event, format string, args ...any) Message {
	m := d.eventMessage(ev)
	m.Kind, m.Invalid = KindInvalid, outbox.Invalid(&ev, format, args...)
	return m
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
	if !d.inTx {
		return Message{}, fmt.Errorf("INSERT outside a transaction")
	}
	if rel.table == nil && rel.raw != nil && d.Known != nil {
		// Named a table's since it was cached (a schema renamed into
		// place sends no Relation message anew): the watch names such a
		// relation before its repair's snapshot, so every insert from then
		// on is streamed, and every one before is in the snapshot.
		if _, _, ok := d.Known(relID); ok {
			if err := d.cacheRelation(*rel.raw); err != nil {
				return Message{}, err
			}
			rel = d.rels[relID]
		}
	}
	if rel.table == nil {
		return Message{Kind: KindUnmapped, Relation: rel.name, XID: d.begin.XID, Commit: d.begin.FinalLSN}, nil
	}
	d.vals = parseTuple(r, d.vals)
	if r.err != nil {
		return Message{}, nil
	}
	m, err := d.row(rel, d.newEvent(rel.table), false)
	m.Fresh, m.Rel, m.Elsewhere = rel.fresh, rel.id, rel.elsewhere
	return m, err
}

// row builds the event of one row of rel, from the values in d.vals.
func (d *Decoder) row(rel *relation, ev outbox.Event, owned bool) (Message, error) {
	ev.Extra = make([]outbox.Value, len(rel.extra))
	// One copy of the row's text values, out of the replication buffer
	// pgconn reuses: one allocation per row rather than one per column.
	// Values that are the caller's own (a backfill's rows, RowDecoder)
	// are not copied again.
	var buf []byte
	if !owned {
		size := 0
		for _, c := range rel.used {
			if c < len(d.vals) {
				size += len(d.vals[c].data)
			}
		}
		buf = make([]byte, 0, size)
	}
	text := func(b []byte) []byte {
		if owned {
			return b[:len(b):len(b)]
		}
		start := len(buf)
		buf = append(buf, b...)
		return buf[start:len(buf):len(buf)] // capped: an append elsewhere cannot reach the next value
	}
	var bad error
	read := func(c column) (outbox.Value, error) {
		if c.idx < 0 {
			return outbox.Value{}, nil
		}
		if c.idx >= len(d.vals) {
			return outbox.Value{}, fmt.Errorf("INSERT into %s has %d columns, relation has more", rel.table.Name, len(d.vals))
		}
		v := d.vals[c.idx]
		switch v.kind {
		case colNull:
			return outbox.Value{Kind: c.kind}, nil
		case colText:
			if c.kind == outbox.KindBytes {
				b, err := decodeByteaHex(v.data)
				if err != nil && bad == nil {
					bad = err
				}
				return outbox.Value{B: b, Kind: c.kind}, nil
			}
			return outbox.Value{B: text(v.data), Kind: c.kind}, nil
		default:
			// Protocol 1 without the binary option sends text; an
			// unchanged-TOAST marker cannot appear in an INSERT.
			return outbox.Value{}, fmt.Errorf("INSERT into %s: unexpected column kind %q", rel.table.Name, v.kind)
		}
	}
	for f, c := range rel.fields {
		v, err := read(c)
		if err != nil {
			return Message{}, err
		}
		ev.Fields[f] = v
	}
	for i, c := range rel.extra {
		v, err := read(c)
		if err != nil {
			return Message{}, err
		}
		ev.Extra[i] = v
	}
	if bad != nil {
		return d.invalidMessage(ev, "a bytea value does not decode: %v", bad), nil
	}
	return d.eventMessage(ev), nil
}

// message decodes a logical decoding message (pg_logical_emit_message).
// Only transactional messages with a configured prefix are events: they
// arrive between their transaction's BEGIN and COMMIT, in order with its
// rows. Non-transactional ones arrive at once, outside any transaction,
// and would not be atomic with it.
func (d *Decoder) message(r *reader) (Message, error) {
	flags := r.uint8()
	r.uint64() // the message's own LSN
	prefix := r.cstring()
	content := r.bytes(int(int32(r.uint32())))
	if r.err != nil {
		return Message{}, nil
	}
	if prefix == ControlPrefix && flags&1 != 0 && d.inTx {
		return Message{Kind: KindControl, XID: d.begin.XID, Commit: d.begin.FinalLSN, CommitTime: d.begin.CommitTime, Control: content}, nil
	}
	t, ok := d.messages[prefix]
	if !ok || flags&1 == 0 {
		return Message{Kind: KindIgnoredMessage}, nil
	}
	if !d.inTx {
		return Message{}, fmt.Errorf("transactional message with prefix %q outside a transaction", prefix)
	}
	ev := d.newEvent(t)
	ev.Raw = clone(content)
	ev.Extra = make([]outbox.Value, len(t.Extra))
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(content, &doc); err != nil {
		return d.invalidMessage(ev, "message content is not a JSON object: %v", err), nil
	}
	for f, name := range t.Columns {
		if name == "" {
			continue
		}
		v, err := jsonValue(doc[name], outbox.Field(f) == outbox.FieldPayload)
		if err != nil {
			return d.invalidMessage(ev, "member %q: %v", name, err), nil
		}
		if outbox.Field(f) == outbox.FieldTimestamp && v.Kind == outbox.KindText {
			v.Kind = outbox.KindTimestamp
		}
		ev.Fields[f] = v
	}
	for i, name := range t.Extra {
		v, err := jsonValue(doc[name], false)
		if err != nil {
			return d.invalidMessage(ev, "member %q: %v", name, err), nil
		}
		ev.Extra[i] = v
	}
	return d.eventMessage(ev), nil
}

// jsonValue turns a JSON member into a Value: strings are unquoted text,
// numbers and booleans keep their literal, objects and arrays stay JSON. A
// payload is always kept as the JSON document, whatever its type.
func jsonValue(raw json.RawMessage, payload bool) (outbox.Value, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return outbox.Value{}, nil
	}
	if payload {
		return outbox.Value{B: clone(raw), Kind: outbox.KindJSON}, nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return outbox.Value{}, err
		}
		return outbox.Value{B: []byte(s), Kind: outbox.KindText}, nil
	case '{', '[':
		return outbox.Value{B: clone(raw), Kind: outbox.KindJSON}, nil
	case 't', 'f':
		return outbox.Value{B: clone(raw), Kind: outbox.KindBool}, nil
	default:
		return outbox.Value{B: clone(raw), Kind: outbox.KindNumber}, nil
	}
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
