package relay

import (
	"context"
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/sink"
)

// What a table's expressions (package expr) ask of the relay: an event its
// filter leaves out is counted and not produced, and a record pinned to a
// partition must name one its topic has.

// leaveOut counts ev, which its table's filter left out. Nothing is
// produced or tracked for it: its transaction resolves with the events
// around it (an empty one folds into the one it waits behind, rule 22),
// so the slot and the checkpoint pass it, and retention deletes its row
// with the others of its transaction.
func (s *Sender) leaveOut(ev *outbox.Event) error {
	c, ok := s.filtered[ev.Source]
	if !ok {
		if s.filtered == nil {
			s.filtered = map[*outbox.Source]prometheus.Counter{}
		}
		c = s.Metrics.Filtered(ev.Source.String())
		s.filtered[ev.Source] = c
	}
	c.Inc()
	if s.LeftOut != nil {
		s.LeftOut(ev)
	}
	if s.Log.IsTrace() {
		s.Log.Trace("event left out by the table's filter", "source", ev.Source.String(), "id", ev.ID(), "lsn", ev.CommitLSN.String())
	}
	return nil
}

// checkPartition makes sure rec, pinned to a partition by its table's
// expression, names one its topic has: a partition past the end would fail
// in the producer and stop the session, so it is the event's problem
// instead, for on_invalid. The topic is made first, if new, to count its
// partitions; a name the brokers refuse is the event's problem too.
func (s *Sender) checkPartition(ctx context.Context, rec *kgo.Record, ev *outbox.Event) error {
	topic := rec.Topic + s.Suffix
	if !s.Kafka.TopicKnown(topic) {
		err := s.Blocking(func() error { return s.Kafka.EnsureTopic(ctx, topic) })
		var refused *sink.TopicRefusedError
		if errors.As(err, &refused) {
			return outbox.Invalid(ev, "%v; fix the row's routing fields or the table's topic expression", err)
		}
		if err != nil {
			return err
		}
	}
	n, ok := s.Kafka.KnownPartitions(topic, rec.Partition)
	if !ok {
		err := s.Blocking(func() (err error) {
			n, err = s.Kafka.Partitions(ctx, topic, rec.Partition)
			return err
		})
		if err != nil {
			return err
		}
	}
	if rec.Partition >= n {
		return outbox.Invalid(ev, "its expressions.partition (%s) gave %d, but topic %q has %d partitions (0 to %d); fix the row, or the expression",
			ev.Source.Programs.Partition.Text, rec.Partition, topic, n, n-1)
	}
	return nil
}
