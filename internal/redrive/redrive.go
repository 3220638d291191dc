// Package redrive sends a parked key's events on (package park;
// docs/operations.md, "Parked keys"), where the stream meets the signed
// request cdc redrive announced, in the announcement's transaction.
//
// Invariants:
//   - It runs only a request signed with checkpoint.signing_key_file's
//     key and announced within park.RequestMaxAge of being made.
//   - Before it reads a parked topic, every event sent before the
//     announcement is acknowledged (and, exactly once, committed), so the
//     topic holds every record of the parking; the key's events committed
//     after the announcement come after the redriven ones.
//   - A parking's records are read in the order they were parked, and
//     only its own (its Episode); a first event that is invalid still
//     keeps the key parked, with the new reason, and sends nothing.
package redrive

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/park"
)

// Session is what a redrive needs of the session that meets its
// announcement.
type Session struct {
	// Blocking runs fn, which may block for seconds, keeping the slot's
	// lease.
	Blocking func(fn func() error) error
	// Settle lets Kafka acknowledge (exactly once: commits) every event
	// sent before, so that the parked topics hold them.
	Settle func() error
	// Redrive sends parking p's records on, in the open transaction
	// (relay.Sender.Redrive).
	Redrive func(p *checkpoint.Parked, src *outbox.Source, recs []*kgo.Record, dropFirst bool) (sent int, still, err error)
}

// Runner runs one pipeline's redrives.
type Runner struct {
	// Kafka is the clients' options; Committed reads only committed
	// records (exactly once).
	Kafka     []kgo.Opt
	Committed bool
	// Keys are checkpoint.signing_key_file's, Key the checkpoint's key.
	Keys [][]byte
	Key  string
	// Tables are the configured sources, to route a first event again.
	Tables []*outbox.Source
	// Read reads an announced request's value from the checkpoint topic.
	Read func(ctx context.Context, id string) (v []byte, ok bool, err error)
	Log  hclog.Logger
}

// Run runs request id, announced by a message committed at at, on set:
// it returns whether the parked keys changed.
func (r *Runner) Run(ctx context.Context, s Session, set *park.Set, id string, at time.Time) (changed bool, err error) {
	req, ok, err := r.request(ctx, s, id, at)
	if err != nil || !ok {
		return false, err
	}
	entries := set.Select(req.Selector())
	if len(entries) == 0 {
		r.Log.Info("a redrive found nothing parked to send (done already, or nothing matched)", "id", id, "selects", req.Selector().String())
		return false, nil
	}
	if err := s.Settle(); err != nil {
		return false, err
	}
	for _, p := range entries {
		if err := r.one(ctx, s, set, p, req.DropFirst); err != nil {
			return true, err
		}
	}
	return true, nil
}

// one sends parking p's events on, or keeps it parked with the first's
// new reason when it is invalid still.
func (r *Runner) one(ctx context.Context, s Session, set *park.Set, p *checkpoint.Parked, dropFirst bool) error {
	var src *outbox.Source
	for _, t := range r.Tables {
		if t.String() == p.Table {
			src = t
		}
	}
	if src == nil {
		return errtext.Fatalf("key %q is parked for table %s, which the configuration no longer has; configure the table again to redrive it", p.Key, p.Table)
	}
	var recs []*kgo.Record
	err := s.Blocking(func() (err error) {
		recs, err = r.records(ctx, p)
		return err
	})
	if err != nil {
		return err
	}
	sent, still, err := s.Redrive(p, src, recs, dropFirst)
	if err != nil {
		return err
	}
	if still != nil {
		p.Reason = errtext.OneLine(still)
		var ee *outbox.EventError
		if errors.As(still, &ee) {
			p.Reason = ee.Brief()
		}
		r.Log.Warn("redrive: the first parked event is invalid still; the key stays parked with the new reason (fix it, or redrive with --drop-first)",
			"table", p.Table, "key", p.Key, "error", p.Reason)
		return nil
	}
	set.Unpark(p)
	r.Log.Info("redrive: sent a parked key's events on, in order", "table", p.Table, "key", p.Key, "topic", p.Dest, "events", sent, "dropped_first", dropFirst)
	return nil
}

// request reads request id and keeps it only when it verifies and was
// announced (at) within park.RequestMaxAge of being made.
func (r *Runner) request(ctx context.Context, s Session, id string, at time.Time) (park.Request, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	var v []byte
	var found bool
	err := s.Blocking(func() (err error) {
		v, found, err = r.Read(ctx, id)
		return err
	})
	if err != nil {
		return park.Request{}, false, fmt.Errorf("read redrive request %s: %w", id, err)
	}
	var req park.Request
	if !found || json.Unmarshal(v, &req) != nil || req.ID != id {
		r.Log.Warn("ignored a redrive announcement whose request the checkpoint topic does not hold", "id", id)
		return park.Request{}, false, nil
	}
	if age := at.Sub(req.RequestedAt); !req.Verify(r.Keys, r.Key) || age < -park.RequestMaxAge || age > park.RequestMaxAge {
		r.Log.Warn("ignored a redrive request that is not signed with checkpoint.signing_key_file's key, or announced long after it was made; run cdc redrive again if it is yours", "id", id)
		return park.Request{}, false, ErrRefused
	}
	return req, true, nil
}

// ErrRefused is a request refused: Run counts it, and goes on.
var ErrRefused = errors.New("redrive request refused")

// records reads parking p's records from its parked topic, in the order
// they were parked: from a minute before its first event committed to
// the topic's end now.
func (r *Runner) records(ctx context.Context, p *checkpoint.Parked) ([]*kgo.Record, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	// Transaction markers take offsets too: seeing them is how the read
	// knows it reached the end.
	opts := append(r.Kafka[:len(r.Kafka):len(r.Kafka)], kgo.KeepControlRecords())
	if r.Committed {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("create kafka client: %w", err)
	}
	defer cl.Close()
	want, start, err := r.span(ctx, kadm.NewClient(cl), p)
	if err != nil || len(want) == 0 {
		return nil, err
	}
	cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{p.Topic: start})
	var recs []*kgo.Record
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if err := errors.Join(ctx.Err(), fs.Err()); err != nil {
			return nil, fmt.Errorf("read parked topic %q: %w", p.Topic, err)
		}
		fs.EachRecord(func(rec *kgo.Record) {
			if end, ok := want[rec.Partition]; ok && rec.Offset+1 >= end {
				delete(want, rec.Partition)
			}
			if !rec.Attrs.IsControl() && string(rec.Key) == p.Key && header(rec, park.HeaderEpisode) == p.Episode {
				recs = append(recs, rec)
			}
		})
	}
	return recs, nil
}

// span is, by partition of p's parked topic, where its records may start
// (a minute before its first event committed) and where the topic ends
// now; partitions with nothing between are left out.
func (r *Runner) span(ctx context.Context, adm *kadm.Client, p *checkpoint.Parked) (map[int32]int64, map[int32]kgo.Offset, error) {
	var ends kadm.ListedOffsets
	var err error
	if r.Committed {
		ends, err = adm.ListCommittedOffsets(ctx, p.Topic)
	} else {
		ends, err = adm.ListEndOffsets(ctx, p.Topic)
	}
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read where parked topic %q ends: %w", p.Topic, err)
	}
	starts, err := adm.ListOffsetsAfterMilli(ctx, p.Since.Add(-time.Minute).UnixMilli(), p.Topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read where parked topic %q's records of %s start: %w", p.Topic, p.Since, err)
	}
	want, start := map[int32]int64{}, map[int32]kgo.Offset{}
	ends.Each(func(o kadm.ListedOffset) {
		from, ok := starts.Lookup(p.Topic, o.Partition)
		if ok && from.Offset >= 0 && from.Offset < o.Offset {
			want[o.Partition] = o.Offset
			start[o.Partition] = kgo.NewOffset().At(from.Offset)
		}
	})
	return want, start, nil
}

// header is the value of r's header key, or "".
func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
