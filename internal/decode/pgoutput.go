package decode

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
)

// Message type bytes of the pgoutput logical replication protocol, version 1
// (PostgreSQL docs, "Logical Replication Message Formats").
const (
	msgBegin    = 'B'
	msgCommit   = 'C'
	msgOrigin   = 'O'
	msgRelation = 'R'
	msgType     = 'Y'
	msgInsert   = 'I'
	msgUpdate   = 'U'
	msgDelete   = 'D'
	msgTruncate = 'T'
	msgMessage  = 'M'
)

// Tuple column kinds in TupleData.
const (
	colNull      = 'n'
	colUnchanged = 'u' // unchanged TOASTed value; never in an INSERT
	colText      = 't'
	colBinary    = 'b'
)

var errShort = errors.New("message truncated")

// reader walks a pgoutput message. Every read checks bounds, because the
// input is whatever arrived on the socket and the fuzz target feeds it noise.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
	r.b = nil
}

func (r *reader) uint8() uint8 {
	if len(r.b) < 1 {
		r.fail(errShort)
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) uint16() uint16 {
	if len(r.b) < 2 {
		r.fail(errShort)
		return 0
	}
	v := binary.BigEndian.Uint16(r.b)
	r.b = r.b[2:]
	return v
}

func (r *reader) uint32() uint32 {
	if len(r.b) < 4 {
		r.fail(errShort)
		return 0
	}
	v := binary.BigEndian.Uint32(r.b)
	r.b = r.b[4:]
	return v
}

func (r *reader) uint64() uint64 {
	if len(r.b) < 8 {
		r.fail(errShort)
		return 0
	}
	v := binary.BigEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

// cstring reads a NUL-terminated string.
func (r *reader) cstring() string {
	for i, c := range r.b {
		if c == 0 {
			s := string(r.b[:i])
			r.b = r.b[i+1:]
			return s
		}
	}
	r.fail(fmt.Errorf("string not terminated"))
	return ""
}

// bytes returns the next n bytes without copying.
func (r *reader) bytes(n int) []byte {
	if n < 0 || len(r.b) < n {
		r.fail(errShort)
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

// pgEpoch is 2000-01-01, the origin of Postgres timestamps.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func pgTime(micros uint64) time.Time {
	return pgEpoch.Add(time.Duration(int64(micros)) * time.Microsecond)
}

// Begin is pgoutput's Begin message.
type Begin struct {
	FinalLSN   pglogrepl.LSN // LSN of the commit record
	CommitTime time.Time
	XID        uint32
}

// Commit is pgoutput's Commit message.
type Commit struct {
	CommitLSN  pglogrepl.LSN // LSN of the commit record
	EndLSN     pglogrepl.LSN // end of the commit record: the position to confirm
	CommitTime time.Time
}

// Column describes one column of a Relation message.
type Column struct {
	Name    string
	TypeOID uint32
}

// Relation is pgoutput's Relation message.
type Relation struct {
	ID        uint32
	Namespace string
	Name      string
	Columns   []Column
}

// tupleValue is one column of a TupleData, still pointing into the input.
type tupleValue struct {
	kind byte
	data []byte
}

func parseBegin(r *reader) Begin {
	return Begin{
		FinalLSN:   pglogrepl.LSN(r.uint64()),
		CommitTime: pgTime(r.uint64()),
		XID:        r.uint32(),
	}
}

func parseCommit(r *reader) Commit {
	r.uint8() // flags, unused
	return Commit{
		CommitLSN:  pglogrepl.LSN(r.uint64()),
		EndLSN:     pglogrepl.LSN(r.uint64()),
		CommitTime: pgTime(r.uint64()),
	}
}

func parseRelation(r *reader) Relation {
	rel := Relation{ID: r.uint32(), Namespace: r.cstring(), Name: r.cstring()}
	r.uint8() // replica identity setting
	n := int(r.uint16())
	if r.err != nil {
		return rel
	}
	// Each column takes at least 10 bytes; refuse counts the input cannot
	// hold before allocating for them.
	if n*10 > len(r.b) {
		r.fail(errShort)
		return rel
	}
	rel.Columns = make([]Column, n)
	for i := range rel.Columns {
		r.uint8() // flags (1 = part of the key)
		rel.Columns[i].Name = r.cstring()
		rel.Columns[i].TypeOID = r.uint32()
		r.uint32() // type modifier
	}
	return rel
}

// parseTuple reads a TupleData into vals, reusing its storage.
func parseTuple(r *reader, vals []tupleValue) []tupleValue {
	n := int(r.uint16())
	if r.err != nil {
		return vals[:0]
	}
	if n > len(r.b) { // each column takes at least one byte
		r.fail(errShort)
		return vals[:0]
	}
	vals = vals[:0]
	for i := 0; i < n && r.err == nil; i++ {
		v := tupleValue{kind: r.uint8()}
		switch v.kind {
		case colNull, colUnchanged:
		case colText, colBinary:
			v.data = r.bytes(int(int32(r.uint32())))
		default:
			r.fail(fmt.Errorf("unknown tuple column kind %q", v.kind))
		}
		vals = append(vals, v)
	}
	return vals
}

// IsCommit reports whether data is a pgoutput COMMIT message: the
// replication loop ends a transaction there (wal.Stream.End).
func IsCommit(data []byte) bool { return len(data) > 0 && data[0] == msgCommit }

// BeginCommitTime is the commit time a pgoutput BEGIN message carries, or
// false for another message: the replication loop reads it before it hands
// the message on, to tell a stream that runs live from a backlog.
func BeginCommitTime(data []byte) (time.Time, bool) {
	if len(data) == 0 || data[0] != msgBegin {
		return time.Time{}, false
	}
	r := &reader{b: data[1:]}
	b := parseBegin(r)
	if r.err != nil {
		return time.Time{}, false
	}
	return b.CommitTime, true
}
