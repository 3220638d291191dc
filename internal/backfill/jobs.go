package backfill

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/request"
	"github.com/outboxcdc/cdc/internal/tableread"
)

// Jobs is the pipeline's jobs as far as the stream has read: the saved
// checkpoint's at the start of each session, then changed by the stream's
// control messages. It is the watermark state machine: the stream's
// goroutine feeds it events and control messages (Seen, Low, High, Sent,
// Fail, Admit) and gets back what to send and what to note in the
// checkpoint; it does no I/O. The job runner (Runner) reads it and sets
// each chunk's rows.
type Jobs struct {
	mu sync.Mutex
	// run names this session's job runner in its watermarks and failures:
	// random, and read only by logical decoding (a REPLICATION role), so a
	// message another role writes cannot pass for one of them.
	run   string
	jobs  []checkpoint.Job
	chunk *liveChunk    // the chunk between its watermarks, as the runner set it
	wake  chan struct{} // a job was added

	// window is the chunk whose watermarks the stream is between, if any;
	// the stream's goroutine alone uses it.
	window *liveChunk
}

// NewJobs returns an empty set of jobs.
func NewJobs() *Jobs { return &Jobs{wake: make(chan struct{}, 1)} }

// liveChunk is one chunk of a backfill running beside the stream.
type liveChunk struct {
	run, job string
	n        int
	table    *outbox.Source
	// seen holds the ids of the table's events the stream met since the
	// low watermark, at low; the stream's goroutine alone uses them.
	seen map[string]struct{}
	low  pglogrepl.LSN
	// Set by the runner before it writes the high watermark.
	rows  *tableread.Chunk
	dec   *decode.RowDecoder
	total int64
	until []string
	// order and horizon are the job's once its first chunk is sent
	// (checkpoint.Job.Order, Horizon), for one read from a
	// tableread.Cursor.
	order   tableread.Order
	horizon uint64
	key     []string      // the plan's key, in the order of columns
	done    chan struct{} // closed once the stream handled the high watermark
	// Set by High, for Sent.
	high pglogrepl.LSN
}

// Reset starts a session's jobs from the saved checkpoint's, with a new
// run name.
func (b *Jobs) Reset(jobs []checkpoint.Job) {
	b.mu.Lock()
	b.run = newID()
	b.jobs = slices.Clone(jobs)
	b.chunk = nil
	b.window = nil
	b.mu.Unlock()
}

// Run is the session's run name.
func (b *Jobs) Run() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.run
}

// next returns the first unfinished job.
func (b *Jobs) next() (checkpoint.Job, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, j := range b.jobs {
		if !j.Done() {
			return j, true
		}
	}
	return checkpoint.Job{}, false
}

// Pending reports whether an unfinished job reads table (as SQL names
// it): retention keeps the table's rows meanwhile.
func (b *Jobs) Pending(table string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.ContainsFunc(b.jobs, func(j checkpoint.Job) bool { return !j.Done() && j.Table == table })
}

// Has reports whether job id is known, done or not.
func (b *Jobs) Has(id string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.ContainsFunc(b.jobs, func(j checkpoint.Job) bool { return j.ID == id })
}

// update changes job id with f (a new job when there is none) and
// returns a copy of the list, for a checkpoint note.
func (b *Jobs) update(id string, f func(*checkpoint.Job)) []checkpoint.Job {
	b.mu.Lock()
	defer b.mu.Unlock()
	j := checkpoint.Job{ID: id}
	if i := slices.IndexFunc(b.jobs, func(j checkpoint.Job) bool { return j.ID == id }); i >= 0 {
		j = b.jobs[i]
	}
	f(&j)
	rec := checkpoint.Record{Backfills: b.jobs}
	rec.SetBackfill(j)
	b.jobs = rec.Backfills
	return slices.Clone(b.jobs)
}

// job returns job id as the stream has it.
func (b *Jobs) job(id string) checkpoint.Job {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, j := range b.jobs {
		if j.ID == id {
			return j
		}
	}
	return checkpoint.Job{ID: id}
}

// done reports whether the stream finished job id.
func (b *Jobs) done(id string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !slices.ContainsFunc(b.jobs, func(j checkpoint.Job) bool { return j.ID == id && !j.Done() })
}

// setChunk makes ch the chunk between its watermarks (nil: none).
func (b *Jobs) setChunk(ch *liveChunk) {
	b.mu.Lock()
	b.chunk = ch
	b.mu.Unlock()
}

// setRows gives the chunk its rows, before its high watermark is written.
func (b *Jobs) setRows(ch *liveChunk, c *tableread.Chunk) {
	b.mu.Lock()
	ch.rows = c
	b.mu.Unlock()
}

// Seen notes an event the stream met: between a chunk's watermarks, a row
// of its table that the stream sends is not sent again from the chunk.
func (b *Jobs) Seen(ev *outbox.Event) {
	if w := b.window; w != nil && ev.Source == w.table {
		w.seen[string(ev.Fields[outbox.FieldID].B)] = struct{}{}
	}
}

// Low takes a low watermark, committed at commit: the stream is between
// the watermarks of the runner's chunk from here, when c is its.
func (b *Jobs) Low(c decode.Control, commit pglogrepl.LSN) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ch := b.chunk; ch != nil && ch.run == c.Run && ch.job == c.Job && ch.n == c.Chunk {
		ch.seen, ch.low = map[string]struct{}{}, commit
		b.window = ch
	}
}

// High takes a high watermark, committed at commit at time at: the rows
// of its chunk to send there, in the watermark's transaction, which are
// those the stream did not meet between the watermarks. ok is false for
// a watermark that is not the window's (one of an earlier run, read again
// after a restart). Once the rows are sent, Sent finishes the chunk.
func (b *Jobs) High(c decode.Control, commit pglogrepl.LSN, at time.Time) (rows []decode.Message, ok bool, err error) {
	ch := b.window
	if ch == nil || ch.run != c.Run || ch.job != c.Job || ch.n != c.Chunk {
		return nil, false, nil
	}
	b.mu.Lock()
	read, dec := ch.rows, ch.dec
	b.mu.Unlock()
	if read == nil {
		return nil, false, fmt.Errorf("internal: backfill chunk %d of %s reached its high watermark without rows", ch.n, ch.job)
	}
	for _, row := range read.Rows {
		m, err := dec.Row(row, commit, at)
		if err != nil {
			return nil, false, err
		}
		if _, live := ch.seen[m.Event.ID()]; live {
			continue // the stream sent it, in its place
		}
		rows = append(rows, m)
	}
	ch.high = commit
	return rows, true, nil
}

// ChunkSent is what a chunk sent at its high watermark.
type ChunkSent struct {
	Table     string
	Low, High pglogrepl.LSN // the watermarks' commit LSNs
	Read      int           // rows the chunk read
	Sent      int           // rows sent: those the stream had not met
}

// Sent finishes the window's chunk, whose sent rows the stream produced:
// it returns the jobs with its progress, for the watermark transaction's
// checkpoint note, and lets the runner go on.
func (b *Jobs) Sent(sent int) ([]checkpoint.Job, ChunkSent) {
	ch := b.window
	b.window = nil
	b.mu.Lock()
	read, total := ch.rows, ch.total
	b.chunk = nil
	b.mu.Unlock()
	jobs := b.update(ch.job, func(j *checkpoint.Job) {
		j.Rows += int64(sent)
		if read.Last != nil {
			j.After, j.Whole = read.Last, false
		}
		if j.Total == 0 {
			j.Total = total
		}
		if j.Until == nil {
			j.Until = ch.until
		}
		if j.Order == "" && j.Horizon == 0 {
			j.Order, j.Horizon = string(ch.order), ch.horizon
		}
		if j.Order == "" && j.Key == nil {
			j.Key = ch.key
		}
		if read.Final {
			j.Finished = time.Now()
		}
	})
	close(ch.done)
	return jobs, ChunkSent{Table: ch.table.String(), Low: ch.low, High: ch.high, Read: len(read.Rows), Sent: sent}
}

// Fail takes a job's end on an error, as the runner wrote it: the jobs
// to note, or false for a message that is not this session's runner's
// (another role's, or an earlier session's read again: its job runs again).
func (b *Jobs) Fail(c decode.Control) ([]checkpoint.Job, bool) {
	b.mu.Lock()
	ours := c.Run != "" && c.Run == b.run
	b.mu.Unlock()
	if !ours || !b.Has(c.Job) {
		return nil, false
	}
	return b.update(c.Job, func(j *checkpoint.Job) {
		if !j.Done() {
			j.Finished, j.Error = time.Now(), c.Error
		}
	}), true
}

// Admit adds backfill request req, which package request admitted
// (signed, fresh, not taken before), as a job that starts at this point of
// the stream, when its table is configured. It returns the jobs, for the
// checkpoint note, or a *request.Refused.
func (b *Jobs) Admit(req checkpoint.Request, tables []*outbox.Source) ([]checkpoint.Job, error) {
	if Table(tables, req.Table) == nil {
		return nil, &request.Refused{Msg: "ignored a backfill request for a table that is not configured"}
	}
	jobs := b.update(req.ID, func(j *checkpoint.Job) {
		*j = checkpoint.Job{ID: req.ID, Table: req.Table, Where: req.Where, Started: time.Now(), RequestedAt: req.RequestedAt, MAC: req.MAC}
	})
	select {
	case b.wake <- struct{}{}:
	default:
	}
	return jobs, nil
}

// RequestKind is how package request reads a backfill request.
var RequestKind = request.Kind[checkpoint.Request]{Name: "backfill", Parse: checkpoint.ParseRequest}

// Trusted splits the jobs of a checkpoint read back from the topic into
// those that may run and those refused: anyone who may produce to the
// topic could have written a job, and a job's condition runs as the
// connector's role (docs/security.md). A first start's job of a configured
// table is kept with the configuration's condition, whatever the topic
// holds: an operator's edit of tables[].backfill.where while it was
// unfinished (an equivalent condition, a fix) continues it, where dropping
// it lost its rows not sent, and a forged condition never runs. One whose
// table has no backfill configured any more is kept for Runner.Continue
// to end, with the reason. Any other job is kept when the signed request
// that started it verifies with keys for the checkpoint's key. Finished
// jobs run nothing, and are kept.
func Trusted(jobs []checkpoint.Job, keys [][]byte, key string, tables []*outbox.Source) (kept, refused []checkpoint.Job) {
	for _, j := range jobs {
		ok := j.Done()
		if name, first := strings.CutPrefix(j.ID, firstStartPrefix); first && !ok {
			t := Table(tables, name)
			if ok = t != nil && j.Table == name; ok {
				j.Where = ""
				if t.Backfill != nil {
					j.Where = t.Backfill.Where
				}
			}
		} else if !ok {
			ok = len(keys) > 0 && checkpoint.RequestOf(j).Verify(keys, key)
		}
		if ok {
			kept = append(kept, j)
		} else {
			refused = append(refused, j)
		}
	}
	return kept, refused
}

// Table returns the configured table SQL names name.
func Table(tables []*outbox.Source, name string) *outbox.Source {
	for _, t := range tables {
		if !t.IsMessage() && t.String() == name {
			return t
		}
	}
	return nil
}

// firstStartPrefix begins the ID of a first start's job.
const firstStartPrefix = "first-start:"

// InitialJobs are the first start's backfills: one per table with
// backfill set.
func InitialJobs(tables []*outbox.Source, initial bool, streamed map[string]checkpoint.Table) []checkpoint.Job {
	var jobs []checkpoint.Job
	for _, t := range tables {
		if t.Backfill != nil {
			jobs = append(jobs, checkpoint.Job{ID: firstStartPrefix + t.String(), Table: t.String(), Where: t.Backfill.Where, Initial: initial, Started: time.Now(),
				Rel: streamed[t.String()].Rel})
		}
	}
	return jobs
}

// newID is a random identifier for a job or a run.
func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
