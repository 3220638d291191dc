package redrive

import (
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/park"
)

// walk follows a parking's records through its parked topic's partition,
// in offset order, against what the checkpoint says of it: records 1 to
// Events, each sealed, each produced by the run its number belongs to
// (checkpoint.Parked.Runs), each once, in their order. It is pure: the
// passes of a redrive (and its tests) feed it records.
type walk struct {
	p    *checkpoint.Parked
	keys [][]byte
	key  string
	// next is the number the parking's next record must have.
	next int64
	// lost counts the numbers not found; missing keeps the first spans.
	lost    int64
	missing []span
	// forged: records of the episode whose seal does not verify; ghosts:
	// sealed ones that are not the parking's (a run whose checkpoint
	// never said so, a copy); invalid: ours that may not go yet.
	forged, ghosts, invalid int64
}

type span struct{ from, to int64 }

// maxSpans bounds the missing spans kept, for a message.
const maxSpans = 8

func (r *Runner) newWalk(p *checkpoint.Parked) *walk {
	return &walk{p: p, keys: r.Keys, key: r.Key, next: p.Released + 1}
}

// take says whether rec is the parking's next record (ours), and its
// number; a number past the next notes those between as missing.
func (w *walk) take(rec *kgo.Record) (n int64, ours bool) {
	if header(rec, park.HeaderEpisode) != w.p.Episode {
		return 0, false
	}
	if !park.Sealed(rec, w.keys, w.key) {
		w.forged++
		return 0, false
	}
	run, n, ok := park.ParseSeq(header(rec, park.HeaderSeq))
	if !ok {
		w.forged++
		return 0, false
	}
	if n > w.p.Events || n < w.next || w.p.RunOf(n) != run {
		w.ghosts++
		return 0, false
	}
	if n > w.next {
		w.gap(w.next, n-1)
	}
	w.next = n + 1
	return n, true
}

// end notes the numbers never found as missing.
func (w *walk) end() {
	if w.next <= w.p.Events {
		w.gap(w.next, w.p.Events)
		w.next = w.p.Events + 1
	}
}

func (w *walk) gap(from, to int64) {
	w.lost += to - from + 1
	if len(w.missing) < maxSpans {
		w.missing = append(w.missing, span{from, to})
	}
}

// spans says which numbers are missing.
func (w *walk) spans() string {
	var b strings.Builder
	for i, s := range w.missing {
		if i > 0 {
			b.WriteString(", ")
		}
		if s.from == s.to {
			fmt.Fprintf(&b, "event %d", s.from)
		} else {
			fmt.Fprintf(&b, "events %d-%d", s.from, s.to)
		}
	}
	if int64(len(w.missing)) < w.lost && len(w.missing) == maxSpans {
		b.WriteString(", ...")
	}
	return b.String()
}
