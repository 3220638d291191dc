package request

import (
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/outboxcdc/cdc/internal/checkpoint"
)

// Ledger is what a session knows of the requests taken: the checkpoint's
// (checkpoint.Record.Used) and its own, so that each runs once. It never
// forgets a request taken within LedgerKeeps: one it has no room for is
// refused at Admit (Room), not taken.
type Ledger struct {
	Used []checkpoint.Used
	// MaxBytes bounds Used's share of the checkpoint record (0: none):
	// the record must fit the checkpoint topic.
	MaxBytes int
	// Also reports a request taken by other means (a backfill's job).
	Also func(id string) bool
}

// LedgerKeeps is how long after its announcement a request taken must be
// remembered: it was taken within checkpoint.RequestMaxAge of being made,
// and may be announced again, by anyone, within RequestMaxAge of that,
// so up to twice RequestMaxAge after it was taken; ledgerSlack covers a
// connector's clock apart from the database's (a redrive taken at a
// session's start is timed by the connector, one announced by the
// database's commit time).
const LedgerKeeps = 2*checkpoint.RequestMaxAge + ledgerSlack

const ledgerSlack = 5 * time.Minute

// cutOutcome is an outcome the ledger cut to keep a young request within
// MaxBytes: the log has the whole line.
const cutOutcome = "(cut to fit the checkpoint; the log has it)"

// Taken reports whether request id was taken before.
func (l *Ledger) Taken(id string) bool {
	for _, u := range l.Used {
		if u.ID == id {
			return true
		}
	}
	return l.Also != nil && l.Also(id)
}

// Room reports whether the ledger can take request id announced at at
// without forgetting a request taken within LedgerKeeps of at: those,
// with outcomes cut, and id's must be at most checkpoint.MaxUsed and fit
// MaxBytes. Admit refuses a request without room: it runs once only if
// remembered.
func (l *Ledger) Room(id string, at time.Time) bool {
	n, total := 1, usedSize(checkpoint.Used{ID: id, At: at, Outcome: cutOutcome})
	for _, o := range l.Used {
		if o.ID == id || !young(o, at) {
			continue
		}
		n++
		total += min(usedSize(o), usedSize(cut(o)))
	}
	return n <= checkpoint.MaxUsed && (l.MaxBytes <= 0 || total <= l.MaxBytes)
}

// Take remembers u as taken and returns the list, for the checkpoint note
// of the transaction it ran in.
func (l *Ledger) Take(u checkpoint.Used) []checkpoint.Used {
	l.Used = add(l.Used, u, l.MaxBytes)
	return l.Used
}

// MaxRefusalLines is how many refusals a minute the log has a line of:
// any role can announce requests, and a flood of them must not flood the
// log. Past it, one line says how many more were refused in that minute
// (and cdc_requests_refused_total counts every one).
const MaxRefusalLines = 10

// Log says why a request of kind was refused (a quiet refusal, an id
// refused before, says nothing), at most MaxRefusalLines a minute, and
// reports whether it was refused and whether it was forged; err that is
// not a *Refused says nothing.
func (g *Gate) Log(log hclog.Logger, kind, id string, err error) (refused, forged bool) {
	r, ok := err.(*Refused)
	if !ok {
		return false, false
	}
	if !r.Quiet {
		now := g.now()
		if now.Sub(g.lines.since) >= time.Minute {
			if g.lines.over > 0 {
				log.Warn("more operator requests were refused than the log has lines for; cdc_requests_refused_total counts them all", "not_logged", g.lines.over, "since", g.lines.since.UTC().Format(time.RFC3339))
			}
			g.lines.since, g.lines.n, g.lines.over = now, 0, 0
		}
		if g.lines.n++; g.lines.n <= MaxRefusalLines {
			log.Warn(r.Msg, "kind", kind, "id", id)
		} else {
			g.lines.over++
		}
	}
	return true, r.Forged
}

// add returns used with u in place of a request of its id, or at the
// end, within checkpoint.MaxUsed and maxBytes of the record's JSON (0: no
// bound) as far as forgetting no request young at u.At allows: the old go
// first, oldest first, then the young ones' outcomes are cut (cutOutcome),
// oldest first and u's last. A young one is never dropped: Room refused
// what would not fit. u's outcome is cut to MaxOutcome bytes. used is not
// changed.
func add(used []checkpoint.Used, u checkpoint.Used, maxBytes int) []checkpoint.Used {
	if len(u.Outcome) > checkpoint.MaxOutcome {
		u.Outcome = strings.ToValidUTF8(u.Outcome[:checkpoint.MaxOutcome-3], "") + "..."
	}
	out := make([]checkpoint.Used, 0, len(used)+1)
	for _, o := range used {
		if o.ID != u.ID {
			out = append(out, o)
		}
	}
	out = append(out, u)
	total := 0
	for _, o := range out {
		total += usedSize(o)
	}
	overBytes := func() bool { return maxBytes > 0 && total > maxBytes }
	for i := 0; (len(out) > checkpoint.MaxUsed || overBytes()) && i < len(out)-1; {
		if young(out[i], u.At) {
			i++
			continue
		}
		total -= usedSize(out[i])
		out = slices.Delete(out, i, i+1)
	}
	for i := 0; overBytes() && i < len(out); i++ {
		if c := cut(out[i]); usedSize(c) < usedSize(out[i]) {
			total += usedSize(c) - usedSize(out[i])
			out[i] = c
		}
	}
	return out
}

// young reports whether u was taken within LedgerKeeps of at: it could
// still be announced again and admitted.
func young(u checkpoint.Used, at time.Time) bool { return at.Sub(u.At) < LedgerKeeps }

// cut is u with its outcome cut.
func cut(u checkpoint.Used) checkpoint.Used {
	u.Outcome = cutOutcome
	return u
}

// usedSize is what u takes of the record's JSON.
func usedSize(u checkpoint.Used) int {
	b, _ := json.Marshal(u)
	return len(b) + 1
}
