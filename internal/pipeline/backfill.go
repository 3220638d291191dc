package pipeline

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxcdc/cdc/internal/backfill"
	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/wal"
)

// Backfills (docs/design.md, "Backfill") come in two kinds.
//
// The first start's backfill reads, in the snapshot the slot exported as
// it was created, the rows each table's backfill.where selects, and sends
// them before the stream's first transaction: a row committed before the
// slot's consistent point is in the snapshot and not in the stream, one
// committed after is in the stream and not in the snapshot (rule 18).
//
// Any other backfill runs while the stream does, in chunks between two
// watermarks, logical decoding messages written before and after the
// chunk is read (the DBLog approach). The chunk is held until the stream
// reaches its high watermark, and sent there, in the watermark's
// transaction; a row whose INSERT the stream met between the watermarks is
// not sent from the chunk, since the stream sent it at its own place. A
// chunk's rows thus never overtake, nor double, live events the stream
// sends around them, and the job's progress (the last key sent) becomes
// part of the checkpoint of the watermark's position, so a restart goes on
// from the last chunk Kafka acknowledged. A first-start backfill that was
// interrupted goes on this way.

// control is a message with decode.ControlPrefix.
type control struct {
	Type  string `json:"type"` // controlRequest, controlLow, controlHigh, controlFail
	ID    string `json:"id,omitempty"`
	Run   string `json:"run,omitempty"`
	Job   string `json:"job,omitempty"`
	Chunk int    `json:"chunk,omitempty"`
	Error string `json:"error,omitempty"`
}

const (
	controlRequest = "backfill-request"
	controlLow     = "backfill-low"
	controlHigh    = "backfill-high"
	controlFail    = "backfill-fail"
)

// ControlMessage is the SQL that announces backfill request id to a
// running pipeline: cdc backfill runs it after saving the request.
func ControlMessage(id string) (string, []any) {
	b, _ := json.Marshal(control{Type: controlRequest, ID: id})
	return "SELECT pg_logical_emit_message(true, $1, $2::text)", []any{decode.ControlPrefix, string(b)}
}

// backfills is the pipeline's jobs as far as the stream has read: the
// saved checkpoint's at the start of each session, then changed by the
// stream's control messages. The stream's goroutine changes it; the job
// runner reads it.
type backfills struct {
	mu sync.Mutex
	// run names this session's job runner in its watermarks and failures:
	// random, and read only by logical decoding (a REPLICATION role), so a
	// message another role writes cannot pass for one of them.
	run   string
	jobs  []checkpoint.Backfill
	chunk *liveChunk    // the chunk between its watermarks
	wake  chan struct{} // a job was added
}

// liveChunk is one chunk of a backfill running beside the stream.
type liveChunk struct {
	run, job string
	n        int
	table    *outbox.Table
	// seen holds the ids of the table's events the stream met since the
	// low watermark, at low; the stream's goroutine alone uses them.
	seen map[string]struct{}
	low  pglogrepl.LSN
	// Set by the runner before it writes the high watermark.
	rows  *backfill.Chunk
	dec   *decode.RowDecoder
	total int64
	until []string
	done  chan struct{} // closed once the stream handled the high watermark
}

func (b *backfills) reset(jobs []checkpoint.Backfill) {
	b.mu.Lock()
	b.run = newID()
	b.jobs = slices.Clone(jobs)
	b.chunk = nil
	b.mu.Unlock()
}

// next returns the first unfinished job.
func (b *backfills) next() (checkpoint.Backfill, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, j := range b.jobs {
		if !j.Done() {
			return j, true
		}
	}
	return checkpoint.Backfill{}, false
}

func (b *backfills) has(id string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.ContainsFunc(b.jobs, func(j checkpoint.Backfill) bool { return j.ID == id })
}

// update changes job id with f (a new job when there is none) and
// returns a copy of the list, for a checkpoint note.
func (b *backfills) update(id string, f func(*checkpoint.Backfill)) []checkpoint.Backfill {
	b.mu.Lock()
	defer b.mu.Unlock()
	j := checkpoint.Backfill{ID: id}
	if i := slices.IndexFunc(b.jobs, func(j checkpoint.Backfill) bool { return j.ID == id }); i >= 0 {
		j = b.jobs[i]
	}
	f(&j)
	rec := checkpoint.Record{Backfills: b.jobs}
	rec.SetBackfill(j)
	b.jobs = rec.Backfills
	return slices.Clone(b.jobs)
}

func (b *backfills) signal() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// newID is a random identifier for a job or a run.
func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// table returns the configured table SQL names name.
func (p *Pipeline) table(name string) *outbox.Table {
	for _, t := range p.cfg.Tables {
		if !t.IsMessage() && t.String() == name {
			return t
		}
	}
	return nil
}

// initialJobs are the first start's backfills: one per table with
// backfill set.
func (p *Pipeline) initialJobs(initial bool) []checkpoint.Backfill {
	var jobs []checkpoint.Backfill
	for _, t := range p.cfg.Tables {
		if t.Backfill != nil {
			jobs = append(jobs, checkpoint.Backfill{ID: "first-start:" + t.String(), Table: t.String(), Where: t.Backfill.Where, Initial: initial, Started: time.Now()})
		}
	}
	return jobs
}

// plan works out job's queries on conn.
func (p *Pipeline) plan(ctx context.Context, conn *pgx.Conn, job checkpoint.Backfill) (*backfill.Plan, *decode.RowDecoder, error) {
	t := p.table(job.Table)
	if t == nil {
		return nil, nil, &backfill.Error{Msg: fmt.Sprintf("backfill %s: table %s is not in the configuration any more", job.ID, job.Table)}
	}
	var orderBy []string
	chunk := outbox.DefaultChunkSize
	if t.Backfill != nil {
		orderBy, chunk = t.Backfill.OrderBy, t.Backfill.ChunkSize
	}
	plan, err := backfill.NewPlan(ctx, conn, t, job.Where, orderBy, chunk)
	if err != nil {
		return nil, nil, err
	}
	dec, err := decode.NewRowDecoder(t, plan.Columns)
	if err != nil {
		return nil, nil, err
	}
	return plan, dec, nil
}

// checkBackfills has the server check each job's queries.
func (p *Pipeline) checkBackfills(ctx context.Context, jobs []checkpoint.Backfill) error {
	conn, err := wal.ConnectRows(ctx, p.cfg.Postgres, p.cfg.Backfill.StatementTimeout)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, j := range jobs {
		if _, _, err := p.plan(ctx, conn, j); err != nil {
			return err
		}
	}
	return nil
}

// progressEvery is how often a running backfill logs its progress.
const progressEvery = 5 * time.Second

// progressLog logs a job's progress: rows, rate and time left.
func (p *Pipeline) progressLog(job checkpoint.Backfill, rows int64, since time.Time, final bool) {
	rate := float64(rows) / max(time.Since(since).Seconds(), 0.001)
	l := []any{"table", job.Table, "job", job.ID, "rows", job.Rows, "total", job.Total, "rows_per_second", int64(rate)}
	if final {
		p.log.Info("backfill finished", l...)
		return
	}
	if left := job.Total - job.Rows; left > 0 && rate > 0 {
		l = append(l, "eta", (time.Duration(float64(left) / rate * float64(time.Second))).Round(time.Second).String())
	}
	p.log.Info("backfill progress", l...)
}

// initialBackfill sends the first start's backfills from snapshot, before
// the stream starts at at, the slot's consistent point. The events are
// tracked in transactions that end at at, so nothing is confirmed past it
// until the stream runs; the jobs' progress goes to the checkpoint as it
// is acknowledged, and an interruption is continued beside the stream.
func (p *Pipeline) initialBackfill(ctx context.Context, s *session, snapshot string, at pglogrepl.LSN) error {
	conn, err := wal.ConnectRows(ctx, p.cfg.Postgres, p.cfg.Backfill.StatementTimeout)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"); err != nil {
		return fmt.Errorf("backfill: begin: %w", err)
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("SET TRANSACTION SNAPSHOT '%s'", snapshot)); err != nil {
		return fmt.Errorf("backfill: import the slot's snapshot %s: %w", snapshot, err)
	}
	for _, job := range p.progress.Saved().Backfills {
		if job.Done() || !job.Initial {
			continue
		}
		if err := p.initialJob(ctx, s, conn, job, at); err != nil {
			return err
		}
	}
	_, err = conn.Exec(ctx, "COMMIT")
	return err
}

func (p *Pipeline) initialJob(ctx context.Context, s *session, conn *pgx.Conn, job checkpoint.Backfill, at pglogrepl.LSN) error {
	plan, dec, err := p.plan(ctx, conn, job)
	if err != nil {
		return err
	}
	if job.Total, err = plan.Count(ctx, conn); err != nil {
		return err
	}
	p.log.Info("first start: backfilling the rows committed before the slot", "table", job.Table, "where", job.Where, "rows", job.Total, "lsn", at.String())
	started, saved, logged := time.Now(), time.Now(), time.Now()
	rows0 := job.Rows
	limit := max(p.cfg.MaxInFlight-plan.ChunkSize(), 1)
	for {
		c, err := plan.Read(ctx, conn, job.After, nil)
		if err != nil {
			return err
		}
		now := time.Now()
		if s.eos != nil {
			if err := s.eos.begin(); err != nil {
				return err
			}
		}
		s.tx = s.tracker.Begin(now)
		for _, row := range c.Rows {
			m, err := dec.Row(row, at, now)
			if err != nil {
				return err
			}
			if err := s.event(&m); err != nil {
				return err
			}
		}
		s.tracker.Commit(s.tx, at, at, now)
		s.tx = nil
		s.kafka.Release(time.Time{})
		p.m.BackfillRows(job.Table).Add(float64(len(c.Rows)))
		job.Rows += int64(len(c.Rows))
		if c.Last != nil {
			job.After = c.Last
		}
		if c.Final {
			job.Finished = time.Now()
		}
		// Keep at most max_in_flight events unacknowledged; save the
		// progress once every status interval, when all of it is acked.
		if err := waitInFlight(ctx, s, limit); err != nil {
			return err
		}
		if c.Final || time.Since(saved) >= p.cfg.Postgres.StatusInterval {
			if err := waitInFlight(ctx, s, 0); err != nil {
				return err
			}
			if err := p.saveJob(ctx, s, job); err != nil {
				return err
			}
			saved = time.Now()
		}
		if c.Final {
			p.progressLog(job, job.Rows-rows0, started, true)
			return nil
		}
		if time.Since(logged) >= progressEvery {
			p.progressLog(job, job.Rows-rows0, started, false)
			logged = time.Now()
		}
	}
}

// waitInFlight waits until at most n events are unacknowledged.
func waitInFlight(ctx context.Context, s *session, n int) error {
	for {
		if err := s.tracker.Err(); err != nil {
			return err
		}
		if s.tracker.InFlight() <= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.tracker.Changed():
		}
	}
}

// saveJob writes the checkpoint with job's progress, through the session's
// producer, and waits for it.
func (p *Pipeline) saveJob(ctx context.Context, s *session, job checkpoint.Backfill) error {
	if s.eos != nil {
		// Exactly once: the progress goes in the transaction with the
		// rows it counts.
		return s.eos.commitNow(ctx, func(r *checkpoint.Record) { r.SetBackfill(job) })
	}
	rec := p.progress.Saved()
	rec.SetBackfill(job)
	rec.UpdatedAt = time.Now()
	kr, err := p.store.NewRecord(rec)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	s.kafka.Produce(kr, func(err error) { done <- err })
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("write the backfill's progress to the checkpoint: %w", err)
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	p.progress.Store(rec)
	return nil
}

// control handles one of the connector's own messages in the stream.
func (s *session) control(m *decode.Message) error {
	var c control
	if err := json.Unmarshal(m.Control, &c); err != nil {
		s.p.log.Warn("ignored a logical decoding message with the connector's prefix that does not parse", "prefix", decode.ControlPrefix, "error", err.Error())
		return nil
	}
	bf := &s.p.bf
	switch c.Type {
	case controlRequest:
		return s.request(c.ID)
	case controlLow:
		bf.mu.Lock()
		if ch := bf.chunk; ch != nil && ch.run == c.Run && ch.job == c.Job && ch.n == c.Chunk {
			ch.seen, ch.low = map[string]struct{}{}, m.Commit
			s.window = ch
		}
		bf.mu.Unlock()
	case controlHigh:
		ch := s.window
		if ch == nil || ch.run != c.Run || ch.job != c.Job || ch.n != c.Chunk {
			return nil // a watermark of an earlier run, read again after a restart
		}
		s.window = nil
		bf.mu.Lock()
		rows, dec, total := ch.rows, ch.dec, ch.total
		bf.chunk = nil
		bf.mu.Unlock()
		if rows == nil {
			return fmt.Errorf("internal: backfill chunk %d of %s reached its high watermark without rows", ch.n, ch.job)
		}
		sent := 0
		for _, row := range rows.Rows {
			ev, err := dec.Row(row, m.Commit, m.CommitTime)
			if err != nil {
				return err
			}
			if _, live := ch.seen[ev.Event.ID()]; live {
				continue // the stream sent it, in its place
			}
			if err := s.event(&ev); err != nil {
				return err
			}
			sent++
		}
		s.p.m.BackfillRows(ch.table.String()).Add(float64(sent))
		if f := s.p.opts.OnBackfillChunk; f != nil {
			f(ch.low, m.Commit, len(rows.Rows), sent)
		}
		jobs := bf.update(ch.job, func(j *checkpoint.Backfill) {
			j.Rows += int64(sent)
			if rows.Last != nil {
				j.After = rows.Last
			}
			if j.Total == 0 {
				j.Total = total
			}
			if j.Until == nil {
				j.Until = ch.until
			}
			if rows.Final {
				j.Finished = time.Now()
			}
		})
		s.tracker.Note(s.tx, jobs)
		close(ch.done)
	case controlFail:
		bf.mu.Lock()
		ours := c.Run != "" && c.Run == bf.run
		bf.mu.Unlock()
		if !ours || !bf.has(c.Job) {
			// Not this session's runner: another role's message, or one of
			// an earlier session's, read again (its job runs again).
			return nil
		}
		jobs := bf.update(c.Job, func(j *checkpoint.Backfill) {
			if !j.Done() {
				j.Finished, j.Error = time.Now(), c.Error
			}
		})
		s.tracker.Note(s.tx, jobs)
	}
	return nil
}

// jobEnding reports whether err is a server error that running the job
// again would meet again: the condition's own (a data exception, class 22;
// a statement refused, class 42; a write in the read-only transaction,
// 25006) or backfill.statement_timeout (57014). Connection errors and the
// like are retried.
func jobEnding(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	return strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "42") || pe.Code == "25006" || pe.Code == "57014"
}

// storedError is what the checkpoint keeps of why a job ended: the
// SQLSTATE of a server error and, for a statement the server refused or
// cancelled, its message; never a message that may quote row data (a bad
// value's text). The log has the whole error.
func storedError(err error) string {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		var bad *backfill.Error
		if errors.As(err, &bad) {
			return errtext.OneLine(err) // the plan's: names and the condition, no rows
		}
		return "the backfill failed (the connector's log has the error)"
	}
	if strings.HasPrefix(pe.Code, "42") || pe.Code == "57014" || pe.Code == "25006" {
		return fmt.Sprintf("SQLSTATE %s: %s", pe.Code, pe.Message)
	}
	return fmt.Sprintf("SQLSTATE %s (the connector's log has the message)", pe.Code)
}

// request takes backfill request id, if cdc backfill wrote it to the
// checkpoint topic, as a job that starts at this point of the stream.
func (s *session) request(id string) error {
	bf := &s.p.bf
	if id == "" || bf.has(id) {
		return nil // read again after a restart
	}
	ctx, cancel := context.WithTimeout(s.ctx, 15*time.Second)
	defer cancel()
	var req checkpoint.BackfillRequest
	var ok bool
	// The follower has read the request already (cdc backfill writes it
	// before it announces it in the WAL): this seldom waits.
	err := s.blocking(func() (err error) {
		req, ok, err = s.requests.Get(ctx, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("read backfill request %s: %w", id, err)
	}
	if !ok {
		s.p.log.Warn("ignored a backfill request that cdc backfill did not write to the checkpoint topic", "id", id)
		return nil
	}
	saved := s.p.progress.Saved()
	switch keys := s.p.cfg.Checkpoint.SigningKeys; {
	case len(keys) == 0:
		s.p.log.Warn("ignored a backfill request: cdc run has no checkpoint.signing_key_file to check it was cdc backfill's; set the same file for both", "id", id)
		return nil
	case !req.Verify(keys, saved.Key()):
		s.p.log.Warn("ignored a backfill request whose signature does not verify: written by someone without checkpoint.signing_key_file's key, or with another key", "id", id)
		s.p.m.ForgedRequests.Inc()
		return nil
	}
	if t := s.p.table(req.Table); t == nil {
		s.p.log.Warn("ignored a backfill request for a table that is not configured", "id", id, "table", req.Table)
		return nil
	}
	jobs := bf.update(id, func(j *checkpoint.Backfill) {
		*j = checkpoint.Backfill{ID: id, Table: req.Table, Where: req.Where, Started: time.Now()}
	})
	s.tracker.Note(s.tx, jobs)
	s.p.log.Info("backfill requested", "id", id, "table", req.Table, "where", req.Where)
	bf.signal()
	return nil
}

// runBackfills runs the jobs beside the stream until ctx is done, one at a
// time, in order.
func (p *Pipeline) runBackfills(ctx context.Context) {
	p.bf.mu.Lock()
	run := p.bf.run
	p.bf.mu.Unlock()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.WithoutCancel(ctx))
		}
	}()
	backoff := p.cfg.RetryBackoff
	for ctx.Err() == nil {
		job, ok := p.bf.next()
		if !ok {
			select {
			case <-ctx.Done():
			case <-p.bf.wake:
			}
			continue
		}
		var err error
		if conn == nil {
			conn, err = wal.ConnectRows(ctx, p.cfg.Postgres, p.cfg.Backfill.StatementTimeout)
		}
		if err == nil {
			err = p.runJob(ctx, conn, run, job)
		}
		if ctx.Err() != nil {
			return
		}
		var bad *backfill.Error
		switch {
		case errors.As(err, &bad), jobEnding(err):
			// The job cannot run as asked: end it, in the stream's
			// order, with the reason in the checkpoint.
			p.log.Error("backfill failed; it is ended, and cdc backfill can start it again once the cause is fixed", "job", job.ID, "table", job.Table, "error", errtext.OneLine(err))
			err = emit(ctx, conn, control{Type: controlFail, Run: run, Job: job.ID, Error: storedError(err)})
			if err == nil {
				err = p.waitDone(ctx, job.ID)
			}
		case err != nil:
			p.log.Warn("backfill interrupted; retrying", "job", job.ID, "table", job.Table, "error", errtext.OneLine(err), "retry_in", backoff)
		}
		if err != nil {
			if conn != nil {
				conn.Close(context.WithoutCancel(ctx))
				conn = nil
			}
			t := time.NewTimer(jitter(backoff))
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			backoff = min(2*backoff, p.cfg.RetryBackoffMax)
			continue
		}
		backoff = p.cfg.RetryBackoff
	}
}

// waitDone waits until the stream finished job id.
func (p *Pipeline) waitDone(ctx context.Context, id string) error {
	for {
		p.bf.mu.Lock()
		done := !slices.ContainsFunc(p.bf.jobs, func(j checkpoint.Backfill) bool { return j.ID == id && !j.Done() })
		p.bf.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// runJob runs job's chunks between watermarks until the last.
func (p *Pipeline) runJob(ctx context.Context, conn *pgx.Conn, run string, job checkpoint.Backfill) error {
	plan, dec, err := p.plan(ctx, conn, job)
	if err != nil {
		return err
	}
	total := job.Total
	if total == 0 {
		if total, err = plan.Count(ctx, conn); err != nil {
			return err
		}
	}
	if job.Rows == 0 {
		p.log.Info("backfill starting beside the stream", "job", job.ID, "table", job.Table, "where", job.Where, "rows", total)
	} else {
		p.log.Info("backfill resuming", "job", job.ID, "table", job.Table, "rows_sent", job.Rows, "total", total)
	}
	// Stop at the last row that matches now: the stream sends the rows
	// committed from now on, and a backfill that chased them on a busy
	// table would never end.
	until := job.Until
	if until == nil {
		if until, err = plan.Last(ctx, conn); err != nil {
			return err
		}
	}
	after := job.After
	started, logged, rows0 := time.Now(), time.Now(), job.Rows
	for n := 0; ; n++ {
		ch := &liveChunk{run: run, job: job.ID, n: n, table: plan.Table, dec: dec, total: total, until: until, done: make(chan struct{})}
		p.bf.mu.Lock()
		p.bf.chunk = ch
		p.bf.mu.Unlock()
		if err := emit(ctx, conn, control{Type: controlLow, Run: run, Job: job.ID, Chunk: n}); err != nil {
			return err
		}
		c, err := readChunk(ctx, conn, plan, after, until)
		if err != nil {
			return err
		}
		p.bf.mu.Lock()
		ch.rows = &c
		p.bf.mu.Unlock()
		if err := emit(ctx, conn, control{Type: controlHigh, Run: run, Job: job.ID, Chunk: n}); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch.done:
		}
		if c.Last != nil {
			after = c.Last
		}
		if j, ok := p.bf.next(); c.Final || !ok || j.ID != job.ID {
			cur := p.job(job.ID)
			p.progressLog(cur, cur.Rows-rows0, started, true)
			return nil
		}
		if time.Since(logged) >= progressEvery {
			cur := p.job(job.ID)
			p.progressLog(cur, cur.Rows-rows0, started, false)
			logged = time.Now()
		}
	}
}

// job returns job id as the stream has it.
func (p *Pipeline) job(id string) checkpoint.Backfill {
	p.bf.mu.Lock()
	defer p.bf.mu.Unlock()
	for _, j := range p.bf.jobs {
		if j.ID == id {
			return j
		}
	}
	return checkpoint.Backfill{ID: id}
}

// readChunk reads one chunk in a read-only transaction of its own, which
// starts after the low watermark committed. Without an end (nothing
// matched at the start) there is nothing to read.
func readChunk(ctx context.Context, conn *pgx.Conn, plan *backfill.Plan, after, until []string) (backfill.Chunk, error) {
	if until == nil {
		return backfill.Chunk{Final: true}, nil
	}
	if _, err := conn.Exec(ctx, "BEGIN READ ONLY"); err != nil {
		return backfill.Chunk{}, err
	}
	c, err := plan.Read(ctx, conn, after, until)
	if err != nil {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		return backfill.Chunk{}, err
	}
	if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
		return backfill.Chunk{}, err
	}
	return c, nil
}

// emit writes c as a transactional logical decoding message, in a
// transaction of its own.
func emit(ctx context.Context, conn *pgx.Conn, c control) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "SELECT pg_logical_emit_message(true, $1, $2::text)", decode.ControlPrefix, string(b)); err != nil {
		return fmt.Errorf("write a backfill watermark: %w", err)
	}
	return nil
}

// Requested is what RequestBackfill started.
type Requested struct {
	ID    string
	Table string
	Where string
	Rows  int64 // rows matching now
	key   string
}

// RequestBackfill asks the running pipeline (cdc run with this config) to
// backfill table's rows matching where, beside its stream. It checks the
// table, the condition and the order first, and sends nothing when they
// are wrong. The request goes to the checkpoint topic; a logical decoding
// message with its ID tells the pipeline, at a point of the stream, which
// is where the job starts.
func (p *Pipeline) RequestBackfill(ctx context.Context, t *outbox.Table, where string) (Requested, error) {
	if len(p.cfg.Checkpoint.SigningKeys) == 0 {
		return Requested{}, &wal.SetupError{Msg: "cdc backfill signs its request with checkpoint.signing_key_file's key, and cdc run takes only signed ones; set it (the same file, or CDC_CHECKPOINT_SIGNING_KEY_FILE) for both: openssl rand -hex 32 > signing.key"}
	}
	rows, err := wal.ConnectRows(ctx, p.cfg.Postgres, p.cfg.Backfill.StatementTimeout)
	if err != nil {
		return Requested{}, err
	}
	defer rows.Close(context.WithoutCancel(ctx))
	job := checkpoint.Backfill{ID: newID(), Table: t.String(), Where: where}
	plan, _, err := p.plan(ctx, rows, job)
	if err != nil {
		return Requested{}, err
	}
	total, err := plan.Count(ctx, rows)
	if err != nil {
		return Requested{}, err
	}
	conn, err := wal.Connect(ctx, p.cfg.Postgres, p.log.Named("wal"))
	if err != nil {
		return Requested{}, err
	}
	sys := conn.System()
	conn.Close(context.WithoutCancel(ctx))
	rec, err := p.loadRecord(ctx, sys)
	if err != nil {
		return Requested{}, err
	}
	if a := rec.ActiveBackfill(); a != nil {
		return Requested{}, &wal.SetupError{Msg: fmt.Sprintf("backfill %s of %s is running (%d of %d rows); wait for it to finish (cdc status shows it), then ask again", a.ID, a.Table, a.Rows, a.Total)}
	}
	req := checkpoint.BackfillRequest{ID: job.ID, Table: job.Table, Where: where, RequestedAt: time.Now()}
	req.Sign(p.cfg.Checkpoint.SigningKeys[0], rec.Key())
	if err := p.store.SaveRequest(ctx, rec.Key(), req); err != nil {
		return Requested{}, err
	}
	sql, args := ControlMessage(job.ID)
	if _, err := rows.Exec(ctx, sql, args...); err != nil {
		return Requested{}, fmt.Errorf("announce the backfill to the connector (pg_logical_emit_message): %w", err)
	}
	return Requested{ID: job.ID, Table: job.Table, Where: where, Rows: total, key: rec.Key()}, nil
}

// WatchBackfill follows job r in the checkpoint, calling show with its
// state (zero until the pipeline started it) about once a second, until
// it is done or ctx ends. A job that ended on an error returns it.
func (p *Pipeline) WatchBackfill(ctx context.Context, r Requested, show func(checkpoint.Backfill)) (checkpoint.Backfill, error) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		recs, err := p.store.Load(ctx, false)
		if err != nil {
			return checkpoint.Backfill{}, err
		}
		var job checkpoint.Backfill
		if rec, ok := recs[r.key]; ok {
			if j := rec.FindBackfill(r.ID); j != nil {
				job = *j
			}
		}
		show(job)
		if job.Done() {
			if job.Error != "" {
				return job, fmt.Errorf("backfill %s of %s failed: %s", job.ID, job.Table, job.Error)
			}
			return job, nil
		}
		select {
		case <-ctx.Done():
			return job, ctx.Err()
		case <-t.C:
		}
	}
}
