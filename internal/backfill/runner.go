package backfill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/metrics"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/retry"
	"github.com/outboxcdc/cdc/internal/tableread"
)

// Runner runs the jobs: the first start's in the slot's snapshot
// (FirstStart), what the configuration's jobs left before the next
// session's stream (Continue), and the operator's beside the stream,
// chunk by chunk between watermarks (Run). Its fields are the pipeline's
// config.
type Runner struct {
	Postgres         postgres.Config
	StatementTimeout time.Duration // backfill.statement_timeout
	// ReaderRole is backfill.reader_role: what a condition runs as.
	ReaderRole string
	Tables     []*outbox.Source
	// MaxInFlight and MaxInFlightBytes bound the first start's
	// unacknowledged events; the progress is saved once every
	// StatusInterval.
	MaxInFlight      int
	MaxInFlightBytes int64
	StatusInterval   time.Duration
	// ChunkBytes bounds the bytes of a chunk's rows
	// (tableread.Plan.SetBudget): a chunk is read only once the events in
	// flight leave room for it, so memory holds at most ChunkBytes of rows
	// besides what waits for Kafka (twice ChunkBytes for a cursor that
	// reads ahead, with as much less in flight: sendMerged).
	ChunkBytes int64
	// Room, when set, waits until the events in flight beside the stream
	// leave room for a chunk of ChunkBytes: the session's tracker.
	Room func(ctx context.Context) error
	// A job that was interrupted is retried after Backoff, doubling up
	// to BackoffMax (retry.Backoff, as the pipeline's reconnects).
	Backoff, BackoffMax time.Duration
	// SendUnknownOrder is backfill.on_unknown_order: send: the reads
	// before the stream send, table by table, where the tables do not tell
	// an aggregate's order across them, instead of stopping.
	SendUnknownOrder bool
	// KeyOf is an event's record key, as routed: the unit whose order the
	// reads before the stream keep across tables (tableread.Crossing).
	KeyOf   func(*outbox.Event) ([]byte, error)
	Log     hclog.Logger
	Metrics *metrics.Metrics
}

// ChunkBytes is a chunk's byte budget for max_in_flight_bytes inFlight: a
// sixteenth of it, at most 4 MiB. Memory holds a chunk's rows besides what
// waits for Kafka; the Helm chart's memory limit counts both
// (docs/kubernetes.md).
func ChunkBytes(inFlight int64) int64 { return min(inFlight/16, 4<<20) }

// plan works out job's queries on conn, in the order job is in: the one
// its saved position is in, or, for a job that has none, the one the
// configuration and the server give (tableread.OrderAuto).
func (r *Runner) plan(ctx context.Context, conn *pgx.Conn, job checkpoint.Job) (*tableread.Plan, *decode.RowDecoder, error) {
	t := Table(r.Tables, job.Table)
	if t == nil {
		return nil, nil, gone("backfill %s: table %s is not in the configuration any more", job.ID, job.Table)
	}
	// The plan reads the relation the job began on; its rows are the
	// configured table's events (the decoder's source).
	read, err := r.relation(ctx, conn, job, t)
	if err != nil {
		return nil, nil, err
	}
	var orderBy []string
	chunk := outbox.DefaultChunkSize
	if t.Backfill != nil {
		orderBy, chunk = t.Backfill.OrderBy, t.Backfill.ChunkSize
	}
	order := tableread.Order(job.Order)
	switch {
	case job.After == nil && order == tableread.OrderColumns:
		order = tableread.OrderAuto
	// A saved position is read in its own order, whatever
	// backfill.order_by says now: another order's values, read as this
	// one's, skip rows without a word, and a job that could not resume
	// has no remedy before the stream.
	case job.After != nil && order != tableread.OrderColumns:
		orderBy = nil
	case job.After != nil && job.Key != nil:
		orderBy = job.Key
	}
	if job.After != nil && t.Backfill != nil && len(t.Backfill.OrderBy) > 0 && !slices.Equal(orderBy, t.Backfill.OrderBy) {
		r.Log.Warn("backfill: backfill.order_by changed since the job began; it resumes in the order its saved position is in", "job", job.ID, "table", job.Table, "order", job.Order, "key", strings.Join(job.Key, ","))
	}
	plan, err := tableread.NewPlan(ctx, conn, read, job.Where, orderBy, order, chunk)
	if err != nil {
		return nil, nil, err
	}
	if job.Leaves != nil {
		gone, err := tableread.MissingLeaves(ctx, conn, read, job.Leaves)
		if err != nil {
			return nil, nil, err
		}
		if len(gone) == 0 {
			if err := plan.ReadLeaves(ctx, conn, job.Leaves); err != nil {
				return nil, nil, err
			}
		} else {
			// A leaf swapped for a copy holds rows committed before the
			// job began in a table attached since: reading none of it
			// would lose them, reading it may send a foreign table's
			// rows. The loss is the worse.
			r.Log.Error("backfill: partitions the job began with were detached or dropped since (a leaf swapped for a copy?); it reads every partition the table has now, any attached since with rows not written as events included, so that no row committed before it began is lost", "job", job.ID, "table", job.Table, "gone", fmt.Sprint(gone))
		}
	}
	plan.Role = r.ReaderRole
	plan.SetBudget(r.ChunkBytes)
	dec, err := decode.NewRowDecoder(t, plan.Columns)
	if err != nil {
		return nil, nil, err
	}
	return plan, dec, nil
}

// relation is table t as job reads it: a first start's job reads the
// relation it began on (job.Rel), which holds the rows committed before
// the slot, under whatever name it has now: a swap while the job was
// unfinished (the table renamed away, another created under its name)
// leaves them there, and the new table's rows are the stream's and its
// repair's. A relation dropped before the job finished is an error that
// ends it, saying so: its unsent rows are gone.
func (r *Runner) relation(ctx context.Context, conn *pgx.Conn, job checkpoint.Job, t *outbox.Source) (*outbox.Source, error) {
	if job.Rel == 0 {
		return t, nil
	}
	var schema, name string
	err := conn.QueryRow(ctx, `SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1`, job.Rel).Scan(&schema, &name)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, gone("backfill %s of %s: the table it began on (relation %d) was dropped before it finished: its %d rows not sent yet are gone (%d sent)", job.ID, job.Table, job.Rel, max(job.Total-job.Rows, 0), job.Rows)
	}
	if err != nil {
		return nil, fmt.Errorf("backfill %s: look up its table: %w", job.ID, err)
	}
	if at := (outbox.TableName{Schema: schema, Name: name}); at != t.Name {
		r.Log.Warn("backfill: the table it began on has another name now (a swap, or a rename); it goes on reading that table, which holds its rows", "job", job.ID, "table", job.Table, "now", at.String())
		cp := *t
		cp.Name = at
		return &cp, nil
	}
	return t, nil
}

// logOrder says which order what (a job, a repair) reads plan's table
// in, and why (tableread.Plan.OrderNote): once for each job's run and each
// repair. Rule 32: where it may not be the commits', the log says so.
func (r *Runner) logOrder(what string, plan *tableread.Plan) {
	l := []any{"table", plan.Table.String(), "order", strings.Join(plan.Key, ", ")}
	if note, commits := plan.OrderNote(); commits {
		r.Log.Info(what+note, l...)
	} else {
		r.Log.Warn(what+note, l...)
	}
}

// Check has the server check each job's queries.
func (r *Runner) Check(ctx context.Context, jobs []checkpoint.Job) error {
	conn, err := postgres.ConnectRows(ctx, r.Postgres, r.StatementTimeout)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, j := range jobs {
		if _, _, err := r.plan(ctx, conn, j); err != nil {
			return err
		}
	}
	return nil
}

// progressEvery is how often a running backfill logs its progress.
const progressEvery = 5 * time.Second

// progressLog logs a job's progress: rows, rate and time left.
func (r *Runner) progressLog(job checkpoint.Job, rows int64, since time.Time, final bool) {
	rate := float64(rows) / max(time.Since(since).Seconds(), 0.001)
	l := []any{"table", job.Table, "job", job.ID, "rows", job.Rows, "total", job.Total, "rows_per_second", int64(rate)}
	if final {
		r.Log.Info("backfill finished", l...)
		return
	}
	if left := job.Total - job.Rows; left > 0 && rate > 0 {
		l = append(l, "eta", (time.Duration(float64(left) / rate * float64(time.Second))).Round(time.Second).String())
	}
	r.Log.Info("backfill progress", l...)
}

// Session is what the first start's backfill sends through: the session,
// before its stream starts.
type Session interface {
	// Begin opens a transaction of events committed at now.
	Begin(now time.Time) error
	// Event routes and produces one event, as the stream would. It keeps
	// no pointer into m once it returns: the next row is decoded into
	// the same message (sendInOrder), as the stream's are (package
	// session's msg).
	Event(m *decode.Message) error
	// Commit closes the transaction at at, the slot's consistent point,
	// and lets its records go.
	Commit(at pglogrepl.LSN, now time.Time)
	// WaitRoom waits until at most n events, of at most bytes bytes (-1:
	// any), are unacknowledged.
	WaitRoom(ctx context.Context, n int, bytes int64) error
	// Save writes the checkpoint with job's progress and waits for it.
	Save(ctx context.Context, job checkpoint.Job) error
	// Working notes progress that sent nothing yet: the server works on
	// the backfill's statement (postgres.WatchBackend).
	Working()
}

// FirstStart sends the first start's jobs (Initial, not done) from
// snapshot, before the stream starts at at, the slot's consistent point.
// The events are tracked in transactions that end at at, so nothing is
// confirmed past it until the stream runs; the jobs' progress goes to the
// checkpoint as it is acknowledged, and an interruption is continued
// before the next session's stream (Continue; docs/design.md, "Backfill
// consistency").
func (r *Runner) FirstStart(ctx context.Context, s Session, jobs []checkpoint.Job, snapshot string, at pglogrepl.LSN) error {
	conn, done, err := r.beginBeforeStream(ctx, s, snapshot)
	if err != nil {
		return err
	}
	defer done()
	jobs = slices.Clone(jobs)
	if err := r.keepLeaves(ctx, s, conn, jobs); err != nil {
		return err
	}
	var todo []*checkpoint.Job
	for i := range jobs {
		if !jobs[i].Done() && jobs[i].Initial {
			todo = append(todo, &jobs[i])
		}
	}
	if err := r.sendReads(ctx, s, conn, todo, at); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, "COMMIT")
	return err
}

// Continue sends, before the stream starts at at, what the
// configuration's backfills have left (an interrupted first start's jobs,
// an adopted slot's): beside the stream, an aggregate's newer events went
// before its older rows (rule 32). It reads in a snapshot of now, so the
// rows committed since the slot's point that match are sent again by the
// stream: duplicates, never a reorder. A job whose rows are gone (its
// table dropped), or that the configuration no longer asks for, is ended
// here, saying why; any other failure holds the stream: one that can pass
// (a lock's statement timeout, a lost connection) is tried again, one only
// the operator can fix (a tableread.Error: a refused condition, a missing
// reader role) stops the connector, saying what to fix. Jobs read with the
// configuration's condition (Trusted), so fixing it is a remedy.
func (r *Runner) Continue(ctx context.Context, s Session, jobs []checkpoint.Job, at pglogrepl.LSN) error {
	var todo []checkpoint.Job
	for _, job := range jobs {
		if job.Done() || !configured(job) {
			continue
		}
		r.Log.Info("backfill: the configuration's backfill continues before the stream, in a snapshot of now; the rows committed since the slot's position that match are sent again by the stream", "job", job.ID, "table", job.Table, "rows_sent", job.Rows, "lsn", at.String())
		t := Table(r.Tables, job.Table)
		var err error
		switch {
		case t == nil:
			err = gone("backfill %s: table %s is not in the configuration any more", job.ID, job.Table)
		case t.Backfill == nil:
			err = gone("backfill %s of %s: tables[].backfill was removed from the configuration before it finished", job.ID, job.Table)
		default:
			todo = append(todo, job)
			continue
		}
		if err := r.endBeforeStream(ctx, s, job, err); err != nil {
			return err
		}
	}
	// The jobs are read together (sendReads); one whose rows are gone is
	// ended, and the others read again in a new snapshot.
	for len(todo) > 0 {
		err := r.continueJobs(ctx, s, todo, at)
		je := &jobError{job: todo[0]}
		errors.As(err, &je)
		var gone *goneError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &gone):
			if err := r.endBeforeStream(ctx, s, je.job, err); err != nil {
				return err
			}
			todo = slices.DeleteFunc(todo, func(j checkpoint.Job) bool { return j.ID == je.job.ID })
		case ctx.Err() != nil:
			return err
		default:
			return fmt.Errorf("backfill %s of %s could not continue; the stream does not start before it, so that no aggregate's newer event goes before its older rows: %w (a lock held on the table or a timeout is tried again: end that transaction, or raise backfill.statement_timeout; otherwise fix what this names, in tables[].backfill.where, backfill.reader_role or a grant, and start again; removing tables[].backfill gives its rows not sent up)", je.job.ID, je.job.Table, err)
		}
	}
	return nil
}

// goneError is a configured job's end before the stream: its rows are
// not there to send any more, or the configuration no longer asks for
// them. It is a tableread.Error, which ends a job beside the stream too.
type goneError struct{ err *tableread.Error }

func gone(format string, args ...any) error {
	return &goneError{&tableread.Error{Msg: fmt.Sprintf(format, args...)}}
}

func (e *goneError) Error() string { return e.err.Error() }
func (e *goneError) Unwrap() error { return e.err }

// endBeforeStream ends job, which failed on err, once what it sent is
// acknowledged, and saves it: its rows not sent yet are not sent (the log
// and the checkpoint say so), and nothing runs it beside the stream.
func (r *Runner) endBeforeStream(ctx context.Context, s Session, job checkpoint.Job, err error) error {
	r.Log.Error("backfill: the configuration's backfill is ended before the stream; its rows not sent yet are not sent", "job", job.ID, "table", job.Table, "rows_sent", job.Rows, "error", errtext.OneLine(err))
	if err := s.WaitRoom(ctx, 0, -1); err != nil {
		return err
	}
	job.Finished, job.Error = time.Now(), tableread.Redacted(err)
	return s.Save(ctx, job)
}

// configured reports whether job is one the configuration started (a
// first start's, or an adopted slot's), not an operator's request.
func configured(job checkpoint.Job) bool { return strings.HasPrefix(job.ID, firstStartPrefix) }

// continueJobs reads jobs, in a snapshot of now, before the stream.
// Trusted gave each the configuration's condition. An adopted slot's job
// has no leaves yet: it keeps those its first snapshot shows, as a first
// start's does, so that a partition attached while it reads does not
// bring rows written outside the outbox.
func (r *Runner) continueJobs(ctx context.Context, s Session, jobs []checkpoint.Job, at pglogrepl.LSN) error {
	conn, done, err := r.beginBeforeStream(ctx, s, "")
	if err != nil {
		return err
	}
	defer done()
	if err := r.keepLeaves(ctx, s, conn, jobs); err != nil {
		return err
	}
	todo := make([]*checkpoint.Job, len(jobs))
	for i := range jobs {
		todo[i] = &jobs[i]
	}
	if err := r.sendReads(ctx, s, conn, todo, at); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, "COMMIT")
	return err
}

// beginBeforeStream connects for a read before the stream, in a
// read-only REPEATABLE READ transaction in snapshot (the slot's), or in
// one of its own when snapshot is empty. Nothing is sent while a
// statement runs, and the count or a chunk of a selective condition on a
// large table can take longer than http.unhealthy_after: the server
// working on it is progress, so that /healthz does not have the backfill
// restarted again and again; one waiting on a lock is not, so that it
// fails on a backfill stuck. done ends the watch and the connection.
func (r *Runner) beginBeforeStream(ctx context.Context, s Session, snapshot string) (conn *pgx.Conn, done func(), err error) {
	if conn, err = postgres.ConnectRows(ctx, r.Postgres, r.StatementTimeout); err != nil {
		return nil, nil, err
	}
	stopWatch := postgres.WatchBackend(ctx, r.Postgres, conn.PgConn().PID(), s.Working)
	done = func() {
		stopWatch()
		conn.Close(context.WithoutCancel(ctx))
	}
	fail := func(err error) (*pgx.Conn, func(), error) {
		done()
		return nil, nil, err
	}
	if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"); err != nil {
		return fail(fmt.Errorf("backfill: begin: %w", err))
	}
	if snapshot != "" {
		if _, err := conn.Exec(ctx, fmt.Sprintf("SET TRANSACTION SNAPSHOT '%s'", snapshot)); err != nil {
			return fail(fmt.Errorf("backfill: import the slot's snapshot %s: %w", snapshot, err))
		}
	}
	if err := tableread.SetRole(ctx, conn, r.ReaderRole); err != nil {
		return fail(err)
	}
	return conn, done, nil
}

// firstStartPlan plans job's read in a snapshot taken before the table's
// lock (the slot's, or continueJob's own): tableread.HoldFiles checks the
// relation the job reads (job.Rel's, renamed or swapped away or not)
// first, before the plan reads its key and columns, since a rewrite or a
// partition change after the snapshot would read as fewer rows.
func (r *Runner) firstStartPlan(ctx context.Context, conn *pgx.Conn, job checkpoint.Job) (*tableread.Plan, *decode.RowDecoder, error) {
	if t := Table(r.Tables, job.Table); t != nil {
		read, err := r.relation(ctx, conn, job, t)
		if err != nil {
			return nil, nil, err
		}
		if err := tableread.HoldFiles(ctx, conn, read); err != nil {
			return nil, nil, err
		}
	}
	return r.plan(ctx, conn, job)
}

// keepLeaves gives each of the configuration's jobs of a partitioned
// table the leaves conn's snapshot shows (job.Leaves: the slot's for a
// first start, its own for an adopted slot's job), and saves them before
// anything is read or sent: the job reads only those, here and before the
// next stream after any interruption, since a partition attached while it
// reads (ATTACH takes no lock the read holds), or before its lock, brings
// rows written outside the outbox, which the snapshot shows all the same.
func (r *Runner) keepLeaves(ctx context.Context, s Session, conn *pgx.Conn, jobs []checkpoint.Job) error {
	for i, job := range jobs {
		t := Table(r.Tables, job.Table)
		if job.Done() || !(job.Initial || configured(job)) || job.Leaves != nil || t == nil {
			continue
		}
		read, err := r.relation(ctx, conn, job, t)
		if err == nil {
			jobs[i].Leaves, err = tableread.SnapshotLeaves(ctx, conn, read)
		}
		if err != nil {
			return &jobError{job, err}
		}
		if jobs[i].Leaves != nil {
			if err := s.Save(ctx, jobs[i]); err != nil {
				return err
			}
		}
	}
	return nil
}

// saveAcked saves job's progress once every event sent is acknowledged:
// the checkpoint never holds a position past a row Kafka may not have, so
// a job resumed from it sends again every such row and skips none.
func saveAcked(ctx context.Context, s Session, job checkpoint.Job) error {
	if err := s.WaitRoom(ctx, 0, -1); err != nil {
		return err
	}
	return s.Save(ctx, job)
}

// Run runs jobs' jobs beside the stream until ctx is done, one at a
// time, in order: each chunk is read between a low and a high watermark
// and handed to the stream (Jobs.High) through jobs.
func (r *Runner) Run(ctx context.Context, jobs *Jobs) {
	run := jobs.Run()
	var conn *pgx.Conn
	w := postgres.NewWriter(r.Postgres)
	defer func() {
		if conn != nil {
			conn.Close(context.WithoutCancel(ctx))
		}
		w.Close(ctx)
	}()
	backoff := retry.New(r.Backoff, r.BackoffMax)
	for ctx.Err() == nil {
		job, ok := jobs.next()
		if !ok {
			select {
			case <-ctx.Done():
			case <-jobs.wake:
			}
			continue
		}
		var err error
		if conn == nil {
			conn, err = postgres.ConnectRows(ctx, r.Postgres, r.StatementTimeout)
		}
		if err == nil {
			err = r.runJob(ctx, w, conn, jobs, run, job)
		}
		if ctx.Err() != nil {
			return
		}
		var bad *tableread.Error
		switch {
		case errors.As(err, &bad), tableread.Lasting(err):
			// The job cannot run as asked: end it, in the stream's
			// order, with the reason in the checkpoint.
			r.Log.Error("backfill failed; it is ended, and cdc backfill can start it again once the cause is fixed", "job", job.ID, "table", job.Table, "error", errtext.OneLine(err))
			err = emit(ctx, w, conn, decode.Control{Type: decode.ControlFail, Run: run, Job: job.ID, Error: tableread.Redacted(err)})
			if err == nil {
				err = waitDone(ctx, jobs, job.ID)
			}
		case err != nil:
			r.Log.Warn("backfill interrupted; retrying", "job", job.ID, "table", job.Table, "error", errtext.OneLine(err), "retry_in", backoff.Current())
		}
		if err != nil {
			if conn != nil {
				conn.Close(context.WithoutCancel(ctx))
				conn = nil
			}
			retry.Sleep(ctx, backoff.Next())
			continue
		}
		backoff.Reset()
	}
}

// waitDone waits until the stream finished job id.
func waitDone(ctx context.Context, jobs *Jobs, id string) error {
	for !jobs.done(id) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// runJob runs job's chunks between watermarks until the last.
func (r *Runner) runJob(ctx context.Context, w *postgres.Writer, conn *pgx.Conn, jobs *Jobs, run string, job checkpoint.Job) error {
	plan, dec, err := r.plan(ctx, conn, job)
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
		r.Log.Info("backfill starting beside the stream", "job", job.ID, "table", job.Table, "where", job.Where, "rows", total)
	} else {
		r.Log.Info("backfill resuming", "job", job.ID, "table", job.Table, "rows_sent", job.Rows, "total", total)
	}
	r.logOrder("backfill "+job.ID, plan)
	if plan.InCommitOrder() {
		return r.runCursor(ctx, w, conn, jobs, run, job, plan, dec, total)
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
		// The chunk's rows go to Kafka at once, at its high watermark:
		// read it once the events in flight leave room for it.
		if r.Room != nil {
			if err := r.Room(ctx); err != nil {
				return err
			}
		}
		ch := &liveChunk{run: run, job: job.ID, n: n, table: Table(r.Tables, job.Table), dec: dec, total: total, until: until, key: plan.Key, done: make(chan struct{})}
		jobs.setChunk(ch)
		if err := emit(ctx, w, conn, decode.Control{Type: decode.ControlLow, Run: run, Job: job.ID, Chunk: n}); err != nil {
			return err
		}
		c, err := readChunk(ctx, conn, plan, after, until)
		if err != nil {
			return err
		}
		jobs.setRows(ch, &c)
		if err := emit(ctx, w, conn, decode.Control{Type: decode.ControlHigh, Run: run, Job: job.ID, Chunk: n}); err != nil {
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
		if j, ok := jobs.next(); c.Final || !ok || j.ID != job.ID {
			cur := jobs.job(job.ID)
			r.progressLog(cur, cur.Rows-rows0, started, true)
			return nil
		}
		if time.Since(logged) >= progressEvery {
			cur := jobs.job(job.ID)
			r.progressLog(cur, cur.Rows-rows0, started, false)
			logged = time.Now()
		}
	}
}

// runCursor runs job's chunks, in commit order, from one
// tableread.Cursor: its rows are read once, in one snapshot, and handed to
// the stream a chunk at a time between watermarks, as runJob does. The job
// ends with the cursor's rows: those committed since are the stream's.
func (r *Runner) runCursor(ctx context.Context, w *postgres.Writer, conn *pgx.Conn, jobs *Jobs, run string, job checkpoint.Job, plan *tableread.Plan, dec *decode.RowDecoder, total int64) error {
	cur, err := plan.Open(ctx, conn, job.After, job.Horizon, job.Whole)
	if err != nil {
		return err
	}
	defer cur.Close(ctx)
	started, logged, rows0 := time.Now(), time.Now(), job.Rows
	for n := 0; ; n++ {
		if r.Room != nil {
			if err := r.Room(ctx); err != nil {
				return err
			}
		}
		ch := &liveChunk{run: run, job: job.ID, n: n, table: Table(r.Tables, job.Table), dec: dec, total: total, order: plan.Order, horizon: cur.Horizon, done: make(chan struct{})}
		jobs.setChunk(ch)
		if err := emit(ctx, w, conn, decode.Control{Type: decode.ControlLow, Run: run, Job: job.ID, Chunk: n}); err != nil {
			return err
		}
		c, err := cur.Next(ctx)
		if err != nil {
			return err
		}
		jobs.setRows(ch, &c)
		if err := emit(ctx, w, conn, decode.Control{Type: decode.ControlHigh, Run: run, Job: job.ID, Chunk: n}); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch.done:
		}
		if j, ok := jobs.next(); c.Final || !ok || j.ID != job.ID {
			cur := jobs.job(job.ID)
			r.progressLog(cur, cur.Rows-rows0, started, true)
			return nil
		}
		if time.Since(logged) >= progressEvery {
			cur := jobs.job(job.ID)
			r.progressLog(cur, cur.Rows-rows0, started, false)
			logged = time.Now()
		}
	}
}

// readChunk reads one chunk in a read-only transaction of its own
// (tableread.Plan.Read), which starts after the low watermark committed.
// Without an end (nothing matched at the start) there is nothing to read.
func readChunk(ctx context.Context, conn *pgx.Conn, plan *tableread.Plan, after, until []string) (tableread.Chunk, error) {
	if until == nil {
		return tableread.Chunk{Final: true}, nil
	}
	return plan.Read(ctx, conn, after, until)
}

// emit writes c as a transactional logical decoding message, in a
// transaction of its own: on conn's server, or, while that is a hot
// standby, on postgres.primary_url's (w).
func emit(ctx context.Context, w *postgres.Writer, conn *pgx.Conn, c decode.Control) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	return w.Emit(ctx, conn, decode.ControlPrefix, string(b), "a backfill watermark")
}
