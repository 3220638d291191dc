package session

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/delivery"
	"github.com/outboxcdc/cdc/internal/fault"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/relay"
	"github.com/outboxcdc/cdc/internal/replay"
	"github.com/outboxcdc/cdc/internal/request"
	"github.com/outboxcdc/cdc/internal/sink"
	"github.com/outboxcdc/cdc/internal/tablewatch"
	"github.com/outboxcdc/cdc/internal/wal"
)

// sessionAcks is how a session confirms: what the replication loop reads
// (wal.Acks), and what shutdown finishes. Its two implementations live side
// by side in internal/delivery: the Confirmer at least once, the Committer
// exactly once.
type sessionAcks interface {
	wal.Acks
	Final(ctx context.Context) error
}

// session is one replication session: one replication connection, one
// Kafka client, one decoder and one tracker. One event goes as
// docs/design.md draws it: the stream hands its bytes to handle, the
// decoder turns them into an Event, event hands it to the relay.Sender,
// which has the router make a Record (or a dead-letter record) and
// produces it, and its ack lands in the tracker, which the stream reads
// before its next receive. Everything but the ack callback runs on the
// stream's goroutine.
type session struct {
	d       Deps
	kafka   *sink.Kafka
	tracker *delivery.Tracker
	dec     *decode.Decoder
	// msg is the message handle decodes into, the session's one, where a
	// message of handle's own moved to the heap (what it calls keeps
	// pointers the compiler cannot follow): a Message holds a whole event,
	// 512 bytes allocated for every Begin, Insert and Commit. It holds
	// only until the next message: nothing keeps a pointer into it past
	// handle (a record aliases the row's own copy, a parked event and an
	// error copy what they keep), and handle is never entered again before
	// it returns (the stream calls it from one goroutine, and receives
	// nothing in While).
	msg decode.Message
	tx  *delivery.Txn // the open transaction, between BEGIN and COMMIT
	// replay, when set, selects what a replay re-sends; nil streams all.
	replay *replay.Filter
	// ctx is the session's, for the admin calls EnsureTopic makes.
	ctx context.Context
	// out sends the events on to Kafka.
	out *relay.Sender
	// eos commits Kafka transactions in exactly-once mode (nil otherwise).
	eos *delivery.Committer
	// stream is the replication stream once it started, for blocking.
	stream *wal.Stream
	// requests follows the backfill requests in the checkpoint topic.
	requests *request.Requests
	// tables watches the outbox tables' lives (package tablewatch); nil in a
	// replay.
	tables *tablewatch.Watch
	// parked holds back the keys on_invalid: park parked (package park),
	// from the saved checkpoint's; nil in a replay.
	parked *park.Set
	// ledger is the operator's requests taken (checkpoint.Record.Used),
	// the saved checkpoint's and this session's.
	ledger request.Ledger
	// skipTo is the commit LSN of the last transaction the checkpoint says
	// Kafka holds, in this WAL history (wal.Conn.SameHistory); skipping is set between
	// the BEGIN and COMMIT of a transaction at or below it. A slot's confirmed
	// position reaches disk only at a server checkpoint, so after a Postgres
	// restart or crash it goes back (docs/design.md, "Re-delivery after a
	// crash"), and without the skip everything since was sent again, in either
	// mode.
	skipTo   pglogrepl.LSN
	skipping bool
	// sentInTx is set once the open transaction sent an event: a redrive
	// announced after it is not taken there (session.redrive).
	sentInTx bool
	// endedAt is when end was first called (unix nanoseconds), or 0.
	endedAt atomic.Int64
	// covered are the tables whose repair's rows went at the first fresh
	// event of their relation (session.fresh), with that relation and what
	// the repair's snapshot showed (checkpoint.Table.Seen): the stream
	// passes over the relation's events that the snapshot sent, until it
	// is past them (session.uncover). unrepaired are the fresh relations,
	// by table, that no repair is coming for.
	covered    map[*outbox.Source]checkpoint.Table
	unrepaired map[*outbox.Source]uint32
	// sent are the ids of the rows each covered table's repair sent (nil:
	// too many kept), for the stream to pass over its events of them.
	sent map[*outbox.Source]map[string]bool
}

// end asks the stream to end between two transactions, within half of
// shutdown_timeout (wal.Stream.End): what it sent is then whole
// transactions, which the last checkpoint covers, and a restart sends
// none of it again. Shutdown and the tables' watch call it, on any
// goroutine.
func (s *session) end() {
	s.endedAt.CompareAndSwap(0, time.Now().UnixNano())
	s.stream.End(s.d.Config.ShutdownTimeout / 2)
}

// endAsked is when end was first called, or now if it was not: a
// shutdown's deadlines run from it.
func (s *session) endAsked() time.Time {
	if at := s.endedAt.Load(); at != 0 {
		return time.Unix(0, at)
	}
	return time.Now()
}

// blocking runs fn, which may block for seconds, keeping the slot's lease
// through the stream (wal.Stream.While) once the session streams.
func (s *session) blocking(fn func() error) error {
	if s.stream == nil {
		return fn() // the first start's backfill: no stream yet
	}
	return s.stream.While(fn)
}

// handle takes one pgoutput message from the stream.
func (s *session) handle(_ pglogrepl.LSN, data []byte) error {
	var err error
	s.msg, err = s.dec.Decode(data)
	m := &s.msg
	if err != nil {
		if errors.As(err, new(*decode.LookupError)) {
			return err // the catalog did not answer: a new session asks again
		}
		return &fault.DecodeError{Err: err}
	}
	switch m.Kind {
	case decode.KindBegin:
		if m.Commit <= s.skipTo {
			s.skipping = true
			return nil
		}
		if s.eos != nil {
			if err := s.eos.Begin(); err != nil {
				return err
			}
		}
		if s.replay != nil {
			if err := s.replay.Begin(m); err != nil {
				return err
			}
		}
		s.tx, s.sentInTx = s.tracker.Begin(m.CommitTime), false
	case decode.KindEvent, decode.KindInvalid:
		if m.Fresh && s.tables != nil {
			if passed, err := s.freshEvent(m); passed || err != nil {
				return err
			}
		}
		if s.skipping {
			return nil
		}
		if len(s.covered) > 0 {
			if c, ok := s.covered[m.Event.Source]; ok && c.Rel == m.Rel && c.Seen.Sees(m.XID) && s.sentBy(m.Event.Source, c.Seen, m.Event.ID()) {
				return nil // the repair's snapshot sent it
			}
		}
		if s.replay != nil && !s.replay.Take(&m.Event) {
			return nil
		}
		s.d.Jobs.Seen(&m.Event)
		return s.event(m)
	case decode.KindIgnoredMessage:
		s.d.IgnoredMessages.Add(1)
	case decode.KindUnmapped:
		if s.tables != nil {
			s.tables.UnmappedInsert(m.Relation)
		}
	case decode.KindControl:
		if s.replay == nil && !s.skipping {
			return s.control(m)
		}
	case decode.KindCommit:
		if s.skipping {
			s.skipping = false
			return nil
		}
		if len(s.covered) > 0 {
			s.uncover(m.XID)
		}
		s.out.NoteParked(s.tx)
		s.tracker.Commit(s.tx, m.Commit, m.EndLSN, m.CommitTime)
		s.tx = nil
		if s.replay != nil {
			s.replay.Commit()
		}
	}
	return nil
}

// event sends one event on to Kafka, in the open transaction (package
// relay).
func (s *session) event(m *decode.Message) error {
	s.sentInTx = true
	return s.out.Send(s.ctx, s.tx, m)
}

// newSender is the session's relay.Sender, once its tracker, Kafka client,
// committer and replay filter are set.
func (s *session) newSender() *relay.Sender {
	d, cfg := s.d, s.d.Config
	out := &relay.Sender{
		Router: d.Router, Schemas: d.Schemas, Kafka: s.kafka, Tracker: s.tracker,
		CheckpointTopic: cfg.Checkpoint.Topic, ParkedTopics: cfg.ParkedTopics(), DeadLetterTopics: cfg.DeadLetterTopics(), Refused: d.Refused, Blocking: s.blocking, Skipped: s.skipped,
		Parked: s.parked, MaxParkedKeys: cfg.MaxParkedKeys,
		OnDelivered: d.OnDelivered, DeadLettered: d.DeadLettered, Metrics: d.Metrics, Log: d.Log,
	}
	if s.eos != nil {
		out.Produced, out.OnPark = s.eos.Produced, s.eos.Soon
	}
	if keys := cfg.Checkpoint.SigningKeys; len(keys) > 0 && s.parked != nil {
		saved := d.Progress.Saved()
		out.SealKey, out.PipelineKey = keys[0], saved.Key()
	}
	if s.replay != nil {
		out.Suffix, out.LeftOut, out.Held = s.replay.Suffix(), s.replay.LeftOut, s.replay.Held
	}
	return out
}

// skipped reports whether an operator chose, with cdc skip, to send ev to
// the dead-letter topic rather than stop on it.
func (s *session) skipped(ev *outbox.Event) bool {
	if s.d.Progress == nil || s.replay != nil {
		return false
	}
	saved := s.d.Progress.Saved()
	return saved.Skipped(ev.CommitLSN, ev.ID())
}
