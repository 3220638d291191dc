package pipeline

import "github.com/outboxcdc/cdc/internal/checkpoint"

// SavedForTest is the checkpoint the pipeline saved last, for tests.
func (p *Pipeline) SavedForTest() checkpoint.Record {
	if p.progress == nil {
		return checkpoint.Record{}
	}
	return p.progress.Saved()
}
