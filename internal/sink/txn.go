package sink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Exactly-once delivery (docs/design.md, "Exactly-once") makes the
// producer transactional: Config.TransactionalID set, every record is
// produced inside a Kafka transaction that the pipeline begins and commits
// at Postgres transaction boundaries, with the checkpoint record in it.

// DefaultTransactionTimeout is how long the broker lets a transaction stay
// open before it aborts it. A Postgres transaction larger than one commit's
// worth must stream within it.
const DefaultTransactionTimeout = time.Minute

// FencedError says another producer with the same transactional id, a
// second instance of the pipeline, has taken over: this one must stop
// without committing.
type FencedError struct {
	TransactionalID string
	Err             error
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("fenced: another instance of this pipeline took over (transactional id %q: %v); this one stops without committing, and the one running goes on", e.TransactionalID, e.Err)
}

func (e *FencedError) Unwrap() error { return e.Err }

// fenced reports whether err means that a newer producer with our
// transactional id exists.
func fenced(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) ||
		errors.Is(err, kerr.TransactionalIDNotFound) || errors.Is(err, kerr.InvalidProducerIDMapping)
}

// txnError wraps a transaction error, as a *FencedError when it is one.
func (k *Kafka) txnError(what string, err error) error {
	if err == nil {
		return nil
	}
	if fenced(err) {
		return &FencedError{TransactionalID: k.cfg.TransactionalID, Err: err}
	}
	return fmt.Errorf("%s kafka transaction: %w", what, err)
}

// TransactionTimeout is how long the broker lets a transaction stay open.
func (k *Kafka) TransactionTimeout() time.Duration { return k.cfg.TransactionTimeout }

// Transactional reports whether the producer is transactional.
func (k *Kafka) Transactional() bool { return k.cfg.TransactionalID != "" }

// BeginTxn starts a Kafka transaction; every record produced until
// CommitTxn is in it. Not concurrent with other calls on k.
func (k *Kafka) BeginTxn() error {
	return k.txnError("begin", k.cl.BeginTransaction())
}

// CommitTxn waits for every record of the transaction to be acknowledged,
// then commits it. An error leaves the transaction's fate to the next
// producer with the same transactional id, which aborts it: the caller
// must end the session.
func (k *Kafka) CommitTxn(ctx context.Context) error {
	if err := k.cl.Flush(ctx); err != nil {
		return k.txnError("flush", err)
	}
	return k.txnError("commit", k.cl.EndTransaction(ctx, kgo.TryCommit))
}

// AbortTxn drops the records not yet sent and aborts the transaction:
// nothing of it becomes visible to read_committed consumers.
func (k *Kafka) AbortTxn(ctx context.Context) error {
	if err := k.cl.AbortBufferedRecords(ctx); err != nil {
		return k.txnError("abort", err)
	}
	return k.txnError("abort", k.cl.EndTransaction(ctx, kgo.TryAbort))
}

// Fence makes this producer the transactional id's only one before the
// pipeline reads its checkpoint: it commits a small transaction (a record
// under key in topic, which readers of checkpoints pass over), which has the
// broker abort any transaction an older producer with the id left open and
// refuse that producer from then on.
func (k *Kafka) Fence(ctx context.Context, topic, key string, value []byte) error {
	if err := k.BeginTxn(); err != nil {
		return err
	}
	var produceErr error
	done := make(chan struct{})
	k.Produce(&kgo.Record{Topic: topic, Key: []byte(key), Value: value}, func(err error) { produceErr = err; close(done) })
	if err := k.CommitTxn(ctx); err != nil {
		return err
	}
	<-done
	return produceErr
}

// FlushTxn waits until every record produced so far is acknowledged.
func (k *Kafka) FlushTxn(ctx context.Context) error {
	return k.txnError("flush", k.cl.Flush(ctx))
}
