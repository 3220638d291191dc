package pipeline

import (
	"context"
	"time"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/retry"
)

// SavedForTest is the checkpoint the pipeline saved last, for tests.
func (p *Pipeline) SavedForTest() checkpoint.Record {
	if p.progress == nil {
		return checkpoint.Record{}
	}
	return p.progress.Saved()
}

// RetryWaitForTest is how long the pipeline waits after a session's err,
// its backoff at max, for tests.
func (p *Pipeline) RetryWaitForTest(ctx context.Context, err error) time.Duration {
	b := retry.New(p.cfg.RetryBackoffMax, p.cfg.RetryBackoffMax)
	return p.retryWait(ctx, err, b)
}

// RequestLookupsForTest is how many times the replication loop looked an
// announced request up in the checkpoint topic (request.Gate.Lookups),
// for tests: read it once Run has returned, the loop's goroutine owning it
// until then.
func (p *Pipeline) RequestLookupsForTest() int { return p.requests.Lookups }
