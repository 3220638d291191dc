package relay

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/outbox"
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

// checkPartition makes sure rec, pinned to a partition (by its table's
// expression, or a parking), names one its topic has, which admit made: a
// partition past the end would fail in the producer and stop the session,
// so it is the event's problem instead, for on_invalid.
func (s *Sender) checkPartition(ctx context.Context, rec *kgo.Record, ev *outbox.Event) error {
	n, ok := s.Kafka.KnownPartitions(rec.Topic, rec.Partition)
	if !ok {
		err := s.Blocking(func() (err error) {
			n, err = s.Kafka.Partitions(ctx, rec.Topic, rec.Partition)
			return err
		})
		if err != nil {
			return err
		}
	}
	if rec.Partition >= n {
		what := "a partition"
		if x := ev.Source.Programs; x != nil && x.Partition != nil {
			what = fmt.Sprintf("its expressions.partition (%s) gave", x.Partition.Text)
		}
		return outbox.Invalid(ev, "%s %d, but topic %q has %d partitions (0 to %d); fix the row, or the expression",
			what, rec.Partition, rec.Topic, n, n-1)
	}
	return nil
}
