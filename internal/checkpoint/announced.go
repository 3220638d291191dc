package checkpoint

import "time"

// Announced is what a pipeline keeps, across sessions, of the backfill
// requests the stream announced, on the replication loop: the ids it
// refused, so that one announced again is passed over at once and said
// once, and a budget of look-ups of ids its Requests follower has not read
// (LookupsPerSecond, a token bucket). Any role may announce ids at will
// (pg_logical_emit_message), so both are bounded: a flood of ids costs the
// loop a few look-ups a second, and the memory of MaxRefused ids.
type Announced struct {
	refused map[string]struct{}
	tokens  float64
	at      time.Time
}

// MaxRefused bounds the refused ids kept.
const MaxRefused = 1024

// LookupsPerSecond is the look-ups of unread ids allowed a second.
const LookupsPerSecond = 5

// Refused reports whether id was refused before.
func (a *Announced) Refused(id string) bool {
	_, ok := a.refused[id]
	return ok
}

// Refuse remembers id as refused, forgetting all others once MaxRefused
// are kept.
func (a *Announced) Refuse(id string) {
	if len(a.refused) >= MaxRefused {
		clear(a.refused)
	}
	if a.refused == nil {
		a.refused = map[string]struct{}{}
	}
	a.refused[id] = struct{}{}
}

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
