package request

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/outboxcdc/cdc/internal/checkpoint"
)

// Signed is a request of some kind, parsed: it says when it was made and
// whether its MAC verifies.
type Signed interface {
	Verify(secrets [][]byte, key string) bool
	Made() time.Time
}

// Kind is one kind of request: its name, for messages, and how its value
// in the checkpoint topic parses.
type Kind[T Signed] struct {
	Name  string
	Parse func(id string, value []byte) (T, error)
}

// Follower is what Admit reads requests through: the checkpoint topic's
// requests of the pipeline (Requests).
type Follower interface {
	// Read reports whether request id has been read already.
	Read(id string) bool
	// Get returns request id's value once read, or ok false once the topic
	// has been read to its end without it.
	Get(ctx context.Context, id string) (value []byte, ok bool, err error)
}

// Refused is why an announced request does not run. The stream logs it,
// once, and goes on: a request is the operator's, and a bad one loses
// nothing. Quiet ones (taken already, refused before) are not logged.
type Refused struct {
	Msg    string
	Forged bool // its signature does not verify, or it is announced again
	Quiet  bool
}

func (r *Refused) Error() string { return r.Msg }

// Gate admits a pipeline's requests. It lives as long as the pipeline, so
// that what it refused and its budget outlast a session. It is not safe
// for concurrent use: the stream's goroutine owns it.
type Gate struct {
	announced Announced
	// Now is the clock of the look-up budget; time.Now when nil.
	Now func() time.Time
	// Lookups counts the looks at the checkpoint topic's end.
	Lookups int
	// LookupTimeout bounds a look (0: lookupTimeout).
	LookupTimeout time.Duration
	// lines is the log's share of refusals this minute (Log).
	lines struct {
		since   time.Time
		n, over int
	}
}

// now is the Gate's clock.
func (g *Gate) now() time.Time {
	if g.Now != nil {
		return g.Now()
	}
	return time.Now()
}

// Admission is one announcement to decide on.
type Admission struct {
	ID string
	// At is the commit time of the announcement (or now, at a session's
	// start): the request must have been made within
	// checkpoint.RequestMaxAge of it.
	At time.Time
	// Keys are checkpoint.signing_key_file's, Key the checkpoint's key the
	// request must be signed for.
	Keys [][]byte
	Key  string
	// Taken reports whether the checkpoint remembers id as taken.
	Taken func(id string) bool
	// Blocking runs a call that may block for seconds, keeping the slot's
	// lease.
	Blocking func(func() error) error
	// Room reports whether the checkpoint can remember id as taken at at
	// without forgetting a request that could still be admitted
	// (Ledger.Room); nil: it can.
	Room func(id string, at time.Time) bool
}

// lookupTimeout bounds a look for an announced request in the checkpoint
// topic: cdc backfill and cdc redrive write the request before they
// announce it, so the follower has read it, or reads it, within a fetch
// (100 ms; 5 s leaves a loaded machine room for the operator's own). The
// look holds the replication loop, and any role may announce an id nobody
// wrote, so it is short, and one that does not answer in time is a
// refusal, not an error: an error ends the session, and the next meets the
// same announcement again.
const lookupTimeout = 5 * time.Second

// Admit decides on announcement a of a request of kind k read through f:
// the request, or a *Refused, or an error reading the checkpoint topic
// (which ends the session: the announcement is read again). A look that
// does not answer within lookupTimeout is a refusal.
func Admit[T Signed](ctx context.Context, g *Gate, f Follower, k Kind[T], a Admission) (T, error) {
	var zero T
	now := g.now
	refuse := func(forged bool, format string, args ...any) (T, error) {
		g.announced.Refuse(k.Name, a.ID)
		return zero, &Refused{Msg: fmt.Sprintf(format, args...), Forged: forged}
	}
	// A refusal for the loop's sake (the budget spent, a look that did
	// not answer in time) says nothing of the request: it is not
	// remembered, so that the operator's own announcement of an id
	// someone announced first, in a flood or while the follower lagged,
	// is looked at again.
	busy := func(format string, args ...any) (T, error) {
		return zero, &Refused{Msg: fmt.Sprintf(format, args...)}
	}
	switch {
	case a.ID == "":
		return zero, &Refused{Msg: "ignored a " + k.Name + " announcement without an id", Quiet: true}
	case len(a.ID) > MaxIDBytes:
		// No command makes such an id: quiet, and not remembered, so
		// that ids of any length cost neither a look nor memory.
		return zero, &Refused{Msg: fmt.Sprintf("ignored a %s announcement whose id is longer than %d bytes", k.Name, MaxIDBytes), Quiet: true}
	case a.Taken != nil && a.Taken(a.ID):
		return zero, &Refused{Msg: "ignored a " + k.Name + " request announced again: it ran already", Quiet: true}
	case g.announced.Refused(k.Name, a.ID) && !f.Read(a.ID):
		// Refused before, and still not in the topic as the follower
		// read it: passed over at once. One the follower has read since
		// (announced by someone before the command wrote it) is looked
		// at, at no look-up's cost.
		return zero, &Refused{Msg: "ignored a " + k.Name + " request refused before", Quiet: true}
	case !f.Read(a.ID) && !g.announced.Allow(now()):
		// An id the follower has not read costs a look at the topic's end,
		// on the replication loop: a role announcing ids at will gets a
		// few a second, not the loop.
		return busy("ignored a %s request announced while many unknown ones were: too many to look up; if it is yours, run the command again", k.Name)
	}
	timeout := cmp.Or(g.LookupTimeout, lookupTimeout)
	lctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	v, found, err := g.look(lctx, f, a)
	if err != nil && ctx.Err() == nil && lctx.Err() != nil {
		return busy("ignored a %s request that could not be looked up in the checkpoint topic within %s (its follower is behind, or the brokers slow); if it is yours, run the command again", k.Name, timeout)
	}
	if err != nil {
		return zero, fmt.Errorf("read %s request %s: %w", k.Name, a.ID, err)
	}
	if !found {
		return refuse(false, "ignored a %s request that the checkpoint topic does not hold (announced by someone other than the command)", k.Name)
	}
	req, err := k.Parse(a.ID, v)
	if err != nil {
		return refuse(true, "ignored a %s request that does not parse: %v", k.Name, err)
	}
	if len(a.Keys) == 0 {
		return refuse(false, "ignored a %s request: cdc run has no checkpoint.signing_key_file to check it was made by the command; set the same file for both", k.Name)
	}
	if !req.Verify(a.Keys, a.Key) {
		return refuse(true, "ignored a %s request whose signature does not verify: written by someone without checkpoint.signing_key_file's key, or with another key", k.Name)
	}
	if age := a.At.Sub(req.Made()); age > checkpoint.RequestMaxAge || -age > checkpoint.RequestMaxAge {
		return refuse(true, "ignored a %s request announced %s after it was made: an old request announced again, or clocks more than %s apart; run the command again", k.Name, age.Round(time.Second), checkpoint.RequestMaxAge)
	}
	if a.Room != nil && !a.Room(a.ID, a.At) {
		return refuse(false, "ignored a %s request: too many requests were taken in the last %d minutes for the checkpoint to remember another, and each must be remembered to run once; run the command again later", k.Name, int(LedgerKeeps.Minutes()))
	}
	return req, nil
}

// look gets a's request from f, on the replication loop (a.Blocking). A
// look at the topic's end (an id f has not read) is counted, and what it
// held the loop for is charged to the budget: ids nobody wrote, announced
// while the follower lags, would otherwise hold it for lookupTimeout each,
// a few a second.
func (g *Gate) look(ctx context.Context, f Follower, a Admission) (v []byte, found bool, err error) {
	unread, began := !f.Read(a.ID), g.now()
	if unread {
		g.Lookups++
	}
	err = a.Blocking(func() (err error) {
		v, found, err = f.Get(ctx, a.ID)
		return err
	})
	if unread {
		g.announced.Charge(g.now().Sub(began))
	}
	return v, found, err
}
