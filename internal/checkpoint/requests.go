package checkpoint

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Requests follows one pipeline's backfill requests in the checkpoint
// topic, on a goroutine of its own, so that the replication loop, which
// meets a request's ID in the WAL, finds the request already read instead
// of reading the whole topic itself, for seconds. Only that
// pipeline's requests are kept; the topic's other records are skipped as
// they pass.
type Requests struct {
	topic  string
	prefix string
	cl     *kgo.Client
	stop   context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	got     map[string][]byte // request ID -> the record's value
	next    map[int32]int64   // partition -> the offset after the last record read
	changed chan struct{}     // closed and replaced on every fetch
}

// FollowRequests starts following the requests of the pipeline whose
// checkpoint key is key, from the topic's start. Close stops it.
func (s *Store) FollowRequests(key string) (*Requests, error) {
	cl, err := kgo.NewClient(append(s.opts[:len(s.opts):len(s.opts)],
		kgo.ConsumeTopics(s.topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// Transaction markers (exactly-once checkpoints) take offsets
		// too: seeing them is how the follower knows it reached the end.
		kgo.KeepControlRecords(),
		kgo.FetchMaxWait(100*time.Millisecond))...)
	if err != nil {
		return nil, fmt.Errorf("create kafka client: %w", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	r := &Requests{topic: s.topic, prefix: RequestKey(key, ""), cl: cl, stop: stop, done: make(chan struct{}),
		got: map[string][]byte{}, next: map[int32]int64{}, changed: make(chan struct{})}
	go r.run(ctx)
	return r, nil
}

func (r *Requests) run(ctx context.Context) {
	defer close(r.done)
	for {
		fs := r.cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return
		}
		// Fetch errors are retried by the client; a Get that waits on
		// them ends at its own deadline.
		r.mu.Lock()
		fs.EachRecord(func(rec *kgo.Record) {
			r.next[rec.Partition] = rec.Offset + 1
			if rec.Attrs.IsControl() {
				return
			}
			if id, ok := strings.CutPrefix(string(rec.Key), r.prefix); ok {
				if rec.Value == nil {
					delete(r.got, id)
				} else {
					r.got[id] = rec.Value
				}
			}
		})
		close(r.changed)
		r.changed = make(chan struct{})
		r.mu.Unlock()
	}
}

// Read reports whether request id has been read already: Get then
// returns at once, without asking the brokers where the topic ends.
func (r *Requests) Read(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.got[id]
	return ok
}

// Get returns the value of request id once read; ok is false when the
// topic has been read to the end it had when Get was called, without it (a
// WAL message that names a request nobody wrote: cdc backfill writes the
// request before it announces it). It waits for that, or for ctx. The
// value is backfill's to parse and verify.
func (r *Requests) Get(ctx context.Context, id string) (value []byte, ok bool, err error) {
	var ends kadm.ListedOffsets
	for {
		r.mu.Lock()
		v, found := r.got[id]
		read, changed := true, r.changed
		for _, e := range ends {
			for p, o := range e {
				if o.Offset > r.next[p] {
					read = false
				}
			}
		}
		r.mu.Unlock()
		switch {
		case found:
			return v, true, nil
		case ends == nil:
			// Not read yet: read at least to where the topic ends now.
			if ends, err = kadm.NewClient(r.cl).ListEndOffsets(ctx, r.topic); err == nil {
				err = ends.Error()
			}
			if err != nil {
				return nil, false, fmt.Errorf("read the end of the checkpoint topic: %w", err)
			}
			continue
		case read:
			return nil, false, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
}

// Close stops following.
func (r *Requests) Close() {
	r.stop()
	<-r.done
	r.cl.Close()
}
