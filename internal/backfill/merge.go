package backfill

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/copyread"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/readahead"
	"github.com/outboxcdc/cdc/internal/tableread"
)

// reader is one job's read before the stream: its plan and decoder, and
// the rows of its chunk not sent yet.
type reader struct {
	job          *checkpoint.Job
	plan         *tableread.Plan
	dec          *decode.RowDecoder
	next         func() (tableread.Chunk, error)
	rows         [][][]byte
	final, ended bool  // the chunk in rows is the last; its end is logged
	more         bool  // rows end in a commit of two tables: read the next chunk onto them
	sent         int64 // rows sent in this session
	// ahead, when not nil, hands out the cursor's reads, several chunks'
	// rows each, a chunk at a time, reading the next while they are sent
	// (readChunks), or a copy's (fresh: from the first row, in conn's
	// snapshot).
	ahead interface {
		Next() ([][][]byte, bool, error)
		Pending() ([][][]byte, bool)
		Wait()
	}
	fresh bool
	cur   *tableread.Cursor // in commit order: reads on past a copy's rows
}

// readChunks is how many chunks' rows a cursor alone on its connection
// reads with one FETCH: each FETCH is a round trip after which the server
// waits, and with one chunk a FETCH the first start's backfill waited for
// its reads for two thirds of its time (docs/benchmarks.md, "Larger
// reads"). Its bytes are still bounded by the chunk's budget.
const readChunks = 4

// fetch is the reader's next chunk: ahead's, or one read now.
func (rd *reader) fetch() (tableread.Chunk, error) {
	if rd.ahead == nil {
		return rd.next()
	}
	rows, last, err := rd.ahead.Next()
	return tableread.Chunk{Rows: rows, Final: last}, err
}

// wait waits for a read ahead to end: the connection is free again (or,
// for a copy cut short, closed).
func (rd *reader) wait() {
	if rd.ahead != nil {
		rd.ahead.Wait()
	}
}

// jobError is err, of job's read: Continue names the job it stops on.
type jobError struct {
	job checkpoint.Job
	err error
}

func (e *jobError) Error() string { return e.err.Error() }
func (e *jobError) Unwrap() error { return e.err }

// openRead plans job's read in conn's snapshot, counts it once, and opens
// it where the job stands.
func (r *Runner) openRead(ctx context.Context, conn *pgx.Conn, job *checkpoint.Job, at pglogrepl.LSN) (*reader, error) {
	plan, dec, err := r.firstStartPlan(ctx, conn, *job)
	if err == nil && job.Total == 0 { // kept: a count can take longer than the chunks
		job.Total, err = plan.Count(ctx, conn)
	}
	if err != nil {
		return nil, &jobError{*job, err}
	}
	r.Log.Info("first start: backfilling the rows committed before the slot", "table", job.Table, "where", job.Where, "rows", job.Total, "lsn", at.String())
	r.logOrder("the first start's backfill", plan)
	rd := &reader{job: job, plan: plan, dec: dec, next: func() (tableread.Chunk, error) { return plan.Read(ctx, conn, job.After, nil) }}
	if !plan.InCommitOrder() {
		job.Key = plan.Key
		return rd, nil
	}
	cur, err := plan.Open(ctx, conn, job.After, job.Horizon, job.Whole)
	if err != nil {
		return nil, &jobError{*job, err}
	}
	job.Order, job.Horizon, rd.cur, rd.next = string(plan.Order), cur.Horizon, cur, func() (tableread.Chunk, error) { return cur.Next(ctx) }
	rd.fresh = job.After == nil && conn.PgConn().TxStatus() != 'I'
	return rd, nil
}

// sendReads sends the rows of jobs from conn's snapshot before the
// stream, as events committed at at, the slot's consistent point. Two
// outbox tables can carry one aggregate's events (rule 32, "An aggregate
// keeps its order on every path"): read in the same order of the commits,
// their rows merge as the stream would have sent them
// (tableread.Plan.CommitBefore); a table read in order_by has no order
// that compares across tables: it is sent alone, as soon as it is opened.
// Each job has its progress when it returns.
func (r *Runner) sendReads(ctx context.Context, s Session, conn *pgx.Conn, jobs []*checkpoint.Job, at pglogrepl.LSN) error {
	var rds []*reader
	for _, job := range jobs {
		rd, err := r.openRead(ctx, conn, job, at)
		switch {
		case err != nil:
			return err
		case rd.plan.InCommitOrder() && (len(rds) == 0 || rd.plan.Order == rds[0].plan.Order):
			rds = append(rds, rd)
		default: // order_by, or another order of the commits than the others'
			if len(jobs) > 1 && !r.SendUnknownOrder {
				return &errtext.Fatal{Msg: fmt.Sprintf("the backfill before the stream reads %s in %s, which compares with no other table's rows: an aggregate with events in it and in another of the %d tables would get them out of order; remove its tables[].backfill.order_by (its rows then merge with the others' in the order of the commits), or, if no aggregate has events in two tables, set backfill.on_unknown_order: send, and start again", job.Table, "the order of "+strings.Join(rd.plan.Key, ", "), len(jobs))}
			}
			if err := r.sendMerged(ctx, s, conn, []*reader{rd}, at); err != nil {
				return err
			}
		}
	}
	for _, rd := range rds { // they share the chunk's budget: memory holds one chunk's rows
		if len(rds) > 1 && r.ChunkBytes > 0 {
			rd.plan.SetBudget(max(r.ChunkBytes/int64(len(rds)), 1))
		}
	}
	if len(rds) == 0 {
		return nil
	}
	return r.sendMerged(ctx, s, conn, rds, at)
}

// sendMerged sends rds' rows in the order of their commits, holding a
// chunk of each, with at most max_in_flight events (and bytes)
// unacknowledged; it saves the jobs' progress once every status interval
// and as one ends.
func (r *Runner) sendMerged(ctx context.Context, s Session, conn *pgx.Conn, rds []*reader, at pglogrepl.LSN) error {
	started, saved, logged := time.Now(), time.Now(), time.Now()
	chunk := 1
	for _, rd := range rds {
		chunk = max(chunk, rd.plan.ChunkSize())
	}
	defer func() {
		for _, rd := range rds {
			rd.wait()
		}
	}()
	ahead, err := r.readAheadAlone(ctx, conn, rds, chunk)
	if err != nil {
		return &jobError{*rds[0].job, err}
	}
	held := r.ChunkBytes
	if ahead {
		held *= 2
	}
	limit, bytes := max(r.MaxInFlight-chunk, 1), int64(-1)
	if r.MaxInFlightBytes > 0 {
		bytes = max(r.MaxInFlightBytes-held, 0)
	}
	for {
		for _, rd := range rds {
			if (len(rd.rows) == 0 || rd.more) && !rd.final {
				c, err := rd.fetch()
				if err != nil {
					return &jobError{*rd.job, err}
				}
				if len(rd.rows) > 0 { // more: the rows left, then the next chunk's
					c.Rows = append(rd.rows, c.Rows...)
				}
				rd.rows, rd.final, rd.more = c.Rows, c.Final, false
			}
		}
		finished, err := r.sendInOrder(s, rds, at)
		if err != nil {
			return r.stopOnEvent(ctx, s, rds, err)
		}
		if err := s.WaitRoom(ctx, limit, bytes); err != nil {
			return err
		}
		done := true
		for _, rd := range rds {
			done = done && rd.final && len(rd.rows) == 0
		}
		if finished || done || time.Since(saved) >= r.StatusInterval {
			if err := saveAll(ctx, s, rds); err != nil {
				return err
			}
			saved = time.Now()
		}
		tick := time.Since(logged) >= progressEvery
		for _, rd := range rds {
			if end := !rd.job.Finished.IsZero(); tick && !end || end && !rd.ended {
				rd.ended = end
				r.progressLog(*rd.job, rd.sent, started, end)
			}
		}
		if tick {
			logged = time.Now()
		}
		if done {
			return nil
		}
	}
}

// readAheadAlone reads rds' cursor ahead, when it is one alone, and
// reports whether it does. A cursor alone on its connection reads its
// next rows while those of one read are sent: Postgres and the connector
// take turns otherwise, and the reads were two thirds of a backfill's
// time (docs/benchmarks.md, "Backfill"). Only a cursor's: a chunk in
// order_by reads after the job's position, which the rows sent move;
// readers of several tables share one connection. It reads several
// chunks' rows a FETCH, handed out a chunk at a time, so that the events
// in flight keep their room for a chunk's rows. The read ahead is held
// too: the bytes in flight leave room for two reads. A fresh read alone
// is a COPY of the cursor's query, which holds as much (readahead.Copy).
func (r *Runner) readAheadAlone(ctx context.Context, conn *pgx.Conn, rds []*reader, chunk int) (bool, error) {
	if len(rds) != 1 || !rds[0].plan.InCommitOrder() {
		return false, nil
	}
	rd := rds[0]
	cursor := func() *readahead.Reader {
		rd.plan.SetReadRows(chunk * readChunks)
		return readahead.New(func() ([][][]byte, bool, error) {
			c, err := rd.next()
			return c.Rows, c.Final, err
		}, chunk)
	}
	if p := rd.plan; rd.fresh {
		// Past a commit the copy flags, the cursor reads on.
		rest := func(n int64) (*readahead.Reader, error) {
			if err := rd.cur.Skip(ctx, n); err != nil {
				return nil, err
			}
			return cursor(), nil
		}
		c, err := readahead.StartCopy(ctx, conn, p.Table.String(), p.CopySQL(), copyread.Options{Width: len(p.Columns), Rows: chunk, Budget: p.Budget(), FirstRow: r.StatementTimeout, Flagged: true}, rest)
		if c != nil {
			rd.ahead = c
		}
		return true, err
	}
	rd.ahead = cursor()
	return true, nil
}

// sendInOrder sends one transaction: rds' rows in the order of their
// commits, until a read with more to read has none left in its chunk (its
// next row may be the earliest). It moves each job past the rows sent and
// reports whether one finished.
func (r *Runner) sendInOrder(s Session, rds []*reader, at pglogrepl.LSN) (finished bool, err error) {
	now := time.Now()
	if err := s.Begin(now); err != nil {
		return false, err
	}
	took := make([]int, len(rds))
	// One message for the rows of this call, not one each (483 bytes a
	// row, a third of a backfill's allocations): Event keeps no pointer
	// into it once it returns, as the stream's one message relies on
	// (package session's msg).
	m := new(decode.Message)
	prev, prevRow := (*reader)(nil), [][]byte(nil) // the last row sent, and its read
	defer func() {
		if err != nil && !errors.As(err, new(*outbox.EventError)) {
			return // the session fails: nothing it sent counts
		}
		for i, rd := range rds {
			if n := took[i]; n > 0 {
				rd.job.Rows, rd.job.After, rd.job.Whole, rd.sent = rd.job.Rows+int64(n), rd.plan.KeyOf(rd.rows[n-1]), false, rd.sent+int64(n)
				rd.rows = rd.rows[n:]
				r.Metrics.BackfillRows(rd.job.Table).Add(float64(n))
			}
			if err == nil && rd.final && len(rd.rows) == 0 && rd.job.Finished.IsZero() {
				rd.job.Finished, finished = now, true
			}
		}
	}()
	for {
		best := -1
		for i, rd := range rds {
			switch {
			case took[i] == len(rd.rows) && !rd.final:
				s.Commit(at, now)
				return false, nil
			case took[i] == len(rd.rows):
			case best < 0 || rd.plan.CommitBefore(rd.rows[took[i]], rds[best].plan, rds[best].rows[took[best]]):
				best = i
			}
		}
		if best < 0 {
			s.Commit(at, now)
			return false, nil
		}
		rd := rds[best]
		if !r.SendUnknownOrder && (prev == nil || prev.plan.CommitBefore(prevRow, rd.plan, rd.rows[took[best]])) {
			heads := make([]tableread.Head, len(rds))
			for i, rd := range rds {
				heads[i] = tableread.Head{Plan: rd.plan, Dec: rd.dec, Rows: rd.rows[took[i]:], Final: rd.final}
			}
			more, err := tableread.Crossing(heads, best, at, now, r.KeyOf)
			if more >= 0 { // its next chunk onto it: the commit's rows across tables are checked whole
				rds[more].more = true
				s.Commit(at, now)
				return false, nil
			}
			if err != nil {
				return false, err
			}
		}
		prev, prevRow = rd, rd.rows[took[best]]
		var err error
		*m, err = rd.dec.Row(rd.rows[took[best]], at, now)
		if err == nil {
			err = s.Event(m)
		}
		if err != nil {
			if errors.As(err, new(*outbox.EventError)) {
				s.Commit(at, now) // what it sent before is kept (stopOnEvent)
			}
			return false, &jobError{*rd.job, err}
		}
		took[best]++
	}
}

// stopOnEvent is err, an event's the connector stops on (on_invalid:
// fail, max_parked_keys), once what was sent before is acknowledged and
// saved with the keys parked, as the stream does: cdc parked shows what to
// redrive. Each job then resumes at the event it stopped on.
func (r *Runner) stopOnEvent(ctx context.Context, s Session, rds []*reader, err error) error {
	if !errors.As(err, new(*outbox.EventError)) {
		return err
	}
	if serr := saveAll(ctx, s, rds); serr != nil {
		r.Log.Warn("backfill: the keys parked before the event it stops on are not in the checkpoint: they are parked again as it starts again", "error", errtext.OneLine(serr))
	}
	return err
}

// saveAll saves every job's progress once all sent is acknowledged; a
// job that sent its last commit whole resumes past it.
func saveAll(ctx context.Context, s Session, rds []*reader) error {
	for _, rd := range rds {
		next, final := rd.rows, rd.final // the rows after those sent
		if len(next) == 0 && rd.ahead != nil {
			pending, last := rd.ahead.Pending()
			next, final = pending, final || last && len(pending) == 0
		}
		rd.job.Whole = rd.plan.Whole(rd.job.After, next, final)
		if err := saveAcked(ctx, s, *rd.job); err != nil {
			return err
		}
	}
	return nil
}
