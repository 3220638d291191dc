package pipeline

// Exactly-once delivery is delivery.Committer's (docs/design.md,
// "Exactly-once"); the pipeline creates the session's
// transactional producer, which fences any other instance, and tells a
// fenced instance from a failed one.

import (
	"context"
	"fmt"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/delivery"
	"github.com/outboxcdc/cdc/internal/sink"
	"github.com/outboxcdc/cdc/internal/wal"
)

// fence creates the session's transactional producer and fences any other
// instance of the pipeline, before the checkpoint is read.
func (p *Pipeline) fence(ctx context.Context, sys wal.System, opening *checkpoint.Opening) (*sink.Kafka, error) {
	if err := p.openStore(ctx, opening); err != nil {
		return nil, err
	}
	kcfg := p.cfg.Producer()
	kcfg.TransactionalID = delivery.TransactionalID(p.cfg.Postgres.Slot, sys.ID)
	k, err := sink.New(kcfg, p.log.Named("kafka"), p.kafkaOpts()...)
	if err != nil {
		return nil, err
	}
	key, v := delivery.FenceRecord(p.cfg.Postgres.Slot, sys.ID)
	fctx, cancel := context.WithTimeout(ctx, 2*kcfg.TransactionTimeout)
	defer cancel()
	if err := k.Fence(fctx, p.cfg.Checkpoint.Topic, key, v); err != nil {
		k.Close()
		return nil, fmt.Errorf("exactly-once: take over transactional id %q: %w", kcfg.TransactionalID, err)
	}
	p.log.Info("exactly-once: this instance holds the transactional id; any other is fenced", "transactional_id", kcfg.TransactionalID)
	return k, nil
}
