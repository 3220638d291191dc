package decode

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/outbox"
)

// The builders below write pgoutput protocol 1 messages byte by byte, as the
// PostgreSQL documentation ("Logical Replication Message Formats") lays them
// out, so the tests do not share code with the parser they check.

type msg struct{ bytes.Buffer }

func (m *msg) u8(v byte) *msg    { m.WriteByte(v); return m }
func (m *msg) u16(v uint16) *msg { m.Write(binary.BigEndian.AppendUint16(nil, v)); return m }
func (m *msg) u32(v uint32) *msg { m.Write(binary.BigEndian.AppendUint32(nil, v)); return m }
func (m *msg) u64(v uint64) *msg { m.Write(binary.BigEndian.AppendUint64(nil, v)); return m }
func (m *msg) str(s string) *msg { m.WriteString(s); m.WriteByte(0); return m }

func beginMsg(final uint64, xid uint32, ts time.Time) []byte {
	m := &msg{}
	m.u8('B').u64(final).u64(uint64(ts.Sub(pgEpoch).Microseconds())).u32(xid)
	return m.Bytes()
}

func commitMsg(commit, end uint64, ts time.Time) []byte {
	m := &msg{}
	m.u8('C').u8(0).u64(commit).u64(end).u64(uint64(ts.Sub(pgEpoch).Microseconds()))
	return m.Bytes()
}

type col struct {
	name string
	oid  uint32
}

func relationMsg(id uint32, ns, name string, cols ...col) []byte {
	m := &msg{}
	m.u8('R').u32(id).str(ns).str(name).u8('d').u16(uint16(len(cols)))
	for _, c := range cols {
		m.u8(0).str(c.name).u32(c.oid).u32(0xffffffff)
	}
	return m.Bytes()
}

// val is a tuple column: nil is NULL.
func insertMsg(rel uint32, vals ...*string) []byte {
	m := &msg{}
	m.u8('I').u32(rel).u8('N').u16(uint16(len(vals)))
	for _, v := range vals {
		if v == nil {
			m.u8('n')
			continue
		}
		m.u8('t').u32(uint32(len(*v)))
		m.WriteString(*v)
	}
	return m.Bytes()
}

func s(v string) *string { return &v }

const (
	oidText = 25
	oidUUID = 2950
)

var outboxCols = []col{
	{"id", oidUUID}, {"aggregatetype", oidText}, {"aggregateid", oidText},
	{"type", oidText}, {"payload", oidJSONB},
}

func testTable() *outbox.Source {
	return &outbox.Source{Name: outbox.TableName{Schema: "public", Name: "outbox"}, Columns: outbox.DefaultColumns, Topic: outbox.DefaultTopic}
}

func field(ev outbox.Event, f outbox.Field) string { return string(ev.Fields[f].B) }

func mustDecode(t *testing.T, d *Decoder, data []byte) Message {
	t.Helper()
	m, err := d.Decode(data)
	if err != nil {
		t.Fatalf("Decode(%q): %v", data, err)
	}
	return m
}

func TestDecodeTransaction(t *testing.T) {
	tbl := testTable()
	d := New([]*outbox.Source{tbl})
	ts := time.Date(2026, 11, 22, 10, 0, 0, 123456000, time.UTC)

	if m := mustDecode(t, d, beginMsg(0x1000, 42, ts)); m.Kind != KindBegin || m.XID != 42 || m.Commit != 0x1000 {
		t.Fatalf("begin = %+v", m)
	}
	if m := mustDecode(t, d, relationMsg(16384, "public", "outbox", outboxCols...)); m.Kind != KindOther {
		t.Fatalf("relation kind = %v", m.Kind)
	}
	payload := `{"a": {"b": [1, 2]}, "name": "ünïcødé ✓"}`
	in := insertMsg(16384, s("6f1c"), s("order"), s("o-1"), s("OrderCreated"), s(payload))
	m := mustDecode(t, d, in)
	if m.Kind != KindEvent {
		t.Fatalf("insert kind = %v", m.Kind)
	}
	// The decoder must not alias the input buffer: pgconn reuses it.
	for i := range in {
		in[i] = 0
	}
	ev := m.Event
	if ev.Source != tbl || field(ev, outbox.FieldID) != "6f1c" || field(ev, outbox.FieldAggregateType) != "order" ||
		field(ev, outbox.FieldAggregateID) != "o-1" || field(ev, outbox.FieldEventType) != "OrderCreated" ||
		field(ev, outbox.FieldPayload) != payload || ev.Fields[outbox.FieldPayload].Kind != outbox.KindJSON ||
		ev.CommitLSN != 0x1000 || !ev.CommitTime.Equal(ts) || ev.XID != 42 || !ev.Fields[outbox.FieldTimestamp].Null() {
		t.Fatalf("event = %+v", ev)
	}
	c := mustDecode(t, d, commitMsg(0x1000, 0x1030, ts))
	if c.Kind != KindCommit || c.EndLSN != pglogrepl.LSN(0x1030) || c.Commit != 0x1000 || c.XID != 42 {
		t.Fatalf("commit = %+v", c)
	}
}

func TestDecodeValues(t *testing.T) {
	tests := []struct {
		name        string
		payloadOID  uint32
		payload     *string
		wantPayload []byte
		wantErr     string
	}{
		{name: "jsonb bytes as sent", payloadOID: oidJSONB, payload: s(`{"k": "v"}`), wantPayload: []byte(`{"k": "v"}`)},
		{name: "text", payloadOID: oidText, payload: s("plain"), wantPayload: []byte("plain")},
		{name: "empty text is not NULL", payloadOID: oidText, payload: s(""), wantPayload: []byte{}},
		{name: "NULL", payloadOID: oidJSONB, payload: nil, wantPayload: nil},
		{name: "bytea hex to raw", payloadOID: oidBytea, payload: s(`\x00ff10`), wantPayload: []byte{0, 0xff, 0x10}},
		{name: "bytea escape format", payloadOID: oidBytea, payload: s(`abc`), wantErr: "bytea_output"},
		{name: "bytea bad hex", payloadOID: oidBytea, payload: s(`\xzz`), wantErr: "bytea"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := New([]*outbox.Source{testTable()})
			cols := append([]col(nil), outboxCols...)
			cols[4].oid = tt.payloadOID
			mustDecode(t, d, beginMsg(1, 1, pgEpoch))
			mustDecode(t, d, relationMsg(1, "public", "outbox", cols...))
			m, err := d.Decode(insertMsg(1, s("i"), s("t"), s("a"), s("e"), tt.payload))
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantErr != "" {
				// A value that does not decode is a poison event, for the
				// source's on_invalid policy, not a stream error.
				if m.Kind != KindInvalid || m.Invalid == nil || !strings.Contains(m.Invalid.Error(), tt.wantErr) {
					t.Fatalf("kind %v, invalid %v; want KindInvalid mentioning %q", m.Kind, m.Invalid, tt.wantErr)
				}
				return
			}
			got := m.Event.Fields[outbox.FieldPayload].B
			if !bytes.Equal(got, tt.wantPayload) || (got == nil) != (tt.wantPayload == nil) {
				t.Fatalf("payload = %q (nil=%v), want %q (nil=%v)", got, got == nil, tt.wantPayload, tt.wantPayload == nil)
			}
		})
	}
}

func TestDecodeMappingAndTables(t *testing.T) {
	camel := &outbox.Source{
		Name: outbox.TableName{Schema: "tenant", Name: "OutboxEvent"},
		Columns: outbox.Columns{outbox.FieldID: "id", outbox.FieldAggregateType: "aggregateType", outbox.FieldAggregateID: "aggregateId",
			outbox.FieldEventType: "eventType", outbox.FieldPayload: "payload", outbox.FieldTenant: "tenantId"},
		Extra: []string{"status"},
		Topic: "x",
	}
	d := New([]*outbox.Source{testTable(), camel})
	mustDecode(t, d, beginMsg(1, 7, pgEpoch))
	// Column order differs from the mapping order, and there are extra columns.
	mustDecode(t, d, relationMsg(2, "tenant", "OutboxEvent",
		col{"tenantId", oidText}, col{"payload", oidJSONB}, col{"eventType", oidText},
		col{"aggregateId", oidText}, col{"aggregateType", oidText}, col{"id", oidText}, col{"status", oidText}))
	mustDecode(t, d, relationMsg(3, "public", "orders", col{"id", oidText}))
	m := mustDecode(t, d, insertMsg(2, s("t1"), s("{}"), s("kitchen.task.claimed"), s("task-9"), s("Task"), s("cuid1"), s("pending")))
	ev := m.Event
	if m.Kind != KindEvent || ev.Source != camel || field(ev, outbox.FieldID) != "cuid1" || field(ev, outbox.FieldAggregateType) != "Task" ||
		field(ev, outbox.FieldAggregateID) != "task-9" || field(ev, outbox.FieldEventType) != "kitchen.task.claimed" ||
		field(ev, outbox.FieldPayload) != "{}" || field(ev, outbox.FieldTenant) != "t1" || len(ev.Extra) != 1 || string(ev.Extra[0].B) != "pending" {
		t.Fatalf("event = %+v", ev)
	}
	// An insert into a published relation that no table maps is
	// reported, never silently passed over (docs/design.md, "Table changes").
	if m := mustDecode(t, d, insertMsg(3, s("x"))); m.Kind != KindUnmapped || m.Relation != "public.orders" {
		t.Fatalf("insert into a table that is not an outbox: kind %v relation %q, want KindUnmapped public.orders", m.Kind, m.Relation)
	}
	// Updates and deletes are never events.
	upd := append([]byte{'U'}, insertMsg(2, s("a"))[1:]...)
	del := (&msg{}).u8('D').u32(2).u8('K').u16(0).Bytes()
	for _, b := range [][]byte{upd, del} {
		if m := mustDecode(t, d, b); m.Kind != KindOther {
			t.Fatalf("%q: kind %v, want KindOther", b[0], m.Kind)
		}
	}
}

// TestDecodePartitions: a publication without publish_via_partition_root
// names the leaf partition that took a row; Partition maps it to its
// configured root, so the event is the root's, and a relation that is no
// partition of a configured table is reported as unmapped. A failed
// lookup is a LookupError (retried), not a malformed message.
func TestDecodePartitions(t *testing.T) {
	root := testTable()
	d := New([]*outbox.Source{root})
	var asked []string
	var fail error
	d.Partition = func(rel Relation) (*outbox.Source, uint32, bool, error) {
		asked = append(asked, rel.Name)
		if fail != nil {
			return nil, 0, false, fail
		}
		if strings.HasPrefix(rel.Name, "outbox_") {
			return root, 1, true, nil
		}
		return nil, 0, false, nil
	}
	mustDecode(t, d, beginMsg(1, 1, pgEpoch))
	mustDecode(t, d, relationMsg(11, "public", "outbox_2026_01", outboxCols...))
	mustDecode(t, d, relationMsg(12, "public", "orders", col{"id", oidText}))
	m := mustDecode(t, d, insertMsg(11, s("i"), s("order"), s("a-1"), s("Created"), s("{}")))
	if m.Kind != KindEvent || m.Event.Source != root || field(m.Event, outbox.FieldID) != "i" {
		t.Fatalf("insert into a leaf partition: kind %v table %v", m.Kind, m.Event.Source)
	}
	if m := mustDecode(t, d, insertMsg(12, s("x"))); m.Kind != KindUnmapped || m.Relation != "public.orders" {
		t.Fatalf("insert into another table: kind %v relation %q", m.Kind, m.Relation)
	}
	if strings.Join(asked, ",") != "outbox_2026_01,orders" {
		t.Fatalf("looked up %v: each relation once, never the configured one", asked)
	}
	fail = errors.New("connection reset")
	_, err := d.Decode(relationMsg(13, "public", "outbox_2026_02", outboxCols...))
	if !errors.As(err, new(*LookupError)) {
		t.Fatalf("a failed lookup: %v, want a *LookupError", err)
	}
}

// TestDecodeFresh: events of a relation Fresh names are marked, from its
// Relation message on, and Refresh asks again for the cached relations.
func TestDecodeFresh(t *testing.T) {
	tbl := testTable()
	d := New([]*outbox.Source{tbl})
	streamed := uint32(1)
	d.Fresh = func(t *outbox.Source, id uint32) bool { return t == tbl && id != streamed }
	insert := func(rel uint32) Message {
		mustDecode(t, d, beginMsg(1, 1, pgEpoch))
		m := mustDecode(t, d, insertMsg(rel, s("i"), s("order"), s("a-1"), s("Created"), s("{}")))
		mustDecode(t, d, commitMsg(1, 2, pgEpoch))
		return m
	}
	mustDecode(t, d, relationMsg(1, "public", "outbox", outboxCols...))
	mustDecode(t, d, relationMsg(2, "public", "outbox", outboxCols...)) // recreated: a new OID
	if insert(1).Fresh || !insert(2).Fresh {
		t.Fatal("want the old relation's events ordinary and the new one's fresh")
	}
	streamed = 2
	d.Refresh()
	if !insert(1).Fresh || insert(2).Fresh {
		t.Fatal("after Refresh, want relation 1's events fresh and relation 2's ordinary")
	}
}

// TestDecodeNamedSinceCached: a relation cached as unmapped (a new
// schema's table, app_new.outbox) is mapped at its next insert once Known
// names it, with no Relation message anew (a schema renamed into place
// sends none): its inserts are the table's events from then on, not only
// from the next Refresh. A leaf partition Known does not name is looked up
// again through its root by Refresh.
func TestDecodeNamedSinceCached(t *testing.T) {
	tbl := testTable()
	d := New([]*outbox.Source{tbl})
	named := map[uint32]bool{}
	d.Known = func(id uint32) (*outbox.Source, uint32, bool) { return tbl, id, named[id] }
	leafRoot := false
	d.Partition = func(rel Relation) (*outbox.Source, uint32, bool, error) {
		return tbl, 30, leafRoot && rel.ID == 31, nil
	}
	insert := func(rel uint32) Message {
		mustDecode(t, d, beginMsg(1, 1, pgEpoch))
		m := mustDecode(t, d, insertMsg(rel, s("i"), s("order"), s("a-1"), s("Created"), s("{}")))
		mustDecode(t, d, commitMsg(1, 2, pgEpoch))
		return m
	}
	mustDecode(t, d, relationMsg(20, "app_new", "outbox", outboxCols...))
	mustDecode(t, d, relationMsg(31, "app_new", "outbox_p0", outboxCols...))
	if insert(20).Kind != KindUnmapped || insert(31).Kind != KindUnmapped {
		t.Fatal("want another schema's table and its leaf unmapped")
	}
	named[20] = true
	if m := insert(20); m.Kind != KindEvent || m.Event.Source != tbl || m.Rel != 20 {
		t.Fatalf("once Known names it: kind %v rel %d, want the table's event", m.Kind, m.Rel)
	}
	leafRoot = true
	if err := d.Refresh(); err != nil {
		t.Fatal(err)
	}
	if m := insert(31); m.Kind != KindEvent || m.Rel != 30 {
		t.Fatalf("a leaf after Refresh: kind %v rel %d, want the root's event", m.Kind, m.Rel)
	}
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name string
		msgs [][]byte
		want string
	}{
		{"mapped column missing", [][]byte{relationMsg(1, "public", "outbox", outboxCols[:4]...)}, `no column payload`},
		{"message outside transaction", [][]byte{messageMsg(true, "outbox", `{}`)}, "outside a transaction"},
		{"insert before relation", [][]byte{beginMsg(1, 1, pgEpoch), insertMsg(9, s("x"))}, "before its Relation"},
		{"insert outside transaction", [][]byte{relationMsg(1, "public", "outbox", outboxCols...), insertMsg(1, s("a"), s("b"), s("c"), s("d"), s("e"))}, "outside a transaction"},
		{"nested begin", [][]byte{beginMsg(1, 1, pgEpoch), beginMsg(2, 2, pgEpoch)}, "inside transaction"},
		{"commit without begin", [][]byte{commitMsg(1, 2, pgEpoch)}, "outside a transaction"},
		{"truncated begin", [][]byte{beginMsg(1, 1, pgEpoch)[:9]}, "truncated"},
		{"short tuple", [][]byte{beginMsg(1, 1, pgEpoch), relationMsg(1, "public", "outbox", outboxCols...), insertMsg(1, s("a"), s("b"))}, "columns"},
		{"unknown type", [][]byte{{'Z'}}, "unknown message type"},
		{"empty", [][]byte{{}}, "empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := New([]*outbox.Source{testTable(), {MessagePrefix: "outbox", Columns: outbox.DefaultMessageFields}})
			var err error
			for _, b := range tt.msgs {
				if _, err = d.Decode(b); err != nil {
					break
				}
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tt.want)
			}
		})
	}
}

func messageMsg(transactional bool, prefix, content string) []byte {
	m := &msg{}
	flags := byte(0)
	if transactional {
		flags = 1
	}
	m.u8('M').u8(flags).u64(0x2000).str(prefix).u32(uint32(len(content)))
	m.WriteString(content)
	return m.Bytes()
}

func TestDecodeTypedValues(t *testing.T) {
	tbl := &outbox.Source{Name: outbox.TableName{Schema: "public", Name: "event_outbox"},
		Columns: outbox.Columns{outbox.FieldID: "id", outbox.FieldPayload: "payload", outbox.FieldTimestamp: "created_at", outbox.FieldVersion: "v"},
		Extra:   []string{"flag", "blob"}}
	d := New([]*outbox.Source{tbl})
	mustDecode(t, d, beginMsg(1, 1, pgEpoch))
	mustDecode(t, d, relationMsg(5, "public", "event_outbox",
		col{"id", oidInt4}, col{"payload", oidJSONB}, col{"created_at", oidTimestamptz}, col{"v", oidNumeric},
		col{"flag", oidBool}, col{"blob", oidBytea}))
	m := mustDecode(t, d, insertMsg(5, s("42"), s(`[1]`), s("2026-11-22 10:00:00.5+00"), s("1.5"), s("t"), s(`\x6869`)))
	ev := m.Event
	want := []struct {
		v    outbox.Value
		b    string
		kind outbox.Kind
	}{
		{ev.Fields[outbox.FieldID], "42", outbox.KindNumber},
		{ev.Fields[outbox.FieldPayload], "[1]", outbox.KindJSON},
		{ev.Fields[outbox.FieldTimestamp], "2026-11-22 10:00:00.5+00", outbox.KindTimestamp},
		{ev.Fields[outbox.FieldVersion], "1.5", outbox.KindNumber},
		{ev.Extra[0], "t", outbox.KindBool},
		{ev.Extra[1], "hi", outbox.KindBytes},
	}
	for i, w := range want {
		if string(w.v.B) != w.b || w.v.Kind != w.kind {
			t.Errorf("value %d = %q kind %d, want %q kind %d", i, w.v.B, w.v.Kind, w.b, w.kind)
		}
	}
}

func TestDecodeLogicalMessages(t *testing.T) {
	src := &outbox.Source{MessagePrefix: "outbox", Columns: outbox.DefaultMessageFields, Extra: []string{"group_id"}}
	d := New([]*outbox.Source{testTable(), src})
	mustDecode(t, d, beginMsg(0x3000, 9, pgEpoch))
	content := `{"id":"e1","aggregate_type":"order","aggregate_id":"o-1","event_type":"Paid","payload":{"total":12.5,"items":["a"]},"version":2,"group_id":"g-1","timestamp":"2026-11-22T10:00:00Z"}`
	m := mustDecode(t, d, messageMsg(true, "outbox", content))
	ev := m.Event
	if m.Kind != KindEvent || ev.Source != src || field(ev, outbox.FieldID) != "e1" || field(ev, outbox.FieldAggregateID) != "o-1" ||
		field(ev, outbox.FieldPayload) != `{"total":12.5,"items":["a"]}` || ev.Fields[outbox.FieldPayload].Kind != outbox.KindJSON ||
		field(ev, outbox.FieldVersion) != "2" || ev.Fields[outbox.FieldVersion].Kind != outbox.KindNumber ||
		ev.Fields[outbox.FieldTimestamp].Kind != outbox.KindTimestamp || string(ev.Extra[0].B) != "g-1" ||
		string(ev.Raw) != content || ev.CommitLSN != 0x3000 || !ev.Fields[outbox.FieldTenant].Null() {
		t.Fatalf("event = %+v", ev)
	}
	for _, tc := range []struct {
		name string
		msg  []byte
		kind Kind
	}{
		{"non-transactional", messageMsg(false, "outbox", content), KindIgnoredMessage},
		{"unknown prefix", messageMsg(true, "audit", content), KindIgnoredMessage},
		{"not JSON", messageMsg(true, "outbox", `not json`), KindInvalid},
		{"JSON but not an object", messageMsg(true, "outbox", `[1,2]`), KindInvalid},
	} {
		if m := mustDecode(t, d, tc.msg); m.Kind != tc.kind {
			t.Errorf("%s: kind %v, want %v", tc.name, m.Kind, tc.kind)
		}
	}
}

// FuzzDecode feeds arbitrary bytes after a valid prefix; the decoder must
// return an error or a message, never panic or over-allocate.
func FuzzDecode(f *testing.F) {
	f.Add(beginMsg(1, 1, pgEpoch))
	f.Add(relationMsg(1, "public", "outbox", outboxCols...))
	f.Add(insertMsg(1, s("a"), s("b"), s("c"), s("d"), s(`{"x": 1}`)))
	f.Add(commitMsg(1, 2, pgEpoch))
	f.Add([]byte{'R', 0, 0, 0, 1, 0, 0, 'd', 0xff, 0xff})
	f.Add(messageMsg(true, "outbox", `{"id":"1","payload":{}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		d := New([]*outbox.Source{testTable(), {MessagePrefix: "outbox", Columns: outbox.DefaultMessageFields}})
		_, _ = d.Decode(beginMsg(1, 1, pgEpoch))
		_, _ = d.Decode(relationMsg(1, "public", "outbox", outboxCols...))
		m, err := d.Decode(data)
		if err == nil && m.Kind == KindEvent && m.Event.Source == nil {
			t.Fatalf("event without table")
		}
	})
}

// TestBeginCommitTime reads the commit time of pgoutput's BEGIN, and
// nothing from other messages or a short one.
func TestBeginCommitTime(t *testing.T) {
	at := time.Date(2026, 11, 24, 10, 0, 0, 123456000, time.UTC)
	b := beginMsg(0x1000, 7, at)
	if got, ok := BeginCommitTime(b); !ok || !got.Equal(at) {
		t.Fatalf("BEGIN: %v, %v; want %v", got, ok, at)
	}
	for _, data := range [][]byte{b[:20], append([]byte{'C'}, b[1:]...), nil} {
		if _, ok := BeginCommitTime(data); ok {
			t.Fatalf("%q read as a BEGIN", data)
		}
	}
}
