package park

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outboxcdc/cdc/internal/checkpoint"
)

// TableDest is Dest for an event whose topic could not be worked out: its
// key is parked within its table.
func TableDest(table string) string { return "table:" + table }

// Set is the keys a session holds back. It is not safe for concurrent
// use: the stream's goroutine owns it.
type Set struct {
	max, maxBytes, bytes int
	entries              map[key]*checkpoint.Parked
}

type key struct{ dest, key string }

// New returns the set of parked keys saved (the checkpoint's), holding at
// most max, whose entries take at most maxBytes of the checkpoint record
// (0: no bound). The set is part of every checkpoint record, which must
// fit the checkpoint topic: past maxBytes a park stops the connector as
// one past max does, rather than the checkpoint's write failing.
func New(saved []checkpoint.Parked, max, maxBytes int) *Set {
	s := &Set{max: max, maxBytes: maxBytes, entries: map[key]*checkpoint.Parked{}}
	for _, p := range saved {
		p := p
		s.entries[key{p.Dest, p.Key}] = &p
		s.bytes += size(&p)
	}
	return s
}

// MaxReason bounds a parking's reason as the checkpoint keeps it: the
// whole reason is in the parked record's headers and the log.
const MaxReason = 256

// size is what p takes of the checkpoint record.
func size(p *checkpoint.Parked) int { return checkpoint.ParkedSize(*p) }

// Len is how many keys are parked.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.entries)
}

// Parked returns the parking of key k meant for topic, or for table when
// its topic could not be worked out, or nil. With nothing parked it costs
// one comparison: the hot path pays nothing.
func (s *Set) Parked(topic, table, k string) *checkpoint.Parked {
	if s == nil || len(s.entries) == 0 {
		return nil
	}
	if p := s.entries[key{topic, k}]; p != nil {
		return p
	}
	return s.entries[key{TableDest(table), k}]
}

// ErrFull is a park past max_parked_keys, ErrFullBytes one whose
// entries would take more of the checkpoint record than their share.
var (
	ErrFull      = errors.New("max_parked_keys keys are parked already")
	ErrFullBytes = errors.New("the parked keys fill their share of the checkpoint record")
)

// Park parks key k of dest behind first, which is invalid for reason, in
// parked topic topic; episode names this parking. It returns ErrFull or
// ErrFullBytes past a bound, parking nothing. The reason is kept cut to
// MaxReason bytes.
func (s *Set) Park(table, dest, k, reason, first, episode, topic string, since time.Time) (*checkpoint.Parked, error) {
	if p := s.entries[key{dest, k}]; p != nil {
		return p, nil
	}
	if len(s.entries) >= s.max {
		return nil, ErrFull
	}
	if len(reason) > MaxReason {
		reason = strings.ToValidUTF8(reason[:MaxReason-3], "") + "..."
	}
	p := &checkpoint.Parked{Table: table, Dest: dest, Key: k, Reason: reason, First: first, Episode: episode, Since: since, Topic: topic}
	if n := size(p); s.maxBytes > 0 && s.bytes+n > s.maxBytes {
		return nil, ErrFullBytes
	}
	s.entries[key{dest, k}] = p
	s.bytes += size(p)
	return p, nil
}

// Unpark forgets p's parking: its events were redriven.
func (s *Set) Unpark(p *checkpoint.Parked) {
	if _, ok := s.entries[key{p.Dest, p.Key}]; ok {
		delete(s.entries, key{p.Dest, p.Key})
		s.bytes -= size(p)
	}
}

// List is the parked keys, for the checkpoint: a copy, in a stable order.
func (s *Set) List() []checkpoint.Parked {
	out := make([]checkpoint.Parked, 0, len(s.entries))
	for _, p := range s.entries {
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b checkpoint.Parked) int {
		return strings.Compare(a.Dest+"\x00"+a.Key, b.Dest+"\x00"+b.Key)
	})
	return out
}

// Selector is which parked keys a redrive takes: those of Key (any table,
// or Table's), every key of Table, or All.
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

// Select returns the parked keys sel takes, in the set's order.
func (s *Set) Select(sel Selector) []*checkpoint.Parked {
	var out []*checkpoint.Parked
	for _, p := range s.List() {
		if sel.Match(p) {
			out = append(out, s.entries[key{p.Dest, p.Key}])
		}
	}
	return out
}
