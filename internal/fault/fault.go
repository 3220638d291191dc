// Package fault says what a session's error means for the connector: it
// stops the connector (fatal: only an operator can fix it, and a new
// session would meet it again), or a new session may get past it, after a
// wait (docs/design.md, "Errors"). This is the one place that decides.
//
// Invariants:
//   - An error that a new session would meet again in the same place (an
//     invalid event, an undecodable message, a gap, a fence, a topic
//     that cannot be created, a refused schema) is fatal: retrying it
//     forever would hide it.
//   - Credentials refused, a TLS certificate refused and a transaction
//     aborted for its time are fatal before the connector ever streamed,
//     and after a few in a row: once it has streamed, one may be a
//     rotation or an outage.
package fault

import (
	"errors"
	"fmt"

	"github.com/hashicorp/go-hclog"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/delivery"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/schema"
	"github.com/outboxcdc/cdc/internal/sink"
	"github.com/outboxcdc/cdc/internal/tableread"
)

// Permanent reports whether err must stop the connector rather than start
// a new session.
func Permanent(err error) bool {
	for _, target := range []any{new(*errtext.Fatal), new(*outbox.EventError), new(*DecodeError), new(*checkpoint.GapError),
		new(*checkpoint.TopicError), new(*sink.ConnectError), new(*tableread.Error), new(*sink.FencedError), new(*delivery.TxnTimeoutError),
		new(*schema.RefusedError)} {
		if errors.As(err, target) {
			return true
		}
	}
	var prod *sink.ProduceError
	return errors.As(err, &prod) && prod.Permanent()
}

// DecodeError marks an undecodable replication message. The same bytes
// would arrive again after a reconnect, so it is fatal.
type DecodeError struct{ Err error }

func (e *DecodeError) Error() string {
	return e.Err.Error() + "; the connector cannot continue past this message without losing it: check the tables' definitions against the config"
}
func (e *DecodeError) Unwrap() error { return e.Err }

// IsFenced reports whether err says another instance took over.
func IsFenced(err error) bool {
	var f *sink.FencedError
	var t *delivery.TxnTimeoutError
	return errors.As(err, &f) && !errors.As(err, &t)
}

// MaxRefused is how many times in a row a connector that has streamed
// retries Postgres refusing its credentials before it stops.
const MaxRefused = 5

// Streak counts the errors of the sessions in a row that a few of may be
// retried, and not more.
type Streak struct {
	refused  int // AuthErrors
	timeouts int // TxnTimeoutErrors
}

// Session is what Classify needs to know of the connector.
type Session struct {
	// Streamed: a session of this process has streamed.
	Streamed bool
	// HeldByOther reports whether another instance holds the slot now.
	HeldByOther func() bool
	Log         hclog.Logger
}

// Classify tells a session's error that stops the connector (fatal) from
// one a new session may get past, and words the latter for the log.
func (s *Streak) Classify(err error, c Session) (_ error, fatal bool) {
	if IsFenced(err) && !c.HeldByOther() {
		// No other instance streams: the broker ended the transaction
		// itself (it outlived the transaction timeout, during a long
		// outage say). Its events were not committed; a new session
		// sends them again.
		c.Log.Warn("kafka aborted the open transaction; sending its events again in a new one", "error", errtext.OneLine(err))
		err = errors.New("kafka aborted the open transaction: " + errtext.OneLine(err))
	}
	var timedOut *delivery.TxnTimeoutError
	if errors.As(err, &timedOut) {
		// Once may be an outage that outlasted the timeout; the same
		// again, with Kafka up, is a transaction too large for it.
		if s.timeouts++; s.timeouts < 2 {
			c.Log.Warn("kafka aborted a transaction that outlived exactly_once.transaction_timeout; sending its events again in a new one", "error", errtext.OneLine(err))
			err = errors.New("kafka aborted a transaction that was open too long")
		}
	} else if err != nil {
		s.timeouts = 0
	}
	if Permanent(err) {
		return err, true
	}
	var tlsErr *postgres.TLSError
	if errors.As(err, &tlsErr) && !c.Streamed {
		return err, true // a CA or host name to fix; once streamed, maybe a rotation
	}
	var auth *postgres.AuthError
	if errors.As(err, &auth) {
		// Refused credentials never fix themselves at start. Once it
		// has streamed, it may be a password being rotated: retry a
		// few times, then stop.
		if !c.Streamed {
			return err, true
		}
		if s.refused++; s.refused > MaxRefused {
			return fmt.Errorf("%w (refused %d times in a row)", err, s.refused), true
		}
	} else {
		s.refused = 0
	}
	if err == nil {
		err = errors.New("session ended without an error")
	}
	return err, false
}
