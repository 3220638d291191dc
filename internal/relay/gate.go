package relay

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/delivery"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/sink"
)

// The gate (docs/security.md, "One gate"): every record the connector
// produces for an event, whatever made it (the stream, a backfill, a
// repair, a replay, a dead letter, a parked record, a redrive, a dropped
// first event, a skipped one), passes admit, in produce, the only code in
// this package that hands a record to the producer. A row chooses a topic;
// the topic never chooses what the row may do: the checkpoint topic is
// never one, a parked topic only for parking's own records, the record
// fits that topic's limit, and a partition a record names is one the
// topic has. A refusal is the event's problem (*outbox.EventError), for
// its table's on_invalid; never a stop of every table for one row, and
// never a record in a topic it may not reach. A topic the brokers refuse
// at the record (RefusedTopics) is, from the next session on, such a
// refusal too. TestOneGate (cmd/cdc) fails
// when code elsewhere produces without it.

// Kind is what made a record, for the gate.
type Kind uint8

const (
	// KindEvent is an event's record, by any path.
	KindEvent Kind = iota
	// KindDeadLetter is a dead letter: on_invalid, on_invalid_unkeyed, cdc
	// skip, cdc redrive --drop-first.
	KindDeadLetter
	// KindParked is a parked record: the only kind a parked topic takes.
	KindParked
)

// admit is the gate: nil when rec may be produced, an *outbox.EventError
// of ev when it may not, or another error when Kafka could not tell (a
// topic that could not be made or counted: retried, never the event's).
// It makes rec's topic before its first record, and reads the partition
// count of a topic a record is pinned in.
func (s *Sender) admit(ctx context.Context, rec *kgo.Record, kind Kind, ev *outbox.Event) error {
	// Names compare as Kafka compares them (sink.SameTopic): a row that made
	// "outbox_parked" first would keep "outbox.parked" from being made.
	switch {
	case sink.SameTopic(rec.Topic, s.CheckpointTopic) || (s.Suffix != "" && sink.SameTopic(rec.Topic, s.CheckpointTopic+s.Suffix)):
		// A template that expands to the checkpoint topic: a row writer would
		// be writing the connector's own state (docs/design.md, "Untrusted
		// input stays data").
		return outbox.Invalid(ev, "its topic is the checkpoint topic %q (as Kafka compares names, %q), which only the connector and the operator write; fix the row's routing fields or the table's topic template", s.CheckpointTopic, rec.Topic)
	case kind != KindParked && (sameAsOne(rec.Topic, s.ParkedTopics, s.Suffix) || s.Parked.HoldsTopic(rec.Topic)):
		// A parked topic configured, or one a parking still has records
		// in (a table's parked_topic changed since it parked a key).
		return outbox.Invalid(ev, "its topic is a parked topic (as Kafka compares names, %q), which only the connector's parking writes; fix the row's routing fields or the table's topic template", rec.Topic)
	case kind == KindEvent && sameAsOne(rec.Topic, s.DeadLetterTopics, s.Suffix):
		return outbox.Invalid(ev, "its topic is a dead-letter topic (as Kafka compares names, %q), which only the connector's dead letters reach; fix the row's routing fields or the table's topic template", rec.Topic)
	case kind == KindEvent && kafkaInternal(rec.Topic):
		return outbox.Invalid(ev, "its topic %q is named as Kafka names its internal topics (\"__\"), which the brokers keep to themselves; fix the row's routing fields or the table's topic template", rec.Topic)
	}
	if why := s.Refused.why(rec.Topic); why != "" && kind == KindEvent {
		return outbox.Invalid(ev, "kafka refused a record to its topic %q (%s); fix the row's routing fields or the table's topic template, or let the connector's principal write the topic and start the connector again", rec.Topic, why)
	}
	if n, limit := sink.RecordSize(rec), s.Kafka.MaxMessageBytesOf(rec.Topic); n > limit {
		what := "kafka.max_message_bytes"
		if kind != KindEvent {
			what = "kafka.dead_letter_max_message_bytes"
		}
		return outbox.Invalid(ev, "the record is %d bytes, more than %s (%d) allows topic %q; raise it together with the topic's max.message.bytes, or make the payload smaller", n, what, limit, rec.Topic)
	}
	if !s.Kafka.TopicKnown(rec.Topic) {
		err := s.Blocking(func() error { return s.Kafka.EnsureTopic(ctx, rec.Topic) })
		var refused *sink.TopicRefusedError
		if errors.As(err, &refused) {
			// The row's fields chose a name the brokers refuse: the
			// event's problem, for on_invalid, not the stream's.
			return outbox.Invalid(ev, "%v; fix the row's routing fields or the table's topic template", err)
		}
		if err != nil {
			return err
		}
	}
	if sink.Pinned(rec) {
		return s.checkPartition(ctx, rec, ev)
	}
	return nil
}

// produce passes rec, of kind, through the gate, then counts it in flight
// in tx and sends it; the ack comes back to the tracker, and to the
// metrics, on franz-go's goroutine. The labelled counter and the event's
// timestamp are worked out here, so the ack does no lookups. It is the only
// call of the producer in this package.
func (s *Sender) produce(ctx context.Context, tx *delivery.Txn, rec *kgo.Record, ev *outbox.Event, kind Kind) error {
	if err := s.admit(ctx, rec, kind, ev); err != nil {
		return err
	}
	if kind == KindDeadLetter {
		s.noteLetter(ev, rec)
	}
	if s.Log.IsTrace() {
		s.Log.Trace("event", "source", ev.Source.String(), "id", ev.ID(), "topic", rec.Topic, "lsn", ev.CommitLSN.String())
	}
	tracker, onDelivered, m := s.Tracker, s.OnDelivered, s.Metrics
	events := s.counters.Get(m, ev.Source, metricTopic(ev.Source, rec.Topic))
	var stamped time.Time
	if v := ev.Fields[outbox.FieldTimestamp]; !v.Null() {
		stamped, _ = route.ParseTimestamp(string(v.B))
	}
	size := sink.RecordSize(rec)
	tracker.Track(tx, size)
	if s.Produced != nil {
		s.Produced()
	}
	refused := s.Refused
	s.Kafka.Send(rec, func(err error) {
		if err != nil && kind == KindEvent {
			err = refused.note(rec.Topic, err)
		}
		tracker.Ack(tx, size, err)
		if err != nil {
			m.ProduceErrors.Inc()
		} else {
			now := time.Now()
			events.Inc()
			m.CommitToAck.Observe(now.Sub(rec.Timestamp).Seconds())
			if !stamped.IsZero() {
				m.EventAge.Observe(now.Sub(stamped).Seconds())
			}
		}
		if onDelivered != nil {
			onDelivered(rec, err)
		}
	})
	return nil
}

// invalid reports whether err is the event's problem, for on_invalid.
func invalid(err error) bool { return errors.As(err, new(*outbox.EventError)) }
