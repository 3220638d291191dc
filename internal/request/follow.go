package request

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/checkpoint"
)

// Requests follows one pipeline's requests (backfill, redrive) in the checkpoint
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
	order   []string          // the IDs in the order read (some forgotten since)
	bytes   int               // of got's ids and values, and keptOverhead each
	next    map[int32]int64   // partition -> the offset after the last record read
	changed chan struct{}     // closed and replaced on every fetch
}

// Follow starts following the requests of the pipeline whose checkpoint
// key is key in s's topic, from the topic's start. Close stops it.
func Follow(s *checkpoint.Store, key string) (*Requests, error) {
	opts := s.ClientOpts()
	cl, err := kgo.NewClient(append(opts[:len(opts):len(opts)],
		kgo.ConsumeTopics(s.Topic()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// Transaction markers (exactly-once checkpoints) take offsets
		// too: seeing them is how the follower knows it reached the end.
		kgo.KeepControlRecords(),
		kgo.FetchMaxWait(100*time.Millisecond))...)
	if err != nil {
		return nil, fmt.Errorf("create kafka client: %w", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	r := &Requests{topic: s.Topic(), prefix: checkpoint.RequestKey(key, ""), cl: cl, stop: stop, done: make(chan struct{}),
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
				r.keep(id, rec.Value)
			}
		})
		close(r.changed)
		r.changed = make(chan struct{})
		r.mu.Unlock()
	}
}

// MaxKept bounds the requests a follower keeps, in bytes of their ids and
// values and keptOverhead each (an empty value costs its entry too):
// anyone who may produce to the checkpoint topic could write requests
// without end. Past it, the oldest read go first; an operator's request is
// taken within seconds of being written, long before it would be pushed
// out, and one pushed out is refused as unknown, losing nothing (the
// command says to run it again).
const MaxKept = 16 << 20

// keptOverhead is what a request kept costs besides its id's and value's
// bytes: its entries in got and order.
const keptOverhead = 64

// keep holds the value v of request id, or forgets it (a tombstone), the
// oldest going first past MaxKept. A value replaced keeps its id's place
// in order, so that one id written again and again does not grow it; an
// id forgotten leaves its place until compact drops it. Called with mu
// held.
func (r *Requests) keep(id string, v []byte) {
	old, had := r.got[id]
	if had {
		r.bytes -= len(id) + len(old) + keptOverhead
		delete(r.got, id)
	}
	if v == nil {
		r.compact()
		return
	}
	r.got[id] = v
	if !had {
		r.order = append(r.order, id)
	}
	for r.bytes += len(id) + len(v) + keptOverhead; r.bytes > MaxKept && len(r.order) > 0; {
		first := r.order[0]
		r.order = r.order[1:]
		if old, ok := r.got[first]; ok {
			r.bytes -= len(first) + len(old) + keptOverhead
			delete(r.got, first)
		}
	}
	r.compact()
}

// compact drops the places in order of ids forgotten (tombstoned, or
// written again after a tombstone: the newest place is kept) once they
// are as many as the ids kept, so that order stays within twice got.
// Called with mu held.
func (r *Requests) compact() {
	if len(r.order) <= 2*len(r.got)+64 {
		return
	}
	seen := make(map[string]bool, len(r.got))
	order := make([]string, 0, len(r.got))
	for i := len(r.order) - 1; i >= 0; i-- {
		if id := r.order[i]; !seen[id] {
			if _, ok := r.got[id]; ok {
				seen[id] = true
				order = append(order, id)
			}
		}
	}
	slices.Reverse(order)
	r.order = order
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

// Pending returns the ids of the requests of prefix the topic holds that
// say they were made (made reads it from a value; false: it does not
// parse) within checkpoint.RequestMaxAge of now, once the follower has
// read the topic to the end it has now, oldest first. Older ones could not
// be taken now anyway, and a stream that meets one's announcement decides
// on it there, by the announcement's commit time (a redrive a crash
// interrupted resumes so). What requests someone else wrote cost is an
// HMAC each, within MaxKept's bytes.
func (r *Requests) Pending(ctx context.Context, prefix string, made func([]byte) (time.Time, bool), now time.Time) ([]string, error) {
	if _, _, err := r.Get(ctx, "\x00 no request has this id"); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	type pending struct {
		id string
		at time.Time
	}
	var fresh []pending
	for id, v := range r.got {
		if !strings.HasPrefix(id, prefix) {
			continue
		}
		if at, ok := made(v); ok && at.Sub(now).Abs() <= checkpoint.RequestMaxAge {
			fresh = append(fresh, pending{id, at})
		}
	}
	slices.SortFunc(fresh, func(a, b pending) int { return a.at.Compare(b.at) })
	ids := []string{}
	for _, p := range fresh {
		ids = append(ids, p.id)
	}
	return ids, nil
}

// Close stops following.
func (r *Requests) Close() {
	r.stop()
	<-r.done
	r.cl.Close()
}
