package park

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/outbox"
)

// The headers a parked record carries besides a dead letter's (package
// route): which parking it belongs to, the event that holds it back (on
// the others), and, on the first, the event it came from; on one behind
// it, the partition its table's expression pinned it to, which its
// redrive keeps (the key's other events are there).
const (
	HeaderEpisode   = "parked_episode"
	HeaderBehind    = "parked_behind"
	HeaderEvent     = "parked_event"
	HeaderPartition = "parked_partition"
)

// NewEpisode is a parking's random name.
func NewEpisode() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// jsonEvent is an event as its parked record keeps it, to be routed again
// at its redrive: its fields and extra columns (nil: NULL), where it
// committed.
type jsonEvent struct {
	Fields     [outbox.NumFields]*[]byte `json:"fields"`
	Kinds      [outbox.NumFields]uint8   `json:"kinds"`
	Extra      []*[]byte                 `json:"extra,omitempty"`
	ExtraKinds []uint8                   `json:"extra_kinds,omitempty"`
	Raw        []byte                    `json:"raw,omitempty"`
	CommitLSN  string                    `json:"commit_lsn"`
	CommitTime time.Time                 `json:"commit_time"`
	XID        uint32                    `json:"xid"`
}

// EncodeEvent is ev as its parked record's HeaderEvent keeps it.
func EncodeEvent(ev *outbox.Event) []byte {
	j := jsonEvent{Raw: ev.Raw, CommitLSN: ev.CommitLSN.String(), CommitTime: ev.CommitTime, XID: ev.XID}
	for i, v := range ev.Fields {
		if !v.Null() {
			b := v.B
			j.Fields[i] = &b
		}
		j.Kinds[i] = uint8(v.Kind)
	}
	for _, v := range ev.Extra {
		var p *[]byte
		if !v.Null() {
			b := v.B
			p = &b
		}
		j.Extra, j.ExtraKinds = append(j.Extra, p), append(j.ExtraKinds, uint8(v.Kind))
	}
	b, _ := json.Marshal(j)
	return b
}

// DecodeEvent is the event of src a parked record's HeaderEvent kept.
func DecodeEvent(b []byte, src *outbox.Source) (outbox.Event, error) {
	var j jsonEvent
	if err := json.Unmarshal(b, &j); err != nil {
		return outbox.Event{}, fmt.Errorf("read a parked event: %w", err)
	}
	if len(j.Extra) != len(src.Extra) || len(j.ExtraKinds) != len(j.Extra) {
		return outbox.Event{}, fmt.Errorf("read a parked event of %s: it has %d extra columns, the configuration maps %d; configure the table as it was when the event was parked", src, len(j.Extra), len(src.Extra))
	}
	lsn, err := pglogrepl.ParseLSN(j.CommitLSN)
	if err != nil {
		return outbox.Event{}, fmt.Errorf("read a parked event: %w", err)
	}
	ev := outbox.Event{Source: src, Raw: j.Raw, CommitLSN: lsn, CommitTime: j.CommitTime, XID: j.XID}
	for i, p := range j.Fields {
		ev.Fields[i].Kind = outbox.Kind(j.Kinds[i])
		if p != nil {
			ev.Fields[i].B = nonNil(*p)
		}
	}
	for i, p := range j.Extra {
		v := outbox.Value{Kind: outbox.Kind(j.ExtraKinds[i])}
		if p != nil {
			v.B = nonNil(*p)
		}
		ev.Extra = append(ev.Extra, v)
	}
	return ev, nil
}

// nonNil keeps an empty value from reading as NULL.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// RequestMaxAge is how far apart a redrive request's requested_at and the
// commit of the WAL message that announces it may be: more is a request
// announced again by a role that can write a logical decoding message.
const RequestMaxAge = 10 * time.Minute

// ControlRequest is the control message (package backfill's Control) that
// announces a redrive request in the WAL.
const ControlRequest = "redrive-request"

// RequestPrefix starts a redrive request's ID, which shares the
// checkpoint topic's request keys with backfill requests.
const RequestPrefix = "redrive-"

// Request is what cdc redrive asks the running pipeline to do: send the
// selected parked keys' events on, in order; with DropFirst, the first of
// each to the dead-letter topic instead. It is kept in the checkpoint
// topic and signed as a backfill request is (docs/security.md).
type Request struct {
	ID          string    `json:"id"`
	Key         string    `json:"key,omitempty"`
	Table       string    `json:"table,omitempty"`
	All         bool      `json:"all,omitempty"`
	DropFirst   bool      `json:"drop_first,omitempty"`
	RequestedAt time.Time `json:"requested_at"`
	MAC         string    `json:"mac,omitempty"`
}

// Selector is what r selects.
func (r Request) Selector() Selector { return Selector{Key: r.Key, Table: r.Table, All: r.All} }

func (r Request) mac(secret []byte, key string) []byte {
	h := hmac.New(sha256.New, secret)
	for _, f := range []string{"outbox-cdc redrive request v1", key, r.ID, r.Key, r.Table, fmt.Sprint(r.All), fmt.Sprint(r.DropFirst), r.RequestedAt.UTC().Format(time.RFC3339Nano)} {
		h.Write([]byte(f))
		h.Write([]byte{0})
	}
	return h.Sum(nil)
}

// Sign sets r.MAC with secret, for the pipeline with checkpoint key key.
func (r *Request) Sign(secret []byte, key string) { r.MAC = hex.EncodeToString(r.mac(secret, key)) }

// Verify reports whether r.MAC was made by one of secrets for the pipeline
// with checkpoint key key.
func (r Request) Verify(secrets [][]byte, key string) bool {
	return checkpoint.VerifyMAC(r.MAC, secrets, func(s []byte) []byte { return r.mac(s, key) })
}
