package park

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/signing"
	"github.com/outboxcdc/cdc/internal/sink"
)

// MaxKey is the longest key a parking is known by as it is: a longer one
// is known by its digest (KeyID).
const MaxKey = 256

// digestPrefix begins a KeyID that is a digest.
const digestPrefix = "sha256:"

// KeyID is what the parking of key k is known by, in the checkpoint, in
// cdc parked and to cdc redrive --key: k itself, or for a key longer than
// MaxKey bytes, one that is not UTF-8 (the checkpoint is JSON, which would
// change it), or one that begins as a digest does (so that no key passes
// for another's digest), "sha256:" and its SHA-256 in hex. A row's key is
// the application's, of any length: as it is, one long key could fill the
// parked keys' share of the checkpoint record, and a row's content would
// stop the connector (docs/security.md).
func KeyID(k string) string {
	if plain(k) {
		return k
	}
	sum := sha256.Sum256([]byte(k))
	return digestPrefix + hex.EncodeToString(sum[:])
}

// plain reports whether key k is its own KeyID.
func plain[K string | []byte](k K) bool {
	return len(k) <= MaxKey && (len(k) < len(digestPrefix) || string(k[:len(digestPrefix)]) != digestPrefix) && utf8.Valid([]byte(k))
}

// isDigest reports whether id is a KeyID that is a digest.
func isDigest(id string) bool {
	return len(id) == len(digestPrefix)+2*sha256.Size && strings.HasPrefix(id, digestPrefix)
}

// Find looks record key k up in m, a map by KeyID. A checkpoint written
// before keys were known by KeyID names every key as it is (a replay's
// hold reads its list so, and New keeps a key that reads as a digest so),
// so a key that is not its own KeyID is looked up as it is too, after its
// digest: at worst a row whose key is another parking's digest goes
// behind that parking, and comes out in its order with it.
func Find[V any](m map[string]V, k []byte) (V, bool) {
	if plain(k) {
		v, ok := m[string(k)] // no copy of k: the common case costs a lookup
		return v, ok
	}
	if v, ok := m[KeyID(string(k))]; ok {
		return v, ok
	}
	v, ok := m[string(k)]
	return v, ok
}

// TableDest is Dest for an event whose topic could not be worked out.
func TableDest(table string) string { return "table:" + table }

// Set is the keys a session holds back, one parking a key. It is not safe
// for concurrent use: the stream's goroutine owns it.
type Set struct {
	max, maxBytes, bytes int
	entries              map[string]*checkpoint.Parked
	// topics counts the parkings by parked topic: a topic that still has
	// a parking's records is one no event may reach (HoldsTopic).
	topics map[string]int
	// run names this session's records in the parkings it adds to
	// (checkpoint.Parked.Runs), key the signing key that seals them
	// (signing.ID; SealWith).
	run, key string
}

// SealWith names the key this session seals its parked records with
// (signing.ID of checkpoint.signing_key_file's first): each run a parking
// gets says it, so that a redrive tells a key taken out of the file from
// records gone (Unsealable).
func (s *Set) SealWith(id string) { s.key = id }

// Unsealable is the keys, by signing.ID, that sealed records of p and that
// keys no longer has: none of those records would verify. Runs written
// before the key was kept name none.
func Unsealable(p *checkpoint.Parked, keys [][]byte) []string {
	var out []string
	for _, r := range p.Runs {
		if r.Key != "" && !slices.Contains(out, r.Key) && !signing.Has(keys, r.Key) {
			out = append(out, r.Key)
		}
	}
	return out
}

// New returns the set of parked keys saved (the checkpoint's), holding at
// most max, whose entries take at most maxBytes of the checkpoint record
// (0: no bound). The set is part of every checkpoint record, which must
// fit the checkpoint topic: past maxBytes a park stops the connector as
// one past max does, rather than the checkpoint's write failing. A saved
// list that names a key twice (written by no version of the connector)
// keeps its first.
func New(saved []checkpoint.Parked, max, maxBytes int) *Set {
	s := &Set{max: max, maxBytes: maxBytes, entries: map[string]*checkpoint.Parked{}, topics: map[string]int{}, run: NewEpisode()}
	for _, p := range saved {
		if !isDigest(p.Key) {
			// Written before keys were known by KeyID: a long one is
			// known by its digest from now on (one that reads as a
			// digest stays as it is: Find).
			p.Key = KeyID(p.Key)
		}
		if _, dup := s.entries[p.Key]; dup {
			continue
		}
		p := p
		p.Runs = slices.Clone(p.Runs)
		s.entries[p.Key] = &p
		s.topics[p.Topic]++
		s.bytes += size(&p)
	}
	return s
}

// HoldsTopic reports whether a parking has its records in topic, or in
// one Kafka takes for it ('.' and '_' alike): the parked topics of
// today's configuration and of the one a key was parked under.
func (s *Set) HoldsTopic(topic string) bool {
	if s == nil || len(s.entries) == 0 {
		return false
	}
	for t := range s.topics {
		if sink.SameTopic(t, topic) {
			return true
		}
	}
	return false
}

// MaxReason bounds a parking's reason as the checkpoint keeps it: the
// whole reason is in the parked record's headers and the log.
const MaxReason = 256

// size is what p takes of the checkpoint record, with room for its
// counts (Events, Released) to grow to any number: they grow with every
// record parked and sent, which is never refused for a byte.
func size(p *checkpoint.Parked) int { return checkpoint.ParkedSize(*p) + counterRoom }

// counterRoom is the digits Events and Released may grow by.
const counterRoom = 2 * 19

// Len is how many keys are parked.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.entries)
}

// Parked returns the parking of record key k, or nil: whatever the table
// or topic of the event, a parked key's every event goes behind its
// parking (an event whose topic cannot be worked out could be meant for
// any). With nothing parked it costs one comparison: the hot path pays
// nothing.
func (s *Set) Parked(k []byte) *checkpoint.Parked {
	if s == nil || len(s.entries) == 0 {
		return nil
	}
	p, _ := Find(s.entries, k)
	return p
}

// ErrFull is a park past max_parked_keys, ErrFullBytes one whose
// entries would take more of the checkpoint record than their share.
var (
	ErrFull      = errors.New("max_parked_keys keys are parked already")
	ErrFullBytes = errors.New("the parked keys fill their share of the checkpoint record")
)

// First is what a new parking starts from: its invalid first event and
// where its records go.
type First struct {
	Table, Dest, Key, Reason string
	ID                       string // the first event's id
	Sum                      uint64 // its content's hash (checkpoint.Parked.FirstSum)
	LSN                      pglogrepl.LSN
	Since                    time.Time
	// Topic is the parked topic, Partition the partition its records are
	// pinned to and Start an offset of it at or before the first.
	Topic     string
	Partition int32
	Start     int64
}

// Park parks key f.Key, which must not be parked (Parked), behind its
// first event f. It returns ErrFull or ErrFullBytes past a bound, parking
// nothing. The parking is known by KeyID(f.Key), its reason is kept cut to
// MaxReason bytes.
func (s *Set) Park(f First) (*checkpoint.Parked, error) {
	f.Key = KeyID(f.Key)
	if p := s.entries[f.Key]; p != nil {
		return nil, fmt.Errorf("key %q is parked already (episode %s): its events go behind it", f.Key, p.Episode)
	}
	if len(s.entries) >= s.max {
		return nil, ErrFull
	}
	p := &checkpoint.Parked{Table: f.Table, Dest: f.Dest, Key: f.Key, Reason: cut(f.Reason), First: f.ID, FirstSum: f.Sum, FirstLSN: f.LSN,
		Episode: NewEpisode(), Since: f.Since, Topic: f.Topic, Partition: f.Partition, Start: f.Start,
		Runs: []checkpoint.Run{{ID: s.run, From: 1, Key: s.key}}}
	if n := size(p); s.maxBytes > 0 && s.bytes+n > s.maxBytes {
		return nil, ErrFullBytes
	}
	s.entries[f.Key] = p
	s.topics[p.Topic]++
	s.bytes += size(p)
	return p, nil
}

// cut keeps a reason within MaxReason bytes, valid UTF-8.
func cut(reason string) string {
	if len(reason) > MaxReason {
		return strings.ToValidUTF8(reason[:MaxReason-3], "") + "..."
	}
	return reason
}

// SetReason changes p's reason (a redrive found it invalid still).
func (s *Set) SetReason(p *checkpoint.Parked, reason string) {
	s.bytes -= size(p)
	p.Reason = cut(reason)
	s.bytes += size(p)
}

// Number is the number of p's next record and the run it belongs to:
// this session's, which becomes one of p's runs if it is not the last
// already. ErrFullBytes: the run's entry does not fit the checkpoint's
// share, and nothing changed. Call Count once the record is on its way.
func (s *Set) Number(p *checkpoint.Parked) (run string, n int64, err error) {
	n = p.Events + 1
	if last := len(p.Runs) - 1; last < 0 || p.Runs[last].ID != s.run {
		before := size(p)
		p.Runs = append(p.Runs, checkpoint.Run{ID: s.run, From: n, Key: s.key})
		if grown := size(p) - before; s.maxBytes > 0 && s.bytes+grown > s.maxBytes {
			p.Runs = p.Runs[:len(p.Runs)-1]
			return "", 0, ErrFullBytes
		}
		s.bytes += size(p) - before
	}
	return s.run, n, nil
}

// Count counts record n of p (Number) as parked.
func (s *Set) Count(p *checkpoint.Parked, n int64, read bool) {
	s.bytes -= size(p)
	p.Events, p.Read = n, p.Read || read
	s.bytes += size(p)
}

// Released records that a redrive has sent p's records 1 to n on.
func (s *Set) Released(p *checkpoint.Parked, n int64) {
	s.bytes -= size(p)
	p.Released = n
	s.bytes += size(p)
}

// Unpark forgets p's parking: its events were redriven.
func (s *Set) Unpark(p *checkpoint.Parked) {
	if q, ok := s.entries[p.Key]; ok && q == p {
		delete(s.entries, p.Key)
		if s.topics[p.Topic]--; s.topics[p.Topic] <= 0 {
			delete(s.topics, p.Topic)
		}
		s.bytes -= size(p)
	}
}

// ByKey returns the parking known by k, a KeyID, or nil. A request made
// on a checkpoint from before KeyID names a long key as it is: it is
// looked up by its KeyID then.
func (s *Set) ByKey(k string) *checkpoint.Parked {
	if p := s.entries[k]; p != nil {
		return p
	}
	return s.entries[KeyID(k)]
}

// List is the parked keys, for the checkpoint: a copy, in a stable order.
func (s *Set) List() []checkpoint.Parked {
	out := make([]checkpoint.Parked, 0, len(s.entries))
	for _, p := range s.entries {
		q := *p
		q.Runs = slices.Clone(p.Runs)
		out = append(out, q)
	}
	slices.SortFunc(out, func(a, b checkpoint.Parked) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// Selector is which parked keys a redrive takes: Key (of any table, or
// Table's), every key of Table, or All. cdc redrive resolves it against
// the parkings cdc parked lists, and asks for those.
type Selector struct {
	Key, Table string
	All        bool
}

// Match reports whether s selects p.
func (sel Selector) Match(p checkpoint.Parked) bool {
	switch {
	case sel.All:
		return true
	case sel.Key != "":
		return p.Key == sel.Key && (sel.Table == "" || p.Table == sel.Table)
	default:
		return sel.Table != "" && p.Table == sel.Table
	}
}

// Pick is the parkings of ps sel selects: by the key as cdc parked shows
// it, or when none is, by the KeyID of the key as the rows have it (a key
// that reads as a digest is the digest cdc parked shows first, so that one
// --key never selects two parkings).
func (sel Selector) Pick(ps []checkpoint.Parked) []checkpoint.Parked {
	pick := func(sel Selector) []checkpoint.Parked {
		var out []checkpoint.Parked
		for _, p := range ps {
			if sel.Match(p) {
				out = append(out, p)
			}
		}
		return out
	}
	out := pick(sel)
	if len(out) == 0 && sel.Key != "" && KeyID(sel.Key) != sel.Key {
		sel.Key = KeyID(sel.Key)
		out = pick(sel)
	}
	return out
}

// String says what sel selects, for messages.
func (sel Selector) String() string {
	switch {
	case sel.All:
		return "every parked key"
	case sel.Key != "" && sel.Table != "":
		return fmt.Sprintf("key %q of %s", sel.Key, sel.Table)
	case sel.Key != "":
		return fmt.Sprintf("key %q", sel.Key)
	}
	return "every parked key of " + sel.Table
}
