package park

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/signing"
)

// The headers a parked record carries besides a dead letter's (package
// route): which parking it belongs to, its number there and the session
// that produced it ("run/n", checkpoint.Parked.Runs), the commit LSN of
// its event, the event that holds it back (on the others), and, on an
// invalid one (the first, and any behind it), the event it came from; on
// one behind it, the partition its table's expression pinned it to, which
// its redrive keeps (the key's other events are there); last, its seal.
const (
	HeaderEpisode   = "parked_episode"
	HeaderSeq       = "parked_seq"
	HeaderLSN       = "parked_lsn"
	HeaderBehind    = "parked_behind"
	HeaderEvent     = "parked_event"
	HeaderPartition = "parked_partition"
	HeaderSeal      = "parked_seal"
	// HeaderRead marks a record of a row read from the table (a backfill,
	// a repair), which the stream, from wherever a rewind puts it, never
	// carries again: a rewind keeps it parked (checkpoint.Parked.Read).
	HeaderRead = "parked_read"
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
	// PayloadKept: Fields holds the payload, which the record's value is
	// not (a message's whole content, a NULL payload). Without it (and in
	// records parked before it was kept) the value is the payload.
	PayloadKept bool `json:"payload_kept,omitempty"`
}

// EncodeEvent is ev as its parked record's HeaderEvent keeps it;
// payloadKept says ev's payload is in it, not in the record's value.
func EncodeEvent(ev *outbox.Event, payloadKept bool) []byte {
	j := jsonEvent{Raw: ev.Raw, CommitLSN: ev.CommitLSN.String(), CommitTime: ev.CommitTime, XID: ev.XID, PayloadKept: payloadKept}
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

// DecodeEvent is the event of src a parked record's HeaderEvent kept, and
// whether its payload is in it (EncodeEvent).
func DecodeEvent(b []byte, src *outbox.Source) (outbox.Event, bool, error) {
	var j jsonEvent
	if err := json.Unmarshal(b, &j); err != nil {
		return outbox.Event{}, false, fmt.Errorf("read a parked event: %w", err)
	}
	if len(j.Extra) != len(src.Extra) || len(j.ExtraKinds) != len(j.Extra) {
		return outbox.Event{}, false, fmt.Errorf("read a parked event of %s: it has %d extra columns, the configuration maps %d; configure the table as it was when the event was parked", src, len(j.Extra), len(src.Extra))
	}
	lsn, err := pglogrepl.ParseLSN(j.CommitLSN)
	if err != nil {
		return outbox.Event{}, false, fmt.Errorf("read a parked event: %w", err)
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
	return ev, j.PayloadKept, nil
}

// nonNil keeps an empty value from reading as NULL.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// RequestMaxAge is how far apart a redrive request's requested_at and the
// commit of the WAL message that announces it may be (or, taken at a
// session's start, now): more is a request announced again by a role that
// can write a logical decoding message.
const RequestMaxAge = checkpoint.RequestMaxAge

// ControlRequest is the control message (package backfill's Control) that
// announces a redrive request in the WAL.
const ControlRequest = "redrive-request"

// RequestPrefix starts a redrive request's ID, which shares the
// checkpoint topic's request keys with backfill requests.
const RequestPrefix = "redrive-"

// MaxRefs bounds the parkings one request names: cdc redrive asks for more
// in several requests, so that each fits a Kafka record.
const MaxRefs = 500

// Ref is one parking a request names, as cdc parked listed it: a key
// parked again since is another episode, which the request does not name.
type Ref struct {
	Key     string `json:"key"`
	Episode string `json:"episode"`
}

// Request is what cdc redrive asks the pipeline to do: send the parkings
// it names on, each whole and in order; with DropFirst, each one's first
// event to the dead-letter topic instead; with DropInvalid, every event
// still invalid at the redrive (an event nobody will fix, behind the
// first or the first), the rest on in order; with AcceptGap, what a parked
// topic still holds of a parking that lost records, accepting the loss.
// It is kept in the checkpoint topic and signed as a backfill request is
// (docs/security.md), and runs once.
type Request struct {
	ID          string    `json:"id"`
	Parkings    []Ref     `json:"parkings"`
	DropFirst   bool      `json:"drop_first,omitempty"`
	DropInvalid bool      `json:"drop_invalid,omitempty"`
	AcceptGap   bool      `json:"accept_gap,omitempty"`
	RequestedAt time.Time `json:"requested_at"`
	MAC         string    `json:"mac,omitempty"`
}

func (r Request) mac(secret []byte, key string) []byte {
	h := hmac.New(sha256.New, secret)
	field := func(f string) {
		h.Write([]byte(f))
		h.Write([]byte{0})
	}
	for _, f := range []string{"outbox-cdc redrive request v2", key, r.ID, fmt.Sprint(len(r.Parkings))} {
		field(f)
	}
	for _, p := range r.Parkings {
		field(p.Key)
		field(p.Episode)
	}
	for _, f := range []string{fmt.Sprint(r.DropFirst), fmt.Sprint(r.AcceptGap), r.RequestedAt.UTC().Format(time.RFC3339Nano)} {
		field(f)
	}
	if r.DropInvalid {
		// Only when set, so that a request without it has the MAC it had
		// before the field was.
		field("drop-invalid")
	}
	return h.Sum(nil)
}

// Sign sets r.MAC with secret, for the pipeline with checkpoint key key.
func (r *Request) Sign(secret []byte, key string) { r.MAC = hex.EncodeToString(r.mac(secret, key)) }

// Verify reports whether r.MAC was made by one of secrets for the pipeline
// with checkpoint key key.
func (r Request) Verify(secrets [][]byte, key string) bool {
	return signing.VerifyMAC(r.MAC, secrets, func(s []byte) []byte { return r.mac(s, key) })
}

// Made is when the request was made.
func (r Request) Made() time.Time { return r.RequestedAt }

// ParseRequest reads request id's value from the checkpoint topic.
func ParseRequest(id string, v []byte) (Request, error) {
	var r Request
	if err := json.Unmarshal(v, &r); err != nil || r.ID != id {
		return Request{}, fmt.Errorf("redrive request %s does not parse", id)
	}
	if len(r.Parkings) == 0 || len(r.Parkings) > MaxRefs {
		return Request{}, fmt.Errorf("redrive request %s names %d parkings, not 1 to %d", id, len(r.Parkings), MaxRefs)
	}
	return r, nil
}

// Seal sets rec's HeaderSeal, last: an HMAC, with secret for the pipeline
// with checkpoint key key, of everything a redrive reads of rec (its key,
// value, headers and parked topic), so that a record someone else
// produced to the parked topic, or changed, is not taken for the
// parking's.
func Seal(rec *kgo.Record, secret []byte, key string) {
	rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: HeaderSeal, Value: []byte(hex.EncodeToString(seal(rec, secret, key)))})
}

// Sealed reports whether rec's seal (its last header) was made by one of
// secrets for the pipeline with checkpoint key key.
func Sealed(rec *kgo.Record, secrets [][]byte, key string) bool {
	n := len(rec.Headers)
	if n == 0 || rec.Headers[n-1].Key != HeaderSeal {
		return false
	}
	return signing.VerifyMAC(string(rec.Headers[n-1].Value), secrets, func(s []byte) []byte { return seal(rec, s, key) })
}

// seal is the MAC of rec's topic, key, value and headers but a last
// HeaderSeal, each length-prefixed.
func seal(rec *kgo.Record, secret []byte, key string) []byte {
	h := hmac.New(sha256.New, secret)
	var n [8]byte
	field := func(b []byte) {
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	field([]byte("outbox-cdc parked record v1"))
	field([]byte(key))
	field([]byte(rec.Topic))
	field(rec.Key)
	field(rec.Value)
	hs := rec.Headers
	if k := len(hs); k > 0 && hs[k-1].Key == HeaderSeal {
		hs = hs[:k-1]
	}
	for _, hd := range hs {
		field([]byte(hd.Key))
		field(hd.Value)
	}
	return h.Sum(nil)
}

// Seq is the value of HeaderSeq for record n of run.
func Seq(run string, n int64) []byte { return []byte(run + "/" + strconv.FormatInt(n, 10)) }

// ParseSeq reads HeaderSeq's value.
func ParseSeq(v string) (run string, n int64, ok bool) {
	run, num, found := strings.Cut(v, "/")
	if !found {
		return "", 0, false
	}
	n, err := strconv.ParseInt(num, 10, 64)
	return run, n, err == nil && n > 0
}

// Header is the value of the connector's header key on parked record r,
// or "": the last of that name, since the connector appends its own after
// the record's (a header a row's expression names the same comes first,
// and is the row's; the configuration refuses those names anyway).
func Header(r *kgo.Record, key string) string {
	for i := len(r.Headers) - 1; i >= 0; i-- {
		if r.Headers[i].Key == key {
			return string(r.Headers[i].Value)
		}
	}
	return ""
}

// Read reports whether parked record r is of a row read from the table
// (HeaderRead): that header is the one before the seal, where a row's own
// header of the name never is (HeaderLSN is there on the others).
func Read(r *kgo.Record) bool {
	n := len(r.Headers)
	return n >= 2 && r.Headers[n-1].Key == HeaderSeal && r.Headers[n-2].Key == HeaderRead
}

// Ours reports which of r's headers are the connector's, named in keys:
// the last of each name, and HeaderRead where Read finds it.
func Ours(r *kgo.Record, keys ...string) []bool {
	ours := make([]bool, len(r.Headers))
	for _, k := range keys {
		for i := len(r.Headers) - 1; i >= 0; i-- {
			if r.Headers[i].Key == k {
				ours[i] = true
				break
			}
		}
	}
	if Read(r) {
		ours[len(r.Headers)-2] = true
	}
	return ours
}

// Made reads when the redrive request v says it was made, without
// verifying it: for a first look (request.Requests.Pending).
func Made(v []byte) (time.Time, bool) {
	var r struct {
		RequestedAt time.Time `json:"requested_at"`
	}
	return r.RequestedAt, json.Unmarshal(v, &r) == nil && !r.RequestedAt.IsZero()
}

// ShellQuote is k quoted for a shell, for the commands errors suggest.
func ShellQuote(k string) string { return "'" + strings.ReplaceAll(k, "'", `'\''`) + "'" }
