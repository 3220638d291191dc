package request

import "time"

// Announced is what a pipeline keeps, across sessions, of the requests
// the stream announced, on the replication loop: the ids it refused, by
// kind, so that one announced again is passed over at once and said once
// (by kind: an id announced as another kind, which any role may do, is
// refused as that kind only, and cancels nothing of the id's own), and a budget of look-ups of ids its Requests follower has not read
// (LookupsPerSecond, a token bucket). Any role may announce ids at will
// (pg_logical_emit_message), so both are bounded: a flood of ids costs the
// loop a few look-ups a second, and the memory of MaxRefused ids within
// MaxRefusedBytes.
type Announced struct {
	refused map[string]struct{}
	bytes   int // of refused's keys, and refusedOverhead each
	tokens  float64
	at      time.Time
}

// MaxRefused bounds the refused ids kept.
const MaxRefused = 1024

// MaxIDBytes bounds an announced id: the commands make ids of 24 bytes
// ("redrive-3f0c9a1d2b7e4c55"), and one longer is nobody's request; an id
// is whatever the announcing message says, of any length, so a longer one
// is refused before it costs a look or a place among the refused.
const MaxIDBytes = 128

// MaxRefusedBytes bounds the refused ids kept in bytes as well as in
// count: room for MaxRefused ids of MaxIDBytes.
const MaxRefusedBytes = MaxRefused * (MaxIDBytes + refusedOverhead)

// refusedOverhead is what a refused id costs besides its bytes (its
// kind, the map's entry).
const refusedOverhead = 64

// LookupsPerSecond is the look-ups of unread ids allowed a second.
const LookupsPerSecond = 5

// refusedKey is the key of id of kind in refused: a kind's name has no
// NUL.
func refusedKey(kind, id string) string { return kind + "\x00" + id }

// Refused reports whether id was refused before as a request of kind.
func (a *Announced) Refused(kind, id string) bool {
	_, ok := a.refused[refusedKey(kind, id)]
	return ok
}

// Refuse remembers id as refused as a request of kind, forgetting all
// others once MaxRefused, or MaxRefusedBytes, are kept. An id longer than
// MaxIDBytes is not kept: Admit refuses it before looking.
func (a *Announced) Refuse(kind, id string) {
	if len(id) > MaxIDBytes {
		return
	}
	k := refusedKey(kind, id)
	if _, ok := a.refused[k]; ok {
		return
	}
	cost := len(k) + refusedOverhead
	if len(a.refused) >= MaxRefused || a.bytes+cost > MaxRefusedBytes {
		clear(a.refused)
		a.bytes = 0
	}
	if a.refused == nil {
		a.refused = map[string]struct{}{}
	}
	a.refused[k] = struct{}{}
	a.bytes += cost
}

// Charge takes from the budget what a look-up of d cost besides its
// token: LookupsPerSecond*2 tokens a second of it, so that look-ups that
// wait (a follower behind, brokers slow) hold the replication loop at most
// half the time, however many ids are announced. The debt is bounded: a
// budget never waits longer than maxDebt to refill.
func (a *Announced) Charge(d time.Duration) {
	a.tokens = max(a.tokens-d.Seconds()*LookupsPerSecond*2, -maxDebt.Seconds()*LookupsPerSecond)
}

// maxDebt bounds how long a budget charged for slow look-ups takes to
// refill: two of lookupTimeout.
const maxDebt = 2 * lookupTimeout

// Allow takes a look-up from the budget, if one is left at now.
func (a *Announced) Allow(now time.Time) bool {
	a.tokens = min(LookupsPerSecond, a.tokens+now.Sub(a.at).Seconds()*LookupsPerSecond)
	a.at = now
	if a.tokens < 1 {
		return false
	}
	a.tokens--
	return true
}
