package relay

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/delivery"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/metrics"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/schema"
	"github.com/outboxcdc/cdc/internal/sink"
)

// Sender sends one session's events. Its fields are the session's; Send
// runs on the session's goroutine (the stream's), the acks on franz-go's.
type Sender struct {
	Router  *route.Router
	Schemas *schema.Registry // nil unless a table's schema is in the registry
	Kafka   *sink.Kafka
	Tracker *delivery.Tracker
	// MaxMessageBytes is kafka.max_message_bytes, DeadLetterMaxMessageBytes
	// kafka.dead_letter_max_message_bytes: a dead letter larger than it is
	// cut (route.TruncateDeadLetter).
	MaxMessageBytes, DeadLetterMaxMessageBytes int
	// CheckpointTopic is checkpoint.topic, which no event may reach.
	CheckpointTopic string
	// Suffix is appended to every topic (a replay's).
	Suffix string
	// Blocking runs a call that may block for seconds (a topic's creation,
	// a schema's lookup), keeping the slot's lease (wal.Stream.While).
	Blocking func(func() error) error
	// Skipped reports whether an operator chose, with cdc skip, to send
	// this event to its dead-letter topic rather than stop on it; nil:
	// never.
	Skipped func(*outbox.Event) bool
	// Produced, when set, is told of each record produced (exactly once:
	// the Committer's count of its transaction).
	Produced func()
	// LeftOut, when set, is told of each event its table's filter left
	// out (a replay's count of what it sent).
	LeftOut func(*outbox.Event)
	// OnDelivered, when set, is told of each record and Kafka's answer,
	// after the tracker (pipeline.Options.OnDelivered).
	OnDelivered func(rec *kgo.Record, err error)
	// Parked holds back the keys on_invalid: park parked (park.go); nil in
	// a replay, which parks nothing. MaxParkedKeys is max_parked_keys.
	Parked        *park.Set
	MaxParkedKeys int
	// DeadLettered counts the events sent to a dead-letter topic.
	DeadLettered *atomic.Int64
	Metrics      *metrics.Metrics
	Log          hclog.Logger

	counters metrics.EventCounters
	filtered map[*outbox.Source]prometheus.Counter // leaveOut's, by table
}

// Send routes ev's record and produces it in transaction tx, or applies
// the source's on_invalid policy when it cannot be delivered as
// configured. ctx bounds the admin and registry calls it makes.
func (s *Sender) Send(ctx context.Context, tx *delivery.Txn, m *decode.Message) error {
	ev := &m.Event
	rec, err := s.record(ctx, m)
	if errors.Is(err, route.ErrFiltered) {
		return s.leaveOut(ev)
	}
	switch {
	case err != nil && !errors.As(err, new(*outbox.EventError)):
		return err // a registry that cannot answer: retried, never dead-lettered
	case err != nil && ev.Source.OnInvalid == outbox.OnInvalidPark:
		return s.park(ctx, tx, ev, err)
	case err != nil:
		if rec, err = s.deadLetter(ev, err); err != nil {
			return err
		}
	default:
		if p := s.Parked.Parked(rec.Topic, ev.Source.String(), string(rec.Key)); p != nil {
			return s.parkBehind(ctx, tx, ev, rec, p)
		}
	}
	if s.Suffix != "" {
		rec.Topic += s.Suffix
	}
	if rec.Topic == s.CheckpointTopic {
		// A template that expands to the checkpoint topic: a row writer would
		// be writing the connector's own state (docs/design.md, "Untrusted
		// input stays data").
		cause := outbox.Invalid(ev, "its topic is the checkpoint topic %q, which only the connector and the operator write; fix the row's routing fields or the table's topic template", rec.Topic)
		if rec.Topic == ev.Source.DeadLetterTopic || ev.Source.OnInvalid != outbox.OnInvalidDeadLetter {
			return cause
		}
		if rec, err = s.deadLetter(ev, cause); err != nil {
			return err
		}
	}
	if s.Log.IsTrace() {
		s.Log.Trace("event", "source", ev.Source.String(), "id", ev.ID(), "topic", rec.Topic, "lsn", ev.CommitLSN.String())
	}
	if !s.Kafka.TopicKnown(rec.Topic) {
		if rec, err = s.ensureTopic(ctx, rec, ev); err != nil {
			return err
		}
	}
	s.produce(tx, rec, ev)
	return nil
}

// ensureTopic makes rec's topic before its first record. A name the
// brokers refuse is the event's problem: rec becomes its dead letter.
func (s *Sender) ensureTopic(ctx context.Context, rec *kgo.Record, ev *outbox.Event) (*kgo.Record, error) {
	err := s.Blocking(func() error { return s.Kafka.EnsureTopic(ctx, rec.Topic) })
	var refused *sink.TopicRefusedError
	if errors.As(err, &refused) && rec.Topic != ev.Source.DeadLetterTopic {
		// The row's fields chose a name the brokers refuse: the
		// event's problem, for on_invalid, not the stream's.
		cause := outbox.Invalid(ev, "%v; fix the row's routing fields or the table's topic template", err)
		if rec, err = s.deadLetter(ev, cause); err != nil {
			return nil, err
		}
		if !s.Kafka.TopicKnown(rec.Topic) {
			err = s.Blocking(func() error { return s.Kafka.EnsureTopic(ctx, rec.Topic) })
		}
	}
	if err != nil {
		return nil, err
	}
	return rec, nil
}

// record builds m's Kafka record: an *outbox.EventError when m is invalid,
// or the record does not fit kafka.max_message_bytes.
func (s *Sender) record(ctx context.Context, m *decode.Message) (*kgo.Record, error) {
	if m.Invalid != nil { // not error(m.Invalid): a nil pointer would be a non-nil error
		return nil, m.Invalid
	}
	rec, err := s.Router.Record(&m.Event)
	if err == nil {
		err = s.Schemas.Apply(ctx, rec, &m.Event, s.Blocking)
	}
	if err == nil && sink.Pinned(rec) {
		err = s.checkPartition(ctx, rec, &m.Event)
	}
	if err != nil {
		return nil, err
	}
	if n := sink.RecordSize(rec); n > s.MaxMessageBytes {
		return nil, outbox.Invalid(&m.Event, "the record is %d bytes, more than kafka.max_message_bytes (%d); raise it together with the topic's max.message.bytes, or make the payload smaller", n, s.MaxMessageBytes)
	}
	return rec, nil
}

// deadLetter applies on_invalid to an event that cannot be delivered: with
// fail it returns cause, which stops the connector; with dead-letter it
// returns the dead-letter record, which is tracked like any event, so that
// its transaction is confirmed only once Kafka acked it.
func (s *Sender) deadLetter(ev *outbox.Event, cause error) (*kgo.Record, error) {
	if ev.Source.OnInvalid != outbox.OnInvalidDeadLetter {
		if s.Skipped == nil || !s.Skipped(ev) {
			s.Metrics.InvalidEvents.Inc()
			return nil, cause
		}
		return s.letter(ev, cause, " (sent here by cdc skip)")
	}
	return s.letter(ev, cause, "")
}

// letter is ev's dead-letter record, for cause; note follows the reason.
func (s *Sender) letter(ev *outbox.Event, cause error, note string) (*kgo.Record, error) {
	s.Metrics.InvalidEvents.Inc()
	reason := cause.Error()
	var ee *outbox.EventError
	if errors.As(cause, &ee) {
		reason = ee.Brief() // the reason, without what to do when stopping on it
	}
	reason += note
	rec := s.Router.DeadLetter(ev, reason)
	if n, limit := sink.RecordSize(rec), s.DeadLetterMaxMessageBytes; n > limit {
		// Too large for the dead-letter topic too: the row's problem
		// still, so its dead letter keeps the reason and what fits.
		route.TruncateDeadLetter(rec, limit, sink.RecordSize)
		s.Log.Warn("a dead letter was larger than kafka.dead_letter_max_message_bytes: its payload is cut", "source", ev.Source.String(), "id", ev.ID(), "bytes", n, "limit", limit)
	}
	s.DeadLettered.Add(1)
	s.Metrics.DeadLetter(ev.Source.String())
	s.Log.Warn("event sent to the dead-letter topic", "source", ev.Source.String(), "id", ev.ID(), "lsn", ev.CommitLSN.String(), "topic", rec.Topic, "error", errtext.OneLine(cause))
	return rec, nil
}

// metricTopic is cdc_events_total's topic label for a record of t to
// topic: the topic itself when it is static (or a dead letter), the
// template (or the expression) when a row's fields choose it, so that rows
// cannot make series without bound.
func metricTopic(t *outbox.Source, topic string) string {
	if parts := t.TopicTemplate.Parts; (len(parts) == 1 && parts[0].Kind == outbox.PartLiteral) || topic == t.DeadLetterTopic {
		return topic
	}
	if x := t.Programs; x != nil && x.Topic != nil {
		return x.Topic.Text
	}
	return t.Topic
}

// produce counts rec in flight in tx and sends it; the ack comes back to
// the tracker, and to the metrics, on franz-go's goroutine. The labelled
// counter and the event's timestamp are worked out here, so the ack does
// no lookups.
func (s *Sender) produce(tx *delivery.Txn, rec *kgo.Record, ev *outbox.Event) {
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
	s.Kafka.Send(rec, func(err error) {
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
}
