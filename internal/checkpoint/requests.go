package checkpoint

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Requests follows one pipeline's backfill requests in the checkpoint
// topic, on a goroutine of its own, so that the replication loop, which
// meets a request's ID in the WAL, finds the request already read instead
// of reading the whole topic itself (it used to, for up to 15 s). Only that
// pipeline's requests are kept; the topic's other records are skipped as
// they pass.
type Requests struct {
	prefix string
	cl     *kgo.Client
	stop   context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	got     map[string][]byte // request ID -> the record's value
	fetches uint64            // fetches done while caught up with the topic's end
	changed chan struct{}     // closed and replaced on every change
}

// FollowRequests starts following the requests of the pipeline whose
// checkpoint key is key, from the topic's start. Close stops it.
func (s *Store) FollowRequests(key string) (*Requests, error) {
	cl, err := kgo.NewClient(append(s.opts[:len(s.opts):len(s.opts)],
		kgo.ConsumeTopics(s.topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond))...)
	if err != nil {
		return nil, fmt.Errorf("create kafka client: %w", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	r := &Requests{prefix: RequestKey(key, ""), cl: cl, stop: stop, done: make(chan struct{}),
		got: map[string][]byte{}, changed: make(chan struct{})}
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
		caughtUp := true
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			for _, rec := range p.Records {
				if id, ok := strings.CutPrefix(string(rec.Key), r.prefix); ok {
					r.mu.Lock()
					if rec.Value == nil {
						delete(r.got, id)
					} else {
						r.got[id] = rec.Value
					}
					r.mu.Unlock()
				}
			}
			if n := len(p.Records); n > 0 && p.Records[n-1].Offset+1 < p.HighWatermark {
				caughtUp = false
			}
		})
		// Fetch errors are retried by the client; a Get that waits on
		// them ends at its own deadline.
		r.mu.Lock()
		if caughtUp && fs.Err() == nil {
			r.fetches++
		}
		close(r.changed)
		r.changed = make(chan struct{})
		r.mu.Unlock()
	}
}

// Get returns request id once read; ok is false when the topic has been
// read to its end, as of after the call began, without it (a WAL message
// that names a request nobody wrote). It waits for that, or for ctx.
func (r *Requests) Get(ctx context.Context, id string) (req BackfillRequest, ok bool, err error) {
	r.mu.Lock()
	since := r.fetches
	r.mu.Unlock()
	for {
		r.mu.Lock()
		v, found := r.got[id]
		// Two fetches at the end that began after the call: the second
		// started after the request, if it was written before the call.
		done, changed := r.fetches >= since+2, r.changed
		r.mu.Unlock()
		switch {
		case found:
			if err := json.Unmarshal(v, &req); err != nil {
				return req, false, fmt.Errorf("backfill request %s: %w", id, err)
			}
			return req, req.ID == id, nil
		case done:
			return req, false, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return req, false, ctx.Err()
		}
	}
}

// Close stops following.
func (r *Requests) Close() {
	r.stop()
	<-r.done
	r.cl.Close()
}
