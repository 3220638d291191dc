package wal

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/postgres"
)

// Handler consumes the WAL data of one XLogData message. data is only valid
// during the call: pgconn reuses the buffer.
type Handler func(walStart pglogrepl.LSN, data []byte) error

// Acks is what the loop reads, before each receive, about the events it
// handed on. The pipeline's delivery.Confirmer implements it.
type Acks interface {
	// Confirmed is the position safe to confirm to the slot.
	Confirmed() pglogrepl.LSN
	// Keepalive passes on a keepalive's WAL end and server time. Every message
	// before it has been handled, so when nothing is open or in flight the
	// position may move to walEnd (docs/design.md, "Idle slot, busy database").
	Keepalive(walEnd pglogrepl.LSN, at time.Time)
	// Saturated asks the loop to stop reading until Changed fires.
	Saturated() bool
	// Err is a delivery failure that ends the session.
	Err() error
	// Owed reports whether anything handed on is not confirmable yet (in
	// flight, or waiting for its checkpoint): the loop then looks at
	// Confirmed every ConfirmInterval instead of every StatusInterval.
	Owed() bool
	// Changed fires when any of the above may have changed.
	Changed() <-chan struct{}
}

// Releaser is the producer's batching, for a stream whose records wait to be
// batched (nil to Run: none): the loop calls Release at every turn, and wakes
// up by the time it returns (the zero time: no need). While the stream runs
// live with its reads batched, it says so with Live, and calls Drained each
// time it has handled all that its reads brought, before it waits for more:
// Drained sends what is held, and the next read waits at least until the time
// it returns (coalescingConn).
type Releaser interface {
	Release(now time.Time) time.Time
	Live(on bool)
	Drained() time.Time
}

// Stream is one replication session on one connection.
type Stream struct {
	cfg  postgres.Config
	slot string
	conn *pgconn.PgConn
	log  hclog.Logger

	// sent is the last position reported to the server.
	sent pglogrepl.LSN
	// beat is when the loop last went round (unix nanoseconds), for the
	// health check.
	beat atomic.Int64
	// recv is Run's receiver while it runs, for Wake.
	recv atomic.Pointer[receiver]
	// endBy is when End's grace runs out (unix nanoseconds; 0: End was not
	// called), and ending is closed by End.
	endBy   atomic.Int64
	ending  chan struct{}
	endOnce sync.Once
}

// ErrEnded is what Run returns when it ended as End asked.
var ErrEnded = errors.New("the replication stream ended between two transactions, as asked")

// End asks Run to return ErrEnded between two transactions: at once when
// none is open, after the COMMIT of the one it is in otherwise, and once
// grace has passed in any case. A stop that cut a transaction in two (a
// shutdown, or the tables' watch) left its first events in Kafka but out of
// the checkpoint, which covers whole transactions only (docs/design.md,
// "Confirm transaction end LSNs"), and the next start sent them again; a
// transaction too large to finish within grace is still cut. It is safe
// from any goroutine; a second call does nothing.
func (s *Stream) End(grace time.Duration) {
	s.endOnce.Do(func() {
		s.endBy.Store(time.Now().Add(grace).UnixNano())
		close(s.ending)
		s.Wake()
	})
}

// Wake makes Run look at its Acks now rather than at its next poll: call it
// when the confirmable position moved, such as when a checkpoint was
// acknowledged. It is safe from any goroutine, and cheap enough for a few
// calls per confirm interval; a call while Run is between receives makes
// its next receive return at once.
func (s *Stream) Wake() {
	if r := s.recv.Load(); r != nil {
		r.wake()
	}
}

// Beat returns when Run's loop last went round: at least every
// StatusInterval while it runs; the zero time before its first round (not
// 1970, which /healthz read as a loop silent for 56 years).
func (s *Stream) Beat() time.Time {
	if b := s.beat.Load(); b != 0 {
		return time.Unix(0, b)
	}
	return time.Time{}
}

// Open connects in replication mode and starts streaming cfg.Slot from its
// confirmed position, from (setup.Prepare's SlotState).
func Open(ctx context.Context, cfg postgres.Config, from pglogrepl.LSN, log hclog.Logger) (*Stream, error) {
	c, err := Connect(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	s, err := c.Start(ctx, cfg.Slot, from)
	if err != nil {
		c.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return s, nil
}

// startError classifies START_REPLICATION's refusals; from is the slot's
// confirmed position as far as the caller knows (0: not known).
func startError(slot string, from pglogrepl.LSN, err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case pe.Code == "55006": // object_in_use: "is active for PID N"
			return &postgres.SlotInUseError{Slot: slot, Err: err}
		case pe.Code == "42704": // undefined_object
			return &errtext.Fatal{Err: postgres.ErrSlotVanished, Msg: fmt.Sprintf("replication slot %q does not exist any more (dropped, or Postgres failed over without failover slots); investigate, then restart the connector to create a new slot", slot)}
		case pe.Code == "55000" && (strings.Contains(pe.Message, "can no longer") || postgres.ReasonFromDetail(pe.Detail) != ""):
			// Invalidated between setup.Prepare's look and now, or while
			// the connector reconnected: the detail names the cause.
			// PostgreSQL 14 and 15 say "cannot read from logical
			// replication slot", later ones "can no longer get changes
			// from" (or "access") it.
			reason := postgres.ReasonFromDetail(pe.Detail)
			lost := postgres.LostBecause(reason)
			if reason == "" {
				lost.Cause = fmt.Sprintf("Postgres invalidated it (%s: %s)", pe.Message, pe.Detail)
			}
			return postgres.LostSlotError(slot, from, lost)
		}
	}
	return fmt.Errorf("start replication on slot %q: %w", slot, err)
}

// Run receives until ctx is done, End's stop comes, Acks reports an error,
// handle fails, or the connection breaks. It returns ctx.Err() on
// cancellation and ErrEnded after End, leaving the connection open for
// Close to send the final position.
//
// Confirms are prompt: while Acks owes anything, the loop looks at
// Confirmed at least every ConfirmInterval and sends a status update as
// soon as it moved, at most one per ConfirmInterval. Otherwise a status
// update goes out every StatusInterval, as a keepalive. rel, when not
// nil, is the producer's batching, which the loop drives.
func (s *Stream) Run(ctx context.Context, handle Handler, acks Acks, rel Releaser) error {
	now := time.Now()
	l := &loop{s: s, acks: acks, rel: rel, statusAt: now, confirmAt: now, heard: now}
	recv := newReceiver(s.conn.Conn())
	s.recv.Store(recv)
	stop := context.AfterFunc(ctx, recv.cancel)
	l.batch = coalescer(s.conn.Conn())
	if l.batch != nil && rel != nil {
		l.batch.drained = rel.Drained
	}
	defer func() {
		if l.batch != nil {
			if l.live {
				l.setLive(false)
			}
			l.batch.drained = nil
		}
		s.recv.Store(nil)
		stop()
		recv.reset()
	}()

	for {
		now = time.Now()
		s.beat.Store(now.UnixNano())
		if err := acks.Err(); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if by := s.endBy.Load(); by != 0 && (!l.open || now.UnixNano() >= by) {
			return ErrEnded
		}
		wake, err := l.status(now)
		if err != nil {
			return err
		}
		// End wakes a wait once; after it, the grace's end is a wake-up
		// like the others (a closed channel would wake every wait at once).
		ending := s.ending
		if by := s.endBy.Load(); by != 0 {
			wake, ending = minTime(wake, time.Unix(0, by)), nil
		}
		if acks.Saturated() {
			l.heard = now // not reading: silence says nothing
			// Stop reading: the walsender's socket fills and it waits.
			// Status updates still leave on time, which is what keeps
			// the walsender from timing out while Kafka is slow.
			t := time.NewTimer(time.Until(wake))
			select {
			case <-acks.Changed():
			case <-t.C:
			case <-ctx.Done():
			case <-ending:
			}
			t.Stop()
			continue
		}

		// No context per receive: a context would cost pgconn a watcher
		// and a timer per message. The socket's read deadline wakes the
		// receive instead, and recv.cancel ends it when ctx is done.
		recv.wakeAt(wake)
		msg, err := s.conn.ReceiveMessage(context.Background())
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pgconn.Timeout(err) {
				continue
			}
			return fmt.Errorf("receive from replication slot %q: %w", s.slot, err)
		}
		l.heard = time.Now()
		if err := l.dispatch(msg, handle); err != nil {
			return err
		}
	}
}

// loop is Run's state between two receives.
type loop struct {
	s    *Stream
	acks Acks
	rel  Releaser
	// statusAt is the next keepalive; confirmAt the earliest next status
	// update that confirms; pollAt the next look at Confirmed.
	statusAt, confirmAt, pollAt time.Time
	// heard is when the loop last heard from the walsender, or last had
	// a reason not to expect to (it did not read): ReceiveTimeout.
	heard time.Time
	batch *coalescingConn
	live  bool
	// open: a transaction's BEGIN was handled, and its COMMIT not yet
	// (End).
	open bool
	// atEnd: a keepalive came after the last BEGIN. A walsender sends one
	// when it has sent all the WAL there is (and the client has not
	// confirmed it all): only then may the stream turn live (liveAfter),
	// not in the middle of a backlog young enough to look live. One that
	// comes before the session's first BEGIN says nothing: a walsender
	// may send one before it starts on a backlog.
	atEnd, begun bool
}

func (l *loop) setLive(on bool) {
	l.live = on
	l.batch.batchReads(on, l.s.cfg.ReadBatchDelay())
	if l.rel != nil {
		l.rel.Live(on)
	}
	if l.s.cfg.OnLive != nil {
		l.s.cfg.OnLive(on)
	}
}

// status sends the status update that is due, if one is, releases the
// producer's batch that is due, and returns when the loop must look
// again: the next keepalive, batch or look at Confirmed.
func (l *loop) status(now time.Time) (wake time.Time, err error) {
	s, cfg := l.s, l.s.cfg
	pos := s.position(l.acks)
	if cfg.ReceiveTimeout > 0 && now.Sub(l.heard) > cfg.ReceiveTimeout {
		return wake, &DeadConnError{Slot: s.slot, Silent: now.Sub(l.heard)}
	}
	if !now.Before(l.statusAt) || (pos > s.sent && !now.Before(l.confirmAt)) {
		// Past half of ReceiveTimeout in silence, ask for an answer: a
		// live walsender sends a keepalive at once.
		if err := s.sendStatusReply(pos, cfg.ReceiveTimeout > 0 && now.Sub(l.heard) > cfg.ReceiveTimeout/2); err != nil {
			return wake, err
		}
		l.statusAt, l.confirmAt = now.Add(cfg.StatusInterval), now.Add(cfg.ConfirmInterval)
	}
	wake = l.statusAt
	if l.rel != nil {
		if next := l.rel.Release(now); !next.IsZero() {
			wake = minTime(wake, next)
		}
	}
	if pos > s.sent || l.acks.Owed() {
		if !l.pollAt.After(now) {
			l.pollAt = now.Add(cfg.ConfirmInterval)
		}
		wake = minTime(wake, maxTime(l.pollAt, l.confirmAt))
	}
	return wake, nil
}

// dispatch hands a keepalive to Acks and WAL data to handle.
func (l *loop) dispatch(msg pgproto3.BackendMessage, handle Handler) error {
	s := l.s
	switch msg := msg.(type) {
	case *pgproto3.CopyData:
		if len(msg.Data) == 0 {
			return fmt.Errorf("empty CopyData from replication slot %q", s.slot)
		}
		switch msg.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
			if err != nil {
				return fmt.Errorf("parse keepalive: %w", err)
			}
			l.acks.Keepalive(ka.ServerWALEnd, ka.ServerTime)
			l.atEnd = l.begun
			if ka.ReplyRequested {
				l.statusAt = time.Now()
			}
		case pglogrepl.XLogDataByteID:
			xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
			if err != nil {
				return fmt.Errorf("parse XLogData: %w", err)
			}
			// Batch reads while the stream is live (coalescingConn).
			if commit, ok := decode.BeginCommitTime(xld.WALData); ok {
				if s.endBy.Load() != 0 {
					return ErrEnded // nothing of this transaction was handled
				}
				if on := liveAfter(l.live, l.atEnd, time.Since(commit)); l.batch != nil && on != l.live {
					l.setLive(on)
				}
				l.atEnd, l.begun, l.open = false, true, true
			}
			if err := handle(xld.WALStart, xld.WALData); err != nil {
				return err
			}
			if l.open && decode.IsCommit(xld.WALData) {
				l.open = false
			}
			l.heard = time.Now() // a blocking handle (While) read nothing meanwhile
		}
	case *pgproto3.ErrorResponse:
		return fmt.Errorf("replication slot %q: %w", s.slot, pgconn.ErrorResponseToPgError(msg))
	case *pgproto3.CopyDone:
		return fmt.Errorf("postgres ended the replication stream of slot %q", s.slot)
	}
	return nil
}

// While runs fn, which may block (an admin call to Kafka, a read of the
// checkpoint topic), and keeps the slot's lease while it does: from the
// goroutine that runs Run, which is the one calling handle, it sends a status
// update with the position already reported every StatusInterval until fn
// returns. The connection stays with one goroutine (docs/design.md, "One
// goroutine owns the connection"), and a standby never takes a busy holder for
// a frozen one (docs/operations.md, "Active and standby"). It receives nothing
// meanwhile: the walsender waits.
func (s *Stream) While(fn func() error) error {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	t := time.NewTicker(s.cfg.StatusInterval)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			return err
		case now := <-t.C:
			s.beat.Store(now.UnixNano())
			if err := s.sendStatus(s.sent); err != nil {
				// The connection is gone: fn's result no longer matters
				// more than that, but wait for it, since it may use
				// what the caller owns.
				<-done
				return err
			}
		}
	}
}

// position is what may be confirmed now.
func (s *Stream) position(acks Acks) pglogrepl.LSN {
	pos := acks.Confirmed()
	if s.sent > pos {
		pos = s.sent // never report going backwards
	}
	return pos
}

func (s *Stream) sendStatus(pos pglogrepl.LSN) error { return s.sendStatusReply(pos, false) }

// sendStatusReply sends a status update, asking the walsender to answer
// at once when reply is set.
func (s *Stream) sendStatusReply(pos pglogrepl.LSN, reply bool) error {
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: pos,
		WALFlushPosition: pos,
		WALApplyPosition: pos,
		ClientTime:       time.Now(),
		ReplyRequested:   reply,
	})
	if err != nil {
		return fmt.Errorf("send standby status update to slot %q: %w", s.slot, err)
	}
	if pos != s.sent && s.log.IsTrace() {
		s.log.Trace("confirmed", "lsn", pos.String())
	}
	s.sent = pos
	return nil
}

// Close sends a last status update with what acks allows and closes the
// connection. Call it on the goroutine that ran Run, after Run returned.
func (s *Stream) Close(ctx context.Context, acks Acks) pglogrepl.LSN {
	if s.conn.IsClosed() {
		// A failed receive closed it already, and pgconn's closing
		// goroutine owns the socket now: nothing more can be sent.
		return s.sent
	}
	if err := s.sendStatus(s.position(acks)); err != nil {
		s.log.Debug("final status update not sent", "error", err)
	}
	s.conn.Close(ctx)
	return s.sent
}

// receiver wakes the loop's receive through the socket's read deadline.
// pgconn treats a read timeout as harmless: the message being read, if
// any, is picked up where it stopped by the next receive.
type receiver struct {
	conn net.Conn

	mu        sync.Mutex
	at        time.Time // the deadline set
	woken     bool      // wake was called since the loop last set a deadline
	cancelled bool
}

func newReceiver(conn net.Conn) *receiver { return &receiver{conn: conn} }

// past is a deadline that has passed: a receive under it returns at once.
var past = time.Unix(1, 0)

// wakeAt sets the next receive's deadline, unless cancel came first. After
// a wake it sets one that has passed instead, so that the loop goes round
// once more and sees what the wake was for, even if the wake came after
// the loop had looked.
func (r *receiver) wakeAt(at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancelled {
		return
	}
	if r.woken {
		r.woken, at = false, past
	}
	if !at.Equal(r.at) {
		r.at = at
		_ = r.conn.SetReadDeadline(at)
	}
}

// wake ends the receive in progress, or the next one.
func (r *receiver) wake() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancelled {
		return
	}
	r.woken, r.at = true, past
	_ = r.conn.SetReadDeadline(past)
}

// cancel ends the receive in progress, and every later one.
func (r *receiver) cancel() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cancelled = true
	_ = r.conn.SetReadDeadline(past)
}

// reset clears the deadline, for what Close still reads or writes.
func (r *receiver) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	_ = r.conn.SetReadDeadline(time.Time{})
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
