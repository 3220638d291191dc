package relay

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"github.com/hashicorp/go-hclog"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/delivery"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/sink"
)

// Parking (package park; docs/operations.md, "Parked keys"): an invalid
// event of a table with on_invalid: park parks its key, and the key's
// later events follow it to the parked topic, each tracked like any
// event, in its transaction, whose checkpoint notes the parked keys.

// FullError is an invalid event that would park one key more than
// max_parked_keys: the connector stops on it, as on_invalid: fail does.
type FullError struct {
	Cause *outbox.EventError
	Max   int
	Bytes bool // the keys fill their share of the checkpoint record (park.ErrFullBytes)
}

func (e *FullError) Error() string {
	if e.Bytes {
		return fmt.Sprintf("%s; the %d parked keys fill their share of the checkpoint record (half of kafka.max_message_bytes, or of the checkpoint topic's), so this one stops the connector instead: redrive parked keys (cdc parked, cdc redrive) or raise kafka.max_message_bytes, and start it again", e.Cause.Brief(), e.Max)
	}
	return fmt.Sprintf("%s; max_parked_keys (%d) keys are parked already, so this one stops the connector instead: redrive parked keys (cdc parked, cdc redrive) or raise max_parked_keys, and start it again", e.Cause.Brief(), e.Max)
}
func (e *FullError) Unwrap() error { return e.Cause }

// park applies on_invalid: park to ev, invalid for cause: its key is
// parked and it goes to the parked topic, with the reason. An event
// without a key cannot be parked: on_invalid_unkeyed decides.
func (s *Sender) park(ctx context.Context, tx *delivery.Txn, ev *outbox.Event, cause error) error {
	var ee *outbox.EventError
	errors.As(cause, &ee)
	key, err := s.Router.Key(ev)
	if err != nil || len(key) == 0 || s.Parked == nil {
		// No key to hold back (or a replay, which parks nothing).
		if s.Parked != nil && ev.Source.OnInvalidUnkeyed == outbox.OnInvalidDeadLetter {
			return s.produceDeadLetter(ctx, tx, ev, cause)
		}
		return cause
	}
	dest, err := s.Router.Topic(ev)
	if err != nil {
		dest = park.TableDest(ev.Source.String())
	}
	reason := cause.Error()
	if ee != nil {
		reason = ee.Brief()
	}
	s.Metrics.InvalidEvents.Inc()
	rec := s.Router.DeadLetter(ev, reason)
	// The event, to be routed again at its redrive; its payload is the
	// record's value.
	saved := *ev
	saved.Fields[outbox.FieldPayload] = outbox.Value{Kind: ev.Fields[outbox.FieldPayload].Kind}
	saved.Raw = nil
	p, err := s.Parked.Park(ev.Source.String(), dest, string(key), reason, ev.ID(), park.NewEpisode(), ev.Source.ParkedTopic, ev.CommitTime)
	if errors.Is(err, park.ErrFull) && ee != nil {
		return &FullError{Cause: ee, Max: s.MaxParkedKeys}
	}
	if errors.Is(err, park.ErrFullBytes) && ee != nil {
		return &FullError{Cause: ee, Max: s.Parked.Len(), Bytes: true}
	}
	if err != nil {
		return err
	}
	rec.Topic = p.Topic
	rec.Headers = append(rec.Headers,
		kgo.RecordHeader{Key: park.HeaderEpisode, Value: []byte(p.Episode)},
		kgo.RecordHeader{Key: park.HeaderEvent, Value: park.EncodeEvent(&saved)})
	if n := sink.RecordSize(rec); n > s.DeadLetterMaxMessageBytes {
		s.Parked.Unpark(p)
		return fmt.Errorf("%w; and it does not fit the parked topic either (%d bytes, more than kafka.dead_letter_max_message_bytes %d), so it cannot be parked: raise that, or send it to the dead-letter topic with cdc skip", cause, n, s.DeadLetterMaxMessageBytes)
	}
	s.Log.Warn("parked a key: this event and the key's later events go to the parked topic until cdc redrive sends them on",
		"source", ev.Source.String(), "key", string(key), "topic", dest, "id", ev.ID(), "lsn", ev.CommitLSN.String(), "parked_topic", p.Topic, "error", errtext.OneLine(errors.New(reason)))
	return s.produceParked(ctx, tx, ev, rec, p)
}

// parkBehind sends rec, ev's record, to the parked topic of p, the
// parking of its key, behind p's first event.
func (s *Sender) parkBehind(ctx context.Context, tx *delivery.Txn, ev *outbox.Event, rec *kgo.Record, p *checkpoint.Parked) error {
	parked := &kgo.Record{Topic: p.Topic, Key: rec.Key, Value: rec.Value, Timestamp: rec.Timestamp,
		Headers: append(append(make([]kgo.RecordHeader, 0, len(rec.Headers)+6), rec.Headers...),
			kgo.RecordHeader{Key: route.HeaderDeadLetterTopic, Value: []byte(rec.Topic)},
			kgo.RecordHeader{Key: route.HeaderDeadLetterSource, Value: []byte(ev.Source.String())},
			kgo.RecordHeader{Key: route.HeaderDeadLetterID, Value: []byte(ev.ID())},
			kgo.RecordHeader{Key: park.HeaderBehind, Value: []byte(p.First)},
			kgo.RecordHeader{Key: park.HeaderEpisode, Value: []byte(p.Episode)})}
	if sink.Pinned(rec) {
		parked.Headers = append(parked.Headers, kgo.RecordHeader{Key: park.HeaderPartition, Value: strconv.AppendInt(nil, int64(rec.Partition), 10)})
	}
	if n := sink.RecordSize(parked); n > s.DeadLetterMaxMessageBytes {
		return outbox.Invalid(ev, "its key is parked, and the record does not fit the parked topic (%d bytes, more than kafka.dead_letter_max_message_bytes %d); raise it", n, s.DeadLetterMaxMessageBytes)
	}
	return s.produceParked(ctx, tx, ev, parked, p)
}

// produceParked produces rec, one more event of parking p, to the parked
// topic, and notes the parked keys in tx.
func (s *Sender) produceParked(ctx context.Context, tx *delivery.Txn, ev *outbox.Event, rec *kgo.Record, p *checkpoint.Parked) error {
	if !s.Kafka.TopicKnown(rec.Topic) {
		if err := s.Blocking(func() error { return s.Kafka.EnsureTopic(ctx, rec.Topic) }); err != nil {
			return fmt.Errorf("the parked topic %q: %w", rec.Topic, err)
		}
	}
	p.Events++
	s.Tracker.NoteParked(tx, s.Parked.List())
	s.Metrics.Parked(ev.Source.String(), s.Parked.Len())
	s.produce(tx, rec, ev)
	return nil
}

// produceDeadLetter sends ev, invalid for cause and without a key to
// park, to its table's dead-letter topic (on_invalid_unkeyed).
func (s *Sender) produceDeadLetter(ctx context.Context, tx *delivery.Txn, ev *outbox.Event, cause error) error {
	rec, err := s.letter(ev, cause, " (on_invalid_unkeyed: an event without a key cannot be parked)")
	if err != nil {
		return err
	}
	if !s.Kafka.TopicKnown(rec.Topic) {
		if err := s.Blocking(func() error { return s.Kafka.EnsureTopic(ctx, rec.Topic) }); err != nil {
			return err
		}
	}
	s.produce(tx, rec, ev)
	return nil
}

// Redrive sends parking p's records, recs (read from its parked topic, in
// the order they were parked), on to the topics they were meant for, in
// tx: the first routed again from its event (or, with dropFirst, to the
// dead-letter topic), the others as the records they were, each once (a
// record parked twice, by a restart, is sent once). still is the first's
// error when it is invalid yet: nothing is sent then, and the key stays
// parked.
func (s *Sender) Redrive(ctx context.Context, tx *delivery.Txn, p *checkpoint.Parked, src *outbox.Source, recs []*kgo.Record, dropFirst bool) (sent int, still, err error) {
	done := map[string]bool{}
	for _, r := range recs {
		id := header(r, route.HeaderDeadLetterID)
		if done[id] {
			continue
		}
		rec, ev, still, err := s.redriven(ctx, p, src, r, dropFirst)
		if still != nil || err != nil {
			return sent, still, err
		}
		if rec == nil { // its table's filter leaves it out now
			done[id] = true
			_ = s.leaveOut(ev)
			continue
		}
		if !s.Kafka.TopicKnown(rec.Topic) {
			if err := s.Blocking(func() error { return s.Kafka.EnsureTopic(ctx, rec.Topic) }); err != nil {
				return sent, nil, err
			}
		}
		s.produce(tx, rec, ev)
		done[id] = true
		sent++
	}
	return sent, nil, nil
}

// redriven is the record parked record r becomes at its redrive, and its
// event (as far as metrics need one).
func (s *Sender) redriven(ctx context.Context, p *checkpoint.Parked, src *outbox.Source, r *kgo.Record, dropFirst bool) (*kgo.Record, *outbox.Event, error, error) {
	saved := header(r, park.HeaderEvent)
	if saved == "" {
		// Behind the first: the record it would have been.
		rec := &kgo.Record{Topic: header(r, route.HeaderDeadLetterTopic), Key: r.Key, Value: r.Value, Timestamp: r.Timestamp}
		for _, h := range r.Headers {
			switch h.Key {
			case route.HeaderDeadLetterTopic, route.HeaderDeadLetterSource, route.HeaderDeadLetterID, park.HeaderBehind, park.HeaderEpisode:
			case park.HeaderPartition:
				if n, err := strconv.ParseInt(string(h.Value), 10, 32); err == nil {
					sink.Pin(rec, int32(n))
				}
			default:
				rec.Headers = append(rec.Headers, h)
			}
		}
		if rec.Topic == "" {
			return nil, nil, nil, fmt.Errorf("a record in parked topic %q (offset %d) names no topic; it was not written by the connector", r.Topic, r.Offset)
		}
		return rec, &outbox.Event{Source: src, CommitTime: r.Timestamp}, nil, nil
	}
	ev, err := park.DecodeEvent([]byte(saved), src)
	if err != nil {
		return nil, nil, nil, err
	}
	ev.Fields[outbox.FieldPayload].B = r.Value
	if ev.Fields[outbox.FieldPayload].B == nil {
		ev.Fields[outbox.FieldPayload].B = []byte{}
	}
	if dropFirst {
		rec, err := s.letter(&ev, errors.New(p.Reason), " (sent here by cdc redrive --drop-first)")
		return rec, &ev, nil, err
	}
	rec, err := s.record(ctx, &decode.Message{Kind: decode.KindEvent, Event: ev})
	if errors.Is(err, route.ErrFiltered) {
		return nil, &ev, nil, nil
	}
	if errors.As(err, new(*outbox.EventError)) {
		return nil, nil, err, nil
	}
	return rec, &ev, nil, err
}

// header is the value of r's header key, or "".
func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// WarnTimedParked warns of the parked topics of tables that exist and
// delete records after a time: a parked event lives in its topic until it
// is redriven, and the connector creates its parked topics without a
// retention (config.ParkedTopicConfigs).
func WarnTimedParked(ctx context.Context, k *sink.Kafka, tables []*outbox.Source, log hclog.Logger) {
	topics := map[string]bool{}
	for _, t := range tables {
		if t.OnInvalid == outbox.OnInvalidPark {
			topics[t.ParkedTopic] = true
		}
	}
	for _, w := range k.Timed(ctx, slices.Sorted(maps.Keys(topics))) {
		log.Warn("the parked topic deletes records after a time: a parked event lives there until it is redriven, so set retention.ms=-1 on it (kafka-configs.sh --alter --add-config retention.ms=-1)",
			"topic", w.Topic, "retention_ms", w.Ms)
	}
}
