// Package redrive sends parked keys' events on (package park;
// docs/operations.md, "Parked keys"), where the stream meets the signed
// request cdc redrive announced (package request admits it), in the
// announcement's transaction, or as a session starts when the stream
// cannot reach the announcement.
//
// Invariants:
//   - A request acts only on the parkings it names, in the episode the
//     operator saw: a key redriven since, or parked again, is left as it
//     is.
//   - Before it reads a parked topic, every record sent before is
//     acknowledged (and, exactly once, committed), so the topic holds
//     every record of the parking; the key's events committed after the
//     announcement come after the redriven ones.
//   - What leaves the parked topic leaves whole, or stays: a first pass
//     reads the parking by offset, from the offset it started at (or, when
//     records are missing and the partition begins below it, the topic
//     made again, from where it begins), on its one partition, and checks every record the checkpoint says it has
//     (numbered 1 to Events, each sealed, each of the session its number
//     belongs to) and that each may be sent now; a parking with a record
//     missing (retention, compaction, DeleteRecords, the topic made
//     again) or one invalid still sends nothing and stays parked, saying
//     why, unless the operator accepted the gap. Only then does a second
//     pass send them, in their order, each once.
//   - Memory is a chunk: the passes read a bounded fetch at a time, and
//     the second sends a chunk (half of max_in_flight, and of its bytes),
//     then waits for Kafka (exactly once: commits it, with the number of
//     records released in the checkpoint), so a redrive of any size holds
//     a chunk, and one interrupted resumes where its last commit left it.
package redrive

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/sink"
)

// Session is what a redrive needs of the session that runs it.
type Session struct {
	// Blocking runs fn, which may block for seconds, keeping the slot's
	// lease.
	Blocking func(fn func() error) error
	// Settle lets Kafka acknowledge (exactly once: commits) every record
	// sent before, so that the parked topics hold them.
	Settle func() error
	// Route is what parked record r of p becomes now (relay.Sender's
	// Redriven): send produces it in the open transaction (nil: still is
	// why it may not go yet).
	Route func(p *checkpoint.Parked, r *kgo.Record, drop bool) (send func() error, still error, err error)
	// Chunk is called after each chunk sent and once after the last: it
	// waits for room in flight, or exactly once commits the open Kafka
	// transaction with the checkpoint noting p's Released (which the
	// redrive has set).
	Chunk func(p *checkpoint.Parked) error
	// Dirty tells the session the parked keys changed, for its next
	// checkpoint note.
	Dirty func()
}

// Runner runs one pipeline's redrives.
type Runner struct {
	// Kafka is the clients' options; Committed reads only committed
	// records (exactly once).
	Kafka     []kgo.Opt
	Committed bool
	// Keys are checkpoint.signing_key_file's, Key the checkpoint's key:
	// a parked record's seal verifies with them (park.Sealed).
	Keys [][]byte
	Key  string
	// ChunkRecords and ChunkBytes bound a chunk (half of max_in_flight
	// and of max_in_flight_bytes), and what a fetch reads.
	ChunkRecords int
	ChunkBytes   int
	// Retained lists the configured tables with retention: it keeps a
	// parked key's rows only while the key is parked, so a gap accepted
	// lets it delete the rows of the events gone with the records
	// (TestAcceptGapRefusedUnderRetention). Any of them: a parking holds
	// events of every table the key's events come from, and a record gone
	// names none (TestAcceptGapOfAnotherTablesEvents).
	Retained func() []string
	Log      hclog.Logger
}

// Outcome is what a request did: every parking it named released (Done),
// and in words, per parking, for cdc redrive to print.
type Outcome struct {
	Done  bool
	Lines []string
	// Changed: the parked keys changed (a key released, a reason or a
	// count of records released).
	Changed bool
}

// String is the outcome in one line.
func (o Outcome) String() string { return strings.Join(o.Lines, "; ") }

// Run runs req on set.
func (r *Runner) Run(ctx context.Context, s Session, set *park.Set, req park.Request) (Outcome, error) {
	out := Outcome{Done: true}
	settled := false
	for _, ref := range req.Parkings {
		p := set.ByKey(ref.Key)
		switch {
		case p == nil:
			out.Lines = append(out.Lines, fmt.Sprintf("key %q is not parked (redriven already, or never parked)", ref.Key))
			continue
		case p.Episode != ref.Episode:
			out.Done = false
			out.Lines = append(out.Lines, fmt.Sprintf("key %q was redriven and parked again since (episode %s, not %s): it stays parked; cdc parked shows it", ref.Key, p.Episode, ref.Episode))
			continue
		}
		if !settled {
			if err := s.Settle(); err != nil {
				return out, err
			}
			settled = true
		}
		line, released, err := r.one(ctx, s, set, p, req)
		if released || line != "" {
			out.Changed = true
		}
		if err != nil {
			return out, err
		}
		out.Done = out.Done && released
		out.Lines = append(out.Lines, line)
	}
	return out, nil
}

// one redrives parking p whole, or keeps it parked with why: the line
// says which, released whether p is no longer parked.
func (r *Runner) one(ctx context.Context, s Session, set *park.Set, p *checkpoint.Parked, req park.Request) (line string, released bool, err error) {
	if gone := park.Unsealable(p, r.Keys); len(gone) > 0 {
		// Not records gone: a key rotated out of the file. Every record
		// it sealed would read as forged, and --accept-gap would un-park
		// the key having sent none of them.
		reason := fmt.Sprintf("redrive refused, nothing sent: the parked records were sealed with signing key %s, which checkpoint.signing_key_file no longer has, so none would verify; put that key back in the file on a line after the current one (the first line signs, every line verifies), start the connector again and redrive (--accept-gap does not apply)",
			strings.Join(gone, ", "))
		r.Log.Error("redrive: a parked key's records are sealed with a signing key the connector no longer has; it stays parked", "key", p.Key, "key_ids", strings.Join(gone, ","))
		set.SetReason(p, reason)
		s.Dirty()
		return fmt.Sprintf("key %q stays parked: %s", p.Key, reason), false, nil
	}
	w, stills, from, err := r.check(ctx, s, p, req)
	if err != nil {
		return "", false, err
	}
	var reason string
	switch {
	case w.lost > 0 && !req.AcceptGap:
		reason = fmt.Sprintf("redrive refused: parked topic %q (partition %d, from offset %d) no longer holds %d of its %d records (%s): deleted by a retention, compaction, DeleteRecords or the topic made again? To send them in order, stop the connector and rewind to the parking's start (cdc rewind --to-lsn %s, within the replay window), or send what is left and accept the gap (cdc redrive --key %s --accept-gap); the outbox keeps the key's rows only while it is parked: to send them after the gap with cdc backfill --where, take the table's retention off first (docs/operations.md, \"Parked keys\")",
			p.Topic, p.Partition, from, w.lost, p.Events-p.Released, w.spans(), p.FirstLSN, quoteArg(p.Key))
		r.Log.Error("redrive: a parked key's records are missing from the parked topic; it stays parked", "key", p.Key, "topic", p.Topic, "partition", p.Partition, "missing", w.spans(), "forged", w.forged)
	case w.lost > 0 && r.Retained != nil && len(r.Retained()) > 0:
		retained := strings.Join(r.Retained(), ", ")
		reason = fmt.Sprintf("redrive refused, nothing sent: parked topic %q no longer holds %d of its %d records (%s), and %s has retention, which keeps the key's rows only while it is parked (the records gone may be of any table): --accept-gap would let it delete the rows of the events gone, which no topic holds. Take tables[].retention off for %s and start again, then cdc redrive --key %s --accept-gap, then send the key's rows with cdc backfill --where (or, to accept their loss, skip the backfill), then put retention back (docs/operations.md, \"Parked keys\")",
			p.Topic, w.lost, p.Events-p.Released, w.spans(), retained, retained, quoteArg(p.Key))
		r.Log.Error("redrive: --accept-gap refused: a parked key's records are missing and a table has retention; it stays parked", "key", p.Key, "retained", retained, "missing", w.spans())
	case w.invalid > 0:
		reason = fmt.Sprintf("redrive sent nothing: %d of its events are invalid still: %s; fix them, or send the first to the dead-letter topic (cdc redrive --key %s --drop-first), or every one that stays invalid (--drop-invalid)", w.invalid, strings.Join(stills, "; "), quoteArg(p.Key))
		r.Log.Warn("redrive: events of a parked key are invalid still; it stays parked, nothing sent (fix them, or redrive with --drop-first for the first, --drop-invalid for every one)", "key", p.Key, "error", reason)
	default:
		if w.lost > 0 {
			r.Log.Error("redrive: accepted a gap in a parked key's records, as asked (--accept-gap): sending the rest in order", "key", p.Key, "missing", w.spans())
		}
		var sent, dropped int64
		if sent, dropped, reason, err = r.send(ctx, s, set, p, req, from, w.lost); err != nil || reason != "" {
			break
		}
		set.Unpark(p)
		s.Dirty()
		r.Log.Info("redrive: sent a parked key's events on, in order", "table", p.Table, "key", p.Key, "topic", p.Dest, "events", sent, "dropped", dropped)
		line = fmt.Sprintf("key %q: %d events sent on", p.Key, sent)
		switch {
		case dropped > 0 && req.DropInvalid:
			line += fmt.Sprintf(", %d still invalid to the dead-letter topic", dropped)
		case dropped > 0:
			line += ", the first to the dead-letter topic"
		}
		if w.lost > 0 {
			line += fmt.Sprintf(", %d missing (accepted)", w.lost)
		}
		return line, true, nil
	}
	if err != nil {
		return "", false, err
	}
	set.SetReason(p, reason)
	s.Dirty()
	return fmt.Sprintf("key %q stays parked: %s", p.Key, reason), false, nil
}

// check is the first pass over p's records: which are missing, which
// may not go yet (the first few, in words), and the offset the second
// pass reads from.
func (r *Runner) check(ctx context.Context, s Session, p *checkpoint.Parked, req park.Request) (*walk, []string, int64, error) {
	var stills []string
	first := p.Released + 1 // --drop-first's: after a redrive that stopped part-way, the first not sent
	w, from, err := r.scan(ctx, s, p, func() { stills = nil }, func(w *walk, n int64, rec *kgo.Record) error {
		_, still, err := s.Route(p, rec, req.DropFirst && n == first)
		if err == nil && still != nil && req.DropInvalid {
			_, still, err = s.Route(p, rec, true) // its dead letter, which may be refused too
		}
		if err != nil || still == nil {
			return err
		}
		if w.invalid++; len(stills) < 3 {
			stills = append(stills, fmt.Sprintf("event %d of %d (id %s): %s", n, p.Events, header(rec, route.HeaderDeadLetterID), brief(still)))
		}
		return nil
	})
	return w, stills, from, err
}

// scan is a pass over p's records from p.Start, each fed to a new walk
// and, when it is the parking's, to ours. A pass that finds records
// missing while the partition begins below Start reads again from where
// it begins (reset called first): the topic was made again since the
// parking began, its offsets started at 0 again, and the records parked
// since are below Start. Reading more is safe (the walk tells the
// parking's records apart by episode, number and seal), and costs a
// second read only where records are missing. It returns the walk and
// the offset the pass read from, for a second pass to read the same.
func (r *Runner) scan(ctx context.Context, s Session, p *checkpoint.Parked, reset func(), ours func(w *walk, n int64, rec *kgo.Record) error) (*walk, int64, error) {
	from := p.Start
	for {
		w := r.newWalk(p)
		err := r.read(ctx, s, p, from, func(rec *kgo.Record) error {
			if n, mine := w.take(rec); mine {
				return ours(w, n, rec)
			}
			return nil
		})
		if err != nil {
			return w, from, err
		}
		if w.end(); w.lost == 0 {
			return w, from, nil
		}
		var first int64
		if err := s.Blocking(func() (err error) { first, err = r.first(ctx, p); return err }); err != nil || first >= from {
			return w, from, err
		}
		from = first
		reset()
	}
}

// send is the second pass: p's records sent on, in their order, a chunk
// at a time; stop says why it stopped part-way (records that vanished or
// became invalid since the first pass, lost more than the lost it had
// found).
func (r *Runner) send(ctx context.Context, s Session, set *park.Set, p *checkpoint.Parked, req park.Request, from, lost int64) (sent, dropped int64, stop string, err error) {
	w := r.newWalk(p)
	inChunk, chunkBytes := 0, 0
	first := p.Released + 1 // as check's: Released grows as records go
	err = r.read(ctx, s, p, from, func(rec *kgo.Record) error {
		if stop != "" {
			return nil
		}
		n, ours := w.take(rec)
		if w.lost > lost && !req.AcceptGap {
			stop = fmt.Sprintf("records %s vanished from the parked topic while it was redriven", w.spans())
			return nil
		}
		if !ours {
			return nil
		}
		drop := req.DropFirst && n == first
		send, still, err := s.Route(p, rec, drop)
		if err == nil && still != nil && req.DropInvalid && !drop {
			drop = true
			send, still, err = s.Route(p, rec, true)
		}
		if err != nil {
			return err
		}
		if still != nil {
			stop = fmt.Sprintf("event %d (id %s) became invalid while it was redriven: %s", n, header(rec, route.HeaderDeadLetterID), brief(still))
			return nil
		}
		if err := send(); err != nil {
			return err
		}
		if drop {
			dropped++
		}
		sent++
		set.Released(p, n)
		if inChunk, chunkBytes = inChunk+1, chunkBytes+sink.RecordSize(rec); inChunk >= r.ChunkRecords || chunkBytes >= r.ChunkBytes {
			inChunk, chunkBytes = 0, 0
			return s.Chunk(p)
		}
		return nil
	})
	if err != nil {
		return sent, dropped, "", err
	}
	if w.end(); stop == "" && w.lost > lost && !req.AcceptGap {
		stop = fmt.Sprintf("records %s vanished from the parked topic while it was redriven", w.spans())
	}
	if err := s.Chunk(p); err != nil {
		return sent, dropped, "", err
	}
	if stop != "" {
		stop = fmt.Sprintf("redrive stopped after %d of its events (sent on, in order): %s; redrive it again", p.Released, stop)
		r.Log.Error("redrive: stopped part-way; the key stays parked with the events not sent", "key", p.Key, "error", stop)
	}
	return sent, dropped, stop, nil
}

// quoteArg is k as a shell argument.
func quoteArg(k string) string { return "'" + strings.ReplaceAll(k, "'", `'\''`) + "'" }

// brief is an event's error without what to do when stopping on it.
func brief(err error) string {
	var ee *outbox.EventError
	if errors.As(err, &ee) {
		return ee.Brief()
	}
	return err.Error()
}

// read calls take with each record of p's partition of its parked topic,
// from offset from to where the partition ends now, in offset order, a fetch
// of at most ChunkBytes at a time. It fetches by hand, so that it knows
// the offset it has read to, past records a compaction removed and past
// transaction markers: a consumer only shows the records it returns, and
// one whose last records are gone would wait for them for ever. Reading
// keeps the slot's lease; take runs outside it.
func (r *Runner) read(ctx context.Context, s Session, p *checkpoint.Parked, from int64, take func(*kgo.Record) error) error {
	cl, err := kgo.NewClient(r.Kafka...)
	if err != nil {
		return fmt.Errorf("create kafka client: %w", err)
	}
	defer cl.Close()
	f := &fetcher{r: r, cl: cl, adm: kadm.NewClient(cl), p: p}
	var end int64
	if err := s.Blocking(func() (err error) {
		end, err = r.end(ctx, f.adm, p)
		return err
	}); err != nil {
		return err
	}
	for at := from; at < end; {
		var recs []*kgo.Record
		next := at
		err := s.Blocking(func() (err error) {
			recs, next, err = f.fetch(ctx, at, end)
			return err
		})
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("read parked topic %q: %w", p.Topic, err)
		}
		for _, rec := range recs {
			if rec.Offset >= end || rec.Attrs.IsControl() {
				continue
			}
			if err := take(rec); err != nil {
				return err
			}
		}
		at = max(next, at)
	}
	return nil
}

// fetcher fetches a parking's partition by hand, from its leader.
type fetcher struct {
	r      *Runner
	cl     *kgo.Client
	adm    *kadm.Client
	p      *checkpoint.Parked
	leader *kgo.Broker
	id     kadm.TopicID
}

// fetch reads the records of f's partition from offset at (end is where
// the read stops): the records, and the offset to fetch next.
func (f *fetcher) fetch(ctx context.Context, at, end int64) ([]*kgo.Record, int64, error) {
	p := f.p
	if f.leader == nil {
		md, err := f.adm.Metadata(ctx, p.Topic)
		if err != nil {
			return nil, at, err
		}
		t, ok := md.Topics[p.Topic]
		if !ok || t.Err != nil {
			return nil, at, fmt.Errorf("the brokers list no topic %q: %v", p.Topic, t.Err)
		}
		d, ok := t.Partitions[p.Partition]
		if !ok || d.Leader < 0 {
			return nil, at, fmt.Errorf("partition %d of topic %q has no leader now", p.Partition, p.Topic)
		}
		f.leader, f.id = f.cl.Broker(int(d.Leader)), t.ID
	}
	level, isolation := int8(0), kgo.ReadUncommitted()
	if f.r.Committed {
		level, isolation = 1, kgo.ReadCommitted()
	}
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID, req.MaxWaitMillis, req.MinBytes, req.IsolationLevel = -1, 500, 1, level
	req.MaxBytes = int32(max(f.r.ChunkBytes, 1<<20))
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic, rt.TopicID = p.Topic, f.id
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition, rp.FetchOffset, rp.LogStartOffset, rp.CurrentLeaderEpoch, rp.PartitionMaxBytes = p.Partition, at, -1, -1, req.MaxBytes
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	kr, err := f.leader.Request(ctx, req)
	if err != nil {
		f.leader = nil
		return nil, at, err
	}
	resp := kr.(*kmsg.FetchResponse)
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return nil, at, err
	}
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
		return nil, at, fmt.Errorf("a fetch of %q answered with %d topics", p.Topic, len(resp.Topics))
	}
	part := &resp.Topics[0].Partitions[0]
	switch err := kerr.ErrorForCode(part.ErrorCode); {
	case errors.Is(err, kerr.OffsetOutOfRange):
		// Records deleted below it (retention, DeleteRecords), or the topic
		// made again: read from the first the topic has, and the walk finds
		// what is missing.
		start, err := f.start(ctx, part.LogStartOffset)
		if err != nil {
			return nil, at, err
		}
		if start > at {
			return nil, start, nil
		}
		return nil, end, nil
	case err != nil && kerr.IsRetriable(err):
		f.leader = nil // a leader that moved: look it up again, after a pause
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
		return nil, at, nil
	case err != nil:
		return nil, at, err
	}
	fp, next := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{KeepControlRecords: true, Offset: at, IsolationLevel: isolation,
		Topic: p.Topic, Partition: p.Partition}, part, kgo.DefaultDecompressor(), nil)
	if fp.Err != nil {
		return nil, at, fp.Err
	}
	if next <= at && len(fp.Records) == 0 && part.HighWatermark <= at {
		next = end // the partition ends before where it ended: made again
	}
	return fp.Records, next, nil
}

// start is where f's partition begins, as a fetch's answer gave it
// (answered): Apache Kafka answers OFFSET_OUT_OF_RANGE without it (-1),
// where kfake gives it, so it is asked for then.
func (f *fetcher) start(ctx context.Context, answered int64) (int64, error) {
	if answered >= 0 {
		return answered, nil
	}
	p := f.p
	offs, err := f.adm.ListStartOffsets(ctx, p.Topic)
	if err != nil {
		return 0, err
	}
	o, ok := offs.Lookup(p.Topic, p.Partition)
	if !ok || o.Err != nil {
		return 0, fmt.Errorf("the start of partition %d of topic %q: %v", p.Partition, p.Topic, o.Err)
	}
	return o.Offset, nil
}

// end is where p's partition ends now: committed records only, exactly
// once; 0 when the partition is gone (every record is missing).
func (r *Runner) end(ctx context.Context, adm *kadm.Client, p *checkpoint.Parked) (int64, error) {
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
	if errors.Is(err, kerr.UnknownTopicOrPartition) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read where parked topic %q ends: %w", p.Topic, err)
	}
	o, ok := ends.Lookup(p.Topic, p.Partition)
	if !ok {
		return 0, nil
	}
	return o.Offset, nil
}

// first is where p's partition begins now (records deleted below it, or
// 0 for a topic made again); 0 when the partition is gone.
func (r *Runner) first(ctx context.Context, p *checkpoint.Parked) (int64, error) {
	cl, err := kgo.NewClient(r.Kafka...)
	if err != nil {
		return 0, fmt.Errorf("create kafka client: %w", err)
	}
	defer cl.Close()
	starts, err := kadm.NewClient(cl).ListStartOffsets(ctx, p.Topic)
	if err == nil {
		err = starts.Error()
	}
	if errors.Is(err, kerr.UnknownTopicOrPartition) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read where parked topic %q begins: %w", p.Topic, err)
	}
	o, _ := starts.Lookup(p.Topic, p.Partition)
	return o.Offset, nil
}

// header is the value of the connector's header key on parked record r
// (park.Header).
func header(r *kgo.Record, key string) string { return park.Header(r, key) }

// Cut is how many of p's records (1 to Cut) a rewind to to keeps parked:
// those before the first that the stream from to carries again, which is
// a record of an event committed at or after to, not of a row read from
// the table (park.Read): no stream carries those again. The stream parks
// the key's events from to on again, behind the cut. A record missing
// before that first is kept, as missing, for the redrive to find and
// refuse, never cut away unseen; but in a parking that holds rows read
// from the table (p.Read) one missing anywhere may be one of those, which
// nothing would send again, and a read record behind the first the
// stream carries again cannot be kept in order: both are a
// *errtext.Fatal naming the key.
func (r *Runner) Cut(ctx context.Context, p *checkpoint.Parked, to pglogrepl.LSN) (int64, error) {
	c := &cutter{to: to}
	s := Session{Blocking: func(fn func() error) error { return fn() }}
	q := &checkpoint.Parked{Episode: p.Episode, Events: p.Events, Runs: p.Runs, Topic: p.Topic, Partition: p.Partition, Start: p.Start}
	w, _, err := r.scan(ctx, s, q, func() { *c = cutter{to: to} }, func(_ *walk, n int64, rec *kgo.Record) error {
		c.take(n, rec)
		return nil
	})
	if err != nil {
		return 0, err
	}
	return c.result(p, w)
}

// cutter is Cut's decision, a record of the parking at a time.
type cutter struct {
	to     pglogrepl.LSN
	gaveUp int64  // the first record given up, or 0
	behind string // a read record behind it
}

func (c *cutter) take(n int64, rec *kgo.Record) {
	read := park.Read(rec)
	lsn, err := pglogrepl.ParseLSN(header(rec, park.HeaderLSN))
	switch keep := read || (err == nil && lsn < c.to); {
	case !keep && c.gaveUp == 0:
		c.gaveUp = n
	case read && c.gaveUp > 0 && c.behind == "":
		c.behind = fmt.Sprintf("event %d (id %s), read from the table by a backfill or a repair, is behind event %d, committed at or after %s", n, header(rec, route.HeaderDeadLetterID), c.gaveUp, c.to)
	}
}

// result is the cut, once w has walked all of p.
func (c *cutter) result(p *checkpoint.Parked, w *walk) (int64, error) {
	redrive := fmt.Sprintf("redrive the key first (cdc redrive --key %s), then rewind", park.ShellQuote(p.Key))
	if c.behind != "" {
		return 0, &errtext.Fatal{Msg: fmt.Sprintf("key %q is parked, and its %s: the stream from there carries the one again and never the other, so the parking cannot be kept in order; %s", p.Key, c.behind, redrive)}
	}
	if p.Read && w.lost > 0 {
		return 0, &errtext.Fatal{Msg: fmt.Sprintf("key %q is parked with events read from the table by a backfill or a repair, which no stream carries again, and the parked topic %q no longer holds its %s: a rewind cannot keep or give up the parking whole; %s (with --accept-gap, then cdc backfill --where for the rows missing, which stay in the outbox table while the key is parked)", p.Key, p.Topic, w.spans(), redrive)}
	}
	if c.gaveUp > 0 {
		return c.gaveUp - 1, nil
	}
	return p.Events, nil
}
