package relay

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
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
// event of a table with on_invalid: park parks its key, and every later
// event of the key, of any table, valid or not, follows it to the parked
// topic, numbered and sealed, each tracked like any event in its
// transaction, whose checkpoint notes the parked keys (NoteParked).

// FullError is an invalid event that would park one key more than
// max_parked_keys: the connector stops on it, as on_invalid: fail does.
type FullError struct {
	Cause *outbox.EventError
	Max   int
	Bytes bool // the keys fill their share of the checkpoint record (park.ErrFullBytes)
	// Unsaved is how many of the keys parked were parked by this event's
	// own transaction: no checkpoint lists them before it ends, and every
	// start reads it again and parks them again, so no redrive reaches
	// them (TestMaxParkedKeysWithinOneTransaction).
	Unsaved int
}

func (e *FullError) Error() string {
	what := fmt.Sprintf("max_parked_keys (%d) keys are parked already, so this one stops the connector instead", e.Max)
	raise := "raise max_parked_keys"
	if e.Bytes {
		what = fmt.Sprintf("the %d parked keys fill their share of the checkpoint record (half of kafka.max_message_bytes, or of the checkpoint topic's), so this one stops the connector instead", e.Max)
		raise = "raise kafka.max_message_bytes"
	}
	switch {
	case e.Unsaved > 0 && e.Unsaved >= e.Max:
		return fmt.Sprintf("%s; %s, all of them parked by this event's own transaction, which every start reads again (no checkpoint lists them before it ends), so no redrive reaches them: %s above %d, or send this event to the dead-letter topic (cdc skip)", e.Cause.Brief(), what, raise, e.Max)
	case e.Unsaved > 0:
		return fmt.Sprintf("%s; %s, %d of them by this event's own transaction, which every start reads again and parks again: redrive one of the %d parked before it (cdc parked lists them, cdc redrive sends them on; the connector takes the request as it starts again), %s, or send this event to the dead-letter topic (cdc skip)", e.Cause.Brief(), what, e.Unsaved, e.Max-e.Unsaved, raise)
	}
	return fmt.Sprintf("%s; %s: redrive parked keys (cdc parked lists them, cdc redrive sends them on; the connector takes the request as it starts again), %s, or send this event to the dead-letter topic (cdc skip)", e.Cause.Brief(), what, raise)
}
func (e *FullError) Unwrap() error { return e.Cause }

// OutgrownError is an event of a parked key that cannot join its parking:
// the parked keys' entries fill their share of the checkpoint record, and
// each session that parks an event of a key adds a run to its entry. Its
// remedies make room: cdc skip would let this one event by, out of its
// key's order, and the key's next one would stop here again, so it is not
// offered (the attack on issue 53; TestParkedKeyOutgrowingItsShareHasARemedy).
type OutgrownError struct {
	Cause *outbox.EventError
	Key   string
}

func (e *OutgrownError) Error() string {
	return fmt.Sprintf("%s; the connector stops here and nothing past this transaction is confirmed. To go on, redrive the key (cdc redrive --key %s, with --drop-first if its first event is invalid still; asked while the connector is stopped, it runs as it starts again) or other parked keys (cdc parked lists them), or raise kafka.max_message_bytes, then start again",
		e.Cause.Brief(), park.ShellQuote(e.Key))
}
func (e *OutgrownError) Unwrap() error { return e.Cause }

// park applies on_invalid: park to ev, invalid for cause: its key is
// parked, and it goes to the parked topic first, with the reason. An
// event without a key cannot be parked: on_invalid_unkeyed decides. An
// event an operator chose to skip (cdc skip) goes to the dead-letter topic
// instead, and parks nothing.
func (s *Sender) park(ctx context.Context, tx *delivery.Txn, ev *outbox.Event, key []byte, cause error) error {
	skipped := s.Skipped != nil && s.Skipped(ev)
	switch {
	case skipped:
		return s.produceLetter(ctx, tx, ev, cause, " (sent here by cdc skip)")
	case len(key) == 0 && ev.Source.OnInvalidUnkeyed == outbox.OnInvalidDeadLetter:
		return s.produceLetter(ctx, tx, ev, cause, " (on_invalid_unkeyed: an event without a key cannot be parked)")
	case len(key) == 0:
		s.Metrics.InvalidEvents.Inc()
		return cause
	}
	var ee *outbox.EventError
	errors.As(cause, &ee)
	reason := errtext.OneLine(cause)
	if ee != nil {
		reason = ee.Brief()
	}
	dest, err := s.Router.Topic(ev)
	if err != nil {
		dest = park.TableDest(ev.Source.String())
	}
	first := park.First{Table: ev.Source.String(), Dest: dest, Key: string(key), Reason: reason, ID: ev.ID(), Sum: contentSum(ev), LSN: ev.CommitLSN, Since: ev.CommitTime,
		Topic: ev.Source.ParkedTopic}
	// The parking's records go to one partition, from an offset the
	// topic has reached now, so that its redrive reads them by offset.
	err = s.Blocking(func() (err error) {
		if err = s.Kafka.EnsureTopic(ctx, first.Topic); err != nil {
			return err
		}
		n, err := s.Kafka.Partitions(ctx, first.Topic, 0)
		if err != nil {
			return err
		}
		h := fnv.New32a()
		h.Write(key)
		first.Partition = int32(h.Sum32() % uint32(n))
		first.Start, err = s.Kafka.EndOffset(ctx, first.Topic, first.Partition)
		return err
	})
	if err != nil {
		return fmt.Errorf("the parked topic %q: %w", first.Topic, err)
	}
	p, err := s.Parked.Park(first)
	switch {
	case errors.Is(err, park.ErrFull) && ee != nil:
		s.Metrics.InvalidEvents.Inc()
		return &FullError{Cause: ee, Max: s.MaxParkedKeys, Unsaved: s.unnoted}
	case errors.Is(err, park.ErrFullBytes) && ee != nil:
		s.Metrics.InvalidEvents.Inc()
		return &FullError{Cause: ee, Max: s.Parked.Len(), Bytes: true, Unsaved: s.unnoted}
	case err != nil:
		return err
	}
	s.Metrics.InvalidEvents.Inc()
	if err := s.parkEvent(ctx, tx, ev, cause, reason, p, true); err != nil {
		s.Parked.Unpark(p)
		return err
	}
	s.unnoted++
	s.Log.Warn("parked a key: this event and the key's later events go to the parked topic until cdc redrive sends them on",
		"source", ev.Source.String(), "key", string(key), "topic", dest, "id", ev.ID(), "lsn", ev.CommitLSN.String(), "parked_topic", p.Topic, "error", reason)
	if s.OnPark != nil {
		s.OnPark()
	}
	return nil
}

// parkEvent sends ev, invalid for reason, to p's parked topic in its
// event form (HeaderEvent), which a redrive routes again: its key's
// parking's first (first), or an invalid event behind it. It does not fit
// the parked topic: an error, or with cdc skip, its dead letter.
func (s *Sender) parkEvent(ctx context.Context, tx *delivery.Txn, ev *outbox.Event, cause error, reason string, p *checkpoint.Parked, first bool) error {
	rec := s.Router.DeadLetter(ev, reason)
	// The event, to be routed again at its redrive; its payload is the
	// record's value, unless the value is not the payload: a message's
	// whole content, or a NULL payload (a value is never NULL).
	saved := *ev
	kept := ev.Raw != nil || ev.Fields[outbox.FieldPayload].Null()
	if !kept {
		saved.Fields[outbox.FieldPayload] = outbox.Value{Kind: ev.Fields[outbox.FieldPayload].Kind}
	}
	saved.Raw = nil
	rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: park.HeaderEvent, Value: park.EncodeEvent(&saved, kept)})
	if !first {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: park.HeaderBehind, Value: []byte(p.First)})
	}
	return s.produceParked(ctx, tx, ev, rec, p, cause)
}

// parkBehind sends ev, whose key is parked in p, behind p's first event:
// its record, rec, as it would have been, or, when it is invalid itself
// (cause; rec nil), its event form.
func (s *Sender) parkBehind(ctx context.Context, tx *delivery.Txn, ev *outbox.Event, rec *kgo.Record, cause error, p *checkpoint.Parked) error {
	if p.Read && ev.ID() == p.First && ev.Source.String() == p.Table && (ev.XID == 0 || ev.CommitTime.Before(p.Since)) &&
		(p.FirstSum == 0 || p.FirstSum == contentSum(ev)) {
		// The parking's first event again: a row committed after the slot
		// while a first start was interrupted is sent by the backfill that
		// continues it (a snapshot of now) and again by the stream. Parked
		// twice, its copy would be first after cdc redrive --drop-first
		// dropped it, and the key would stay parked on the event dropped.
		// A backfill that resumes reads it again too. Only copies of a row
		// a backfill read: the stream's of one committed before it read it
		// (an event that reuses the id later is another), or a read's, and
		// only with the first's content: a table dropped and created again
		// restarts its ids, and the repair read a later event of the key
		// under the first's id, which was dropped here
		// (TestRepairRowReusesTheFirstsID).
		s.Log.Debug("the parking's first event met again (a backfill's row the stream sends too): parked once", "key", p.Key, "id", p.First)
		return nil
	}
	if rec == nil {
		reason := errtext.OneLine(cause)
		var ee *outbox.EventError
		if errors.As(cause, &ee) {
			reason = ee.Brief()
		}
		s.Metrics.InvalidEvents.Inc()
		return s.parkEvent(ctx, tx, ev, cause, reason, p, false)
	}
	parked := &kgo.Record{Key: rec.Key, Value: rec.Value, Timestamp: rec.Timestamp,
		Headers: append(append(make([]kgo.RecordHeader, 0, len(rec.Headers)+10), rec.Headers...),
			kgo.RecordHeader{Key: route.HeaderDeadLetterTopic, Value: []byte(rec.Topic)},
			kgo.RecordHeader{Key: route.HeaderDeadLetterSource, Value: []byte(ev.Source.String())},
			kgo.RecordHeader{Key: route.HeaderDeadLetterID, Value: []byte(ev.ID())},
			kgo.RecordHeader{Key: park.HeaderBehind, Value: []byte(p.First)})}
	if sink.Pinned(rec) {
		parked.Headers = append(parked.Headers, kgo.RecordHeader{Key: park.HeaderPartition, Value: strconv.AppendInt(nil, int64(rec.Partition), 10)})
	}
	return s.produceParked(ctx, tx, ev, parked, p, nil)
}

// produceParked produces rec, one more record of parking p, to p's topic
// and partition, numbered and sealed, and counts it in p. cause is why ev
// is invalid, or nil. A record that does not fit the parked topic cannot
// be parked: ev is dead-lettered where an operator chose so with cdc skip,
// and otherwise stops the connector.
func (s *Sender) produceParked(ctx context.Context, tx *delivery.Txn, ev *outbox.Event, rec *kgo.Record, p *checkpoint.Parked, cause error) error {
	skipped := s.Skipped != nil && s.Skipped(ev)
	if cause == nil {
		cause = outbox.Invalid(ev, "its key is parked")
	}
	run, n, err := s.Parked.Number(p)
	if errors.Is(err, park.ErrFullBytes) {
		if skipped {
			return s.produceLetter(ctx, tx, ev, cause, " (sent here by cdc skip)")
		}
		return &OutgrownError{Cause: outbox.Invalid(ev, "its key %q is parked, and the parked keys fill their share of the checkpoint record (each session that parks one of a key's events adds to the key's entry), so it cannot be parked", p.Key), Key: p.Key}
	}
	if gone, err := s.partitionGone(ctx, p); err != nil || gone {
		if err == nil {
			err = outbox.Invalid(ev, "its key %q is parked on partition %d of the parked topic %q, which the topic no longer has (it was made again?): the parking's records are gone, so no more can join it; send what is left and un-park the key with cdc redrive --key %s --accept-gap (a redrive asked while the connector is stopped runs as it starts again), or rewind to the parking's start (cdc rewind --to-lsn %s)",
				p.Key, p.Partition, p.Topic, park.ShellQuote(p.Key), p.FirstLSN)
		}
		return err
	}
	rec.Topic = p.Topic
	sink.Pin(rec, p.Partition)
	rec.Headers = append(rec.Headers,
		kgo.RecordHeader{Key: park.HeaderEpisode, Value: []byte(p.Episode)},
		kgo.RecordHeader{Key: park.HeaderSeq, Value: park.Seq(run, n)},
		kgo.RecordHeader{Key: park.HeaderLSN, Value: []byte(ev.CommitLSN.String())})
	// A WAL transaction's XID is never 0 (InvalidTransactionId): an event
	// without one is a row a backfill or a repair read from the table.
	read := ev.XID == 0
	if read {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: park.HeaderRead, Value: []byte("1")})
	}
	park.Seal(rec, s.SealKey, s.PipelineKey)
	err = s.produce(ctx, tx, rec, ev, KindParked)
	if invalid(err) {
		if skipped {
			return s.produceLetter(ctx, tx, ev, cause, " (sent here by cdc skip)")
		}
		return fmt.Errorf("%w; and it cannot be parked: %v; raise kafka.dead_letter_max_message_bytes (the parked topic's limit), or send it to the dead-letter topic with cdc skip", cause, errtext.OneLine(err))
	}
	if err != nil {
		return err
	}
	s.Parked.Count(p, n, read)
	s.parkedDirty = true
	s.Metrics.Parked(ev.Source.String(), s.Parked.Len())
	return nil
}

// partitionGone reports whether p's parked topic no longer has the
// partition its records go to: the topic was made again with fewer.
func (s *Sender) partitionGone(ctx context.Context, p *checkpoint.Parked) (bool, error) {
	if !s.Kafka.TopicKnown(p.Topic) {
		if err := s.Blocking(func() error { return s.Kafka.EnsureTopic(ctx, p.Topic) }); err != nil {
			return false, err
		}
	}
	n, ok := s.Kafka.KnownPartitions(p.Topic, p.Partition)
	if !ok {
		if err := s.Blocking(func() (err error) { n, err = s.Kafka.Partitions(ctx, p.Topic, p.Partition); return err }); err != nil {
			return false, err
		}
	}
	return p.Partition >= n, nil
}

// NoteParked attaches the parked keys to tx when a record was parked since
// the last note: the session calls it before each transaction's commit,
// so that the checkpoint of tx's end lists every record parked up to it.
func (s *Sender) NoteParked(tx *delivery.Txn) {
	if s.parkedDirty && s.Parked != nil && tx != nil {
		s.Tracker.NoteParked(tx, s.Parked.List())
		s.parkedDirty, s.unnoted = false, 0
	}
}

// ParkedChanged tells the sender the parked keys changed (a redrive), for
// the next NoteParked.
func (s *Sender) ParkedChanged() { s.parkedDirty = true }

// parkedSource is the table of tables named name, a parked record's
// source, in parking p: by its name now, or by one it had before the
// configuration followed a rename (known, the checkpoint's tables).
func parkedSource(p *checkpoint.Parked, name string, tables []*outbox.Source, known map[string]checkpoint.Table) (*outbox.Source, error) {
	for _, t := range tables {
		if t.String() == name {
			return t, nil
		}
	}
	for _, t := range tables {
		if slices.Contains(known[t.String()].Names, name) {
			return t, nil
		}
	}
	return nil, errtext.Fatalf("key %q is parked with an event of table %s, which the configuration no longer has; configure the table again to redrive it", p.Key, name)
}

// Redriven is what parked record r, of parking p, becomes at its redrive
// (package redrive): the record to produce, its kind, and its event (as
// far as the gate and the metrics need one); nil, with ev, when its
// table's filter leaves it out now. still is why it is invalid yet (nil:
// it may go): the gate's answer included. drop makes an event-form record
// its dead letter instead (cdc redrive --drop-first). known are the
// checkpoint's tables, whose former names find a renamed table's records.
func (s *Sender) Redriven(ctx context.Context, p *checkpoint.Parked, r *kgo.Record, tables []*outbox.Source, known map[string]checkpoint.Table, drop bool) (rec *kgo.Record, kind Kind, ev *outbox.Event, still, err error) {
	src, err := parkedSource(p, header(r, route.HeaderDeadLetterSource), tables, known)
	if err != nil {
		return nil, 0, nil, nil, err
	}
	saved := header(r, park.HeaderEvent)
	if saved == "" {
		return s.redrivenRecord(ctx, r, src, drop)
	}
	e, kept, err := park.DecodeEvent([]byte(saved), src)
	if err != nil {
		return nil, 0, nil, nil, errtext.Fatalf("%v", err)
	}
	ev = &e
	if !kept {
		ev.Fields[outbox.FieldPayload].B = r.Value
		if ev.Fields[outbox.FieldPayload].B == nil {
			ev.Fields[outbox.FieldPayload].B = []byte{}
		}
	}
	if drop {
		if rec, err = s.letter(ev, errors.New(header(r, route.HeaderDeadLetterError)), " (sent here by cdc redrive --drop-first)"); err != nil {
			return nil, 0, ev, nil, err
		}
		kind = KindDeadLetter
	} else {
		var m = decode.Message{Kind: decode.KindEvent, Event: *ev}
		rec, _, err = s.record(ctx, &m)
		if errors.Is(err, route.ErrFiltered) {
			return nil, 0, ev, nil, nil
		}
		if err != nil {
			if invalid(err) {
				return nil, 0, ev, err, nil
			}
			return nil, 0, ev, nil, err
		}
		kind = KindEvent
	}
	if err := s.admit(ctx, rec, kind, ev); err != nil {
		if invalid(err) {
			return nil, 0, ev, err, nil
		}
		return nil, 0, ev, nil, err
	}
	return rec, kind, ev, nil, nil
}

// SendRedriven produces rec, of kind, a redriven record of ev (Redriven),
// in tx; a nil rec is an event its filter leaves out now.
func (s *Sender) SendRedriven(ctx context.Context, tx *delivery.Txn, rec *kgo.Record, kind Kind, ev *outbox.Event) error {
	if rec == nil {
		return s.leaveOut(ev)
	}
	return s.produce(ctx, tx, rec, ev, kind)
}

// redrivenRecord is Redriven of r, parked behind its parking's first in
// the form it would have been sent in, of table src.
func (s *Sender) redrivenRecord(ctx context.Context, r *kgo.Record, src *outbox.Source, drop bool) (rec *kgo.Record, kind Kind, ev *outbox.Event, still, err error) {
	// Behind the first: the record it would have been.
	rec = &kgo.Record{Topic: header(r, route.HeaderDeadLetterTopic), Key: r.Key, Value: r.Value, Timestamp: r.Timestamp}
	ours := park.Ours(r, route.HeaderDeadLetterTopic, route.HeaderDeadLetterSource, route.HeaderDeadLetterID, park.HeaderBehind,
		park.HeaderEpisode, park.HeaderSeq, park.HeaderLSN, park.HeaderSeal, park.HeaderPartition)
	for i, h := range r.Headers {
		switch {
		case !ours[i]:
			rec.Headers = append(rec.Headers, h) // the record's own
		case h.Key == park.HeaderPartition:
			if n, err := strconv.ParseInt(string(h.Value), 10, 32); err == nil {
				sink.Pin(rec, int32(n))
			}
		}
	}
	ev = &outbox.Event{Source: src, CommitTime: r.Timestamp}
	ev.Fields[outbox.FieldID] = outbox.Value{B: []byte(header(r, route.HeaderDeadLetterID)), Kind: outbox.KindText}
	if lsn, err := pglogrepl.ParseLSN(header(r, park.HeaderLSN)); err == nil {
		ev.CommitLSN = lsn
	}
	var why error = outbox.Invalid(ev, "its parked record (offset %d) names no topic", r.Offset)
	if rec.Topic != "" {
		why = s.admit(ctx, rec, KindEvent, ev)
	}
	switch {
	case why == nil:
		return rec, KindEvent, ev, nil, nil
	case !invalid(why):
		return nil, 0, ev, nil, why
	case drop:
		// Valid when parked, invalid now (a lower limit, a topic
		// refused): cdc redrive --drop-invalid's dead letter.
		rec, err = s.recordLetter(rec, ev, why)
		return rec, KindDeadLetter, ev, nil, err
	}
	return nil, 0, ev, why, nil
}

// recordLetter is the dead letter of rec, a parked record of event ev in
// the form it would have been sent in, invalid for cause at its redrive:
// the record with the dead-letter headers, cut to fit as letter's.
func (s *Sender) recordLetter(rec *kgo.Record, ev *outbox.Event, cause error) (*kgo.Record, error) {
	reason := errtext.OneLine(cause)
	var ee *outbox.EventError
	if errors.As(cause, &ee) {
		reason = ee.Brief()
	}
	dl := &kgo.Record{Topic: ev.Source.DeadLetterTopic, Key: rec.Key, Value: rec.Value, Timestamp: rec.Timestamp,
		Headers: append(slices.Clone(rec.Headers),
			kgo.RecordHeader{Key: route.HeaderDeadLetterTopic, Value: []byte(rec.Topic)},
			kgo.RecordHeader{Key: route.HeaderDeadLetterError, Value: []byte(reason + " (sent here by cdc redrive --drop-invalid)")},
			kgo.RecordHeader{Key: route.HeaderDeadLetterSource, Value: []byte(ev.Source.String())},
			kgo.RecordHeader{Key: route.HeaderDeadLetterLSN, Value: []byte(ev.CommitLSN.String())},
			kgo.RecordHeader{Key: route.HeaderDeadLetterID, Value: []byte(ev.ID())})}
	return dl, s.fit(ev, dl)
}

// header is the value of the connector's header key on parked record r
// (park.Header).
func header(r *kgo.Record, key string) string { return park.Header(r, key) }

// CheckSquatted refuses to start when a topic only the connector writes
// (the checkpoint topic, a parked or dead-letter topic) cannot be created
// because another topic has its name to Kafka ('.' and '_' alike): made
// by a row before the gate compared names so, or by hand. Records that
// need it would otherwise fail one by one, or stop the connector later.
func CheckSquatted(ctx context.Context, k *sink.Kafka, checkpointTopic string, parked, deadLetter map[string]bool) error {
	what := map[string]string{checkpointTopic: "checkpoint.topic"}
	for t := range deadLetter {
		what[t] = "a table's dead_letter_topic"
	}
	for t := range parked {
		what[t] = "a table's parked_topic"
	}
	squatted := k.Squatted(ctx, slices.Sorted(maps.Keys(what)))
	if len(squatted) == 0 {
		return nil
	}
	t := slices.Sorted(maps.Keys(squatted))[0] // one line, the same at every start
	return &errtext.Fatal{Msg: fmt.Sprintf("kafka topic %q (%s) cannot be created: the topic %q exists, and Kafka takes '.' and '_' for the same character in topic names; delete %q once nothing needs it, or configure another name", t, what[t], squatted[t], squatted[t])}
}

// WarnParkedTopics warns of the parked topics of tables that exist and
// may lose records: one that deletes records after a time or a size, or
// compacts them; a parked event lives in its topic until it is redriven,
// and the connector creates its parked topics without either
// (config.ParkedTopicConfigs). A redrive that finds records missing
// refuses, and keeps the key parked.
func WarnParkedTopics(ctx context.Context, k *sink.Kafka, tables []*outbox.Source, log hclog.Logger) {
	topics := map[string]bool{}
	for _, t := range tables {
		if t.OnInvalid == outbox.OnInvalidPark {
			topics[t.ParkedTopic] = true
		}
	}
	for _, w := range k.Timed(ctx, slices.Sorted(maps.Keys(topics))) {
		log.Warn("the parked topic deletes records after a time: a parked event lives there until it is redriven, so set retention.ms=-1 on it (kafka-configs.sh --alter --add-config retention.ms=-1); a redrive that finds records missing keeps the key parked",
			"topic", w.Topic, "retention_ms", w.Ms)
	}
}

// contentSum hashes what tells an event from another that reuses its id:
// its aggregate id, type and payload (checkpoint.Parked.FirstSum).
func contentSum(ev *outbox.Event) uint64 {
	h := fnv.New64a()
	for _, f := range []outbox.Field{outbox.FieldAggregateID, outbox.FieldEventType, outbox.FieldPayload} {
		v := ev.Fields[f]
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(v.B)))
		h.Write(n[:])
		h.Write(v.B)
	}
	return h.Sum64()
}
