package relay

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

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
	// CheckpointTopic is checkpoint.topic, ParkedTopics the tables'
	// parked_topic: the gate keeps every row out of the first, and all but
	// parking's own records out of the others (gate.go).
	// DeadLetterTopics are the tables' dead_letter_topic, which only dead
	// letters reach. Refused are the topics the brokers refused an event's
	// record for, the pipeline's (topics.go).
	CheckpointTopic  string
	ParkedTopics     map[string]bool
	DeadLetterTopics map[string]bool
	Refused          *RefusedTopics
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
	// Held, when set, says whether an event with its record key is held
	// back, not sent: a replay's, for the keys parked (replay.Filter.Held).
	Held func(ev *outbox.Event, key []byte) bool
	// OnDelivered, when set, is told of each record and Kafka's answer,
	// after the tracker (pipeline.Options.OnDelivered).
	OnDelivered func(rec *kgo.Record, err error)
	// Parked holds back the keys on_invalid: park parked (park.go); nil in
	// a replay, which parks nothing. MaxParkedKeys is max_parked_keys.
	// SealKey (checkpoint.signing_key_file's first) and PipelineKey (the
	// checkpoint's key) seal each parked record (park.Seal).
	Parked        *park.Set
	MaxParkedKeys int
	SealKey       []byte
	PipelineKey   string
	// OnPark, when set, is told of each key parked anew (exactly once:
	// its Kafka transaction commits at the next transaction boundary, so
	// that the checkpoint soon lists it).
	OnPark func()
	// DeadLettered counts the events sent to a dead-letter topic.
	DeadLettered *atomic.Int64
	Metrics      *metrics.Metrics
	Log          hclog.Logger

	counters metrics.EventCounters
	filtered map[*outbox.Source]prometheus.Counter // leaveOut's, by table
	// parkedDirty: a parked record was produced since NoteParked.
	parkedDirty bool
	// unnoted counts the keys parked anew since NoteParked attached the
	// list: those of the transaction being read (FullError.Unsaved).
	unnoted int
}

// Send routes ev's record and produces it in transaction tx, or applies
// the source's on_invalid policy when it cannot be delivered as
// configured; an event of a parked key goes behind its parking, valid or
// not. ctx bounds the admin and registry calls it makes.
func (s *Sender) Send(ctx context.Context, tx *delivery.Txn, m *decode.Message) error {
	ev := &m.Event
	rec, key, err := s.record(ctx, m)
	if errors.Is(err, route.ErrFiltered) {
		return s.leaveOut(ev)
	}
	if err != nil && !invalid(err) {
		return err // a registry that cannot answer: retried, never dead-lettered
	}
	if s.Held != nil && s.Held(ev, key) {
		return nil
	}
	if err == nil {
		if s.Suffix != "" {
			rec.Topic += s.Suffix
		}
		if s.Parked.Len() == 0 {
			// The hot path: the gate, then the producer.
			if err = s.produce(ctx, tx, rec, ev, KindEvent); err == nil || !invalid(err) {
				return err
			}
		} else if err = s.admit(ctx, rec, KindEvent, ev); err != nil && !invalid(err) {
			return err
		}
		if err != nil {
			rec = nil
		}
	}
	if p := s.Parked.Parked(key); p != nil && len(key) > 0 {
		return s.parkBehind(ctx, tx, ev, rec, err, p)
	}
	if err == nil {
		return s.produce(ctx, tx, rec, ev, KindEvent)
	}
	return s.onInvalid(ctx, tx, ev, key, err)
}

// onInvalid applies ev's table's on_invalid to ev, invalid for cause (an
// *outbox.EventError): with fail it returns cause, which stops the
// connector, unless an operator chose with cdc skip to dead-letter it;
// with dead-letter it produces the dead letter, tracked like any event, so
// that its transaction is confirmed only once Kafka acked it; with park it
// parks ev's key.
func (s *Sender) onInvalid(ctx context.Context, tx *delivery.Txn, ev *outbox.Event, key []byte, cause error) error {
	switch {
	case ev.Source.OnInvalid == outbox.OnInvalidDeadLetter:
		return s.produceLetter(ctx, tx, ev, cause, "")
	case ev.Source.OnInvalid == outbox.OnInvalidPark && s.Parked != nil:
		return s.park(ctx, tx, ev, key, cause)
	case s.Skipped != nil && s.Skipped(ev):
		return s.produceLetter(ctx, tx, ev, cause, " (sent here by cdc skip)")
	}
	s.Metrics.InvalidEvents.Inc()
	return cause
}

// record builds m's Kafka record, with its key as routed (before a schema
// encodes it: the key a parking holds); an *outbox.EventError when m is
// invalid. An invalid event's key is worked out only where it could be
// parked.
func (s *Sender) record(ctx context.Context, m *decode.Message) (rec *kgo.Record, key []byte, err error) {
	if m.Invalid != nil { // not error(m.Invalid): a nil pointer would be a non-nil error
		return nil, s.parkingKey(&m.Event), m.Invalid
	}
	rec, err = s.Router.Record(&m.Event)
	if err != nil {
		if errors.Is(err, route.ErrFiltered) {
			return nil, nil, err
		}
		return nil, s.parkingKey(&m.Event), err
	}
	key = rec.Key
	if err = s.Schemas.Apply(ctx, rec, &m.Event, s.Blocking); err != nil {
		return nil, key, err
	}
	return rec, key, nil
}

// parkingKey is ev's record key, where it could be parked or held back: on
// a parking table, or with a key parked.
func (s *Sender) parkingKey(ev *outbox.Event) []byte {
	if s.Parked == nil || (s.Parked.Len() == 0 && ev.Source.OnInvalid != outbox.OnInvalidPark) {
		return nil
	}
	key, err := s.Router.Key(ev)
	if err != nil {
		return nil
	}
	return key
}

// produceLetter produces ev's dead letter, for cause; note follows the
// reason.
func (s *Sender) produceLetter(ctx context.Context, tx *delivery.Txn, ev *outbox.Event, cause error, note string) error {
	rec, err := s.letter(ev, cause, note)
	if err != nil {
		return err
	}
	if s.Suffix != "" {
		rec.Topic += s.Suffix
	}
	if err := s.produce(ctx, tx, rec, ev, KindDeadLetter); err != nil {
		if invalid(err) {
			// The dead-letter topic itself refuses it (a name the brokers
			// refuse, the checkpoint topic): the configuration's problem,
			// which stops the connector with both reasons.
			return fmt.Errorf("%w; and its dead letter cannot be written: %v", cause, errtext.OneLine(err))
		}
		return err
	}
	return nil
}

// letter is ev's dead-letter record, for cause; note follows the reason.
// It counts and logs nothing: a redrive's --drop-first builds it in its
// check pass and again in its send pass, and produce notes a dead letter
// once, as it goes (noteLetter).
//
// A dead letter cut to fit is not the event whole; under the table's
// retention its row, the only whole copy, would be deleted once the letter
// is acknowledged, so letter refuses it and the connector stops on the
// event (docs/config.md, "Invalid events").
func (s *Sender) letter(ev *outbox.Event, cause error, note string) (*kgo.Record, error) {
	reason := cause.Error()
	var ee *outbox.EventError
	if errors.As(cause, &ee) {
		reason = ee.Brief() // the reason, without what to do when stopping on it
	}
	reason += note
	rec := s.Router.DeadLetter(ev, reason)
	// Too large for the dead-letter topic too: the row's problem still,
	// so its dead letter keeps the reason and what fits (fit).
	return rec, s.fit(ev, rec)
}

// fit cuts ev's dead letter rec to its topic's limit, and refuses one cut
// where retention would delete ev's row, its only whole copy.
func (s *Sender) fit(ev *outbox.Event, rec *kgo.Record) error {
	route.TruncateDeadLetter(rec, s.Kafka.MaxMessageBytesOf(rec.Topic+s.Suffix), sink.RecordSize)
	if cut := header(rec, route.HeaderDeadLetterTruncated); cut != "" && ev.Source.Retention != nil {
		return errtext.Fatalf("%s event %s (lsn %s) is too large for its dead-letter topic %s (%s), and tables[].retention would delete its row, its only whole copy: raise kafka.dead_letter_max_message_bytes (and the topic's max.message.bytes), or take retention off the table, then start again",
			ev.Source.String(), ev.ID(), ev.CommitLSN.String(), rec.Topic, cut)
	}
	return nil
}

// noteLetter counts and logs dead letter rec of ev as it is produced.
func (s *Sender) noteLetter(ev *outbox.Event, rec *kgo.Record) {
	s.Metrics.InvalidEvents.Inc()
	if cut := header(rec, route.HeaderDeadLetterTruncated); cut != "" {
		s.Log.Warn("a dead letter was larger than kafka.dead_letter_max_message_bytes: its payload is cut", "source", ev.Source.String(), "id", ev.ID(), "kept", cut)
	}
	s.DeadLettered.Add(1)
	s.Metrics.DeadLetter(ev.Source.String())
	s.Log.Warn("event sent to the dead-letter topic", "source", ev.Source.String(), "id", ev.ID(), "lsn", ev.CommitLSN.String(), "topic", rec.Topic, "error", header(rec, route.HeaderDeadLetterError))
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
