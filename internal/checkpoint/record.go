package checkpoint

import (
	"encoding/json"
	"fmt"
	"maps"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/timemark"
)

// Record is the durable progress of one pipeline: what the connector has
// confirmed to its slot, and what it needs to replay and to tell a first
// start from a gap. It is the value of the pipeline's key in the checkpoint
// topic, as JSON (docs/operations.md shows an example).
type Record struct {
	Slot     string
	SystemID string // the database system identifier (IDENTIFY_SYSTEM)
	Timeline int32
	// Address is where the pipeline reached that system, host:port/database
	// as postgres.url names it (no user, no password): it tells another
	// deployment that shares the checkpoint topic and the slot name from
	// the same address now serving another system. "" in records written
	// before it was kept.
	Address string

	// Confirmed is the highest position the connector may have confirmed
	// to the slot. The slot's confirmed_flush_lsn is never past it: the
	// record is written (and acknowledged) before the slot is confirmed.
	Confirmed pglogrepl.LSN
	// CommitLSN and CommitTime are the commit record LSN and the commit
	// time of the last transaction delivered (zero before the first).
	CommitLSN  pglogrepl.LSN
	CommitTime time.Time

	Version   string // the connector version that wrote it
	UpdatedAt time.Time
	// Seq counts the records written for the key: each is the record it
	// was made from plus one. Load refuses a record whose Seq is below one
	// it read before for the key (an older record produced again), so
	// that a writer of the topic cannot move a pipeline back by replaying
	// a genuine record (docs/security.md). 0 in records written before it
	// was kept.
	Seq uint64

	// Marks map WAL positions to times, newest last, for the replay window
	// (see Marks.Add).
	Marks Marks
	// Window is where the replay slot stands: transactions that committed
	// at or after Window.Time have a commit LSN at or after Window.LSN.
	// Zero without a replay window.
	Window Mark
	// History records what an operator accepted or did: gaps, rewinds. The
	// newest maxHistory entries are kept.
	History []Jump
	// Backfills are the backfill jobs: unfinished ones in the order they
	// run, and the newest finished ones (docs/migrating-from-polling.md).
	Backfills []Job
	// Tables maps each configured outbox table (as SQL names it) to what
	// the connector streamed of it up to Confirmed: its relation id, and
	// what the stream is known to have covered (Table). A table found with
	// another id was dropped and created again since: the rows it
	// received before it was published are sent (docs/design.md, "Table
	// changes"). nil in records written before it was kept. The map is
	// never changed once in a record: a change makes a new one.
	Tables map[string]Table
	// RetentionMarks pair, over time, the oldest transaction a snapshot saw
	// running with a WAL position after it, oldest first, for retention.
	RetentionMarks []RetentionMark
	// Skips are invalid events an operator chose to send to the
	// dead-letter topic rather than stop on (cdc skip), until the stream
	// delivered their transaction (Progress drops them then).
	Skips []Skip
	// Parked are the keys on_invalid: park holds back up to Confirmed
	// (package park), never changed once in a record.
	Parked []Parked
	// Used are the operator's requests taken, newest last (at most
	// MaxUsed).
	Used []Used
}

// Parked is one parked key: the events of Key wait in the parked topic
// Topic, on one partition, in commit order, behind the invalid event
// First (docs/operations.md, "Parked keys"). A key is parked once per
// pipeline, whatever the table or topic of its events: the parking is what
// keeps them in order.
//
// What the checkpoint says is parked is a claim a redrive checks against
// the topic (package redrive): every record of the parking is numbered
// (1 to Events, by the Run that produced it) and sealed, so that one
// missing, forged or left over from a session that did not get its
// checkpoint written is told apart.
type Parked struct {
	Table string // the table of the first event, as SQL names it
	// Dest is the topic the first event was meant for, or "table:" and
	// Table when its topic could not be worked out: what cdc parked shows.
	Dest string
	Key  string
	// Reason is why First is invalid.
	Reason string
	First  string // the first event's id
	// FirstSum is a hash of the first event's content (its aggregate id,
	// type and payload), 0 in checkpoints from before it: a row read
	// again with First's id is the first event's copy only when its
	// content is the same, not a later event that reuses the id.
	FirstSum uint64
	// FirstLSN is the commit LSN of the first event's transaction: a
	// rewind to it or before gives the parking up (the stream parks the
	// key again), and retention keeps the rows committed since.
	FirstLSN pglogrepl.LSN
	// Episode tells this parking's records in Topic from those of an
	// earlier parking of the same key, redriven since.
	Episode string
	Since   time.Time // the first event's commit time
	Events  int64     // records parked, the first included: numbered 1 to Events
	Topic   string    // the parked topic
	// Partition is the parked topic's partition every record of the
	// parking is produced to, Start an offset of it at or before the
	// first: a redrive reads from there by offset, never by time.
	Partition int32
	Start     int64
	// Runs say which session produced each record number (RunOf). A
	// record whose run is not the one its number belongs to was produced
	// by a session whose checkpoint never said so (a crash, a rewind), and
	// is not the parking's.
	Runs []Run
	// Released is how many of its records (1 to Released) a redrive that
	// has not finished has sent on: exactly once, committed with them.
	Released int64
	Read     bool // some records are of rows read from the table (a backfill, a repair): no rewind's stream carries them again
}

// Run is one session's share of a parking's record numbers (Parked.Runs),
// and the key that sealed them (signing.ID; "" in records written before
// it was kept).
type Run struct {
	ID   string
	From int64
	Key  string
}

// RunOf is the run that owns record number n of p, or "": the last of
// p.Runs to start at or before n. Runs are added in time, and a later one
// takes the numbers from its From on from every earlier one (after a
// rewind cut the parking, its numbers are given again).
func (p Parked) RunOf(n int64) string {
	id := ""
	for _, r := range p.Runs {
		if r.From <= n {
			id = r.ID
		}
	}
	return id
}

// Used is an operator's request (a backfill's, a redrive's) that a
// pipeline has taken: the checkpoint remembers it, so that it runs once,
// and what it did, for the command that follows it.
type Used struct {
	ID string
	At time.Time // the commit time of the announcement it ran at
	// Done: it did everything it was asked; Outcome says what it did,
	// in one line.
	Done    bool
	Outcome string
}

// MaxUsed bounds the requests a checkpoint remembers: the newest are kept.
// A request is taken only within RequestMaxAge of being made, and the
// session's ledger (request.Ledger) drops only ones that can no longer be
// taken, refusing a new request rather than forget a young one;
// a rewind that reads an announcement again finds its request here if it
// is among the newest, and otherwise runs it against what is parked now,
// which a redrive's episodes bind.
const MaxUsed = 64

// MaxOutcome bounds an outcome as the checkpoint keeps it.
const MaxOutcome = 512

// RetentionMark is a snapshot's xmin (64-bit) and the WAL insert position
// read after it, at a time: every transaction below XMin had ended, its
// commit record before LSN, at Time. An LSN and an xid mean something only
// within one WAL history: Timeline is the one the mark was taken on (the
// record's key names the database system), and a mark of another is
// never used.
type RetentionMark struct {
	XMin     uint64
	LSN      pglogrepl.LSN
	Time     time.Time
	Timeline int32
}

// Table is what the connector streamed of one configured outbox table
// (Record.Tables): the facts retention deletes on (docs/design.md,
// "Retention"), and the relations whose inserts are the table's events
// (docs/design.md, "Table changes").
type Table struct {
	// Rel is the relation id streamed for the table.
	Rel uint32
	// Member names the publication's membership through which Rel's
	// inserts reach the slot: a pg_publication_rel row ("rel:<oid>"), a
	// schema's ("schema:<oid>"), or FOR ALL TABLES ("all:<oid>"). Another
	// one means the table left the publication and came back: what it
	// received in between was not streamed. "" where not known (a record
	// written before it was kept, or a table out of the publication).
	Member string
	// Floor is the lowest xid (64-bit) of the transactions whose rows of
	// Rel the connector knows it delivered: every transaction at or above
	// it committed while Rel was streamed, and its rows below it may never
	// have been sent (a first start without a backfill, a table added to
	// the configuration later). 0: every row of Rel was delivered (sent by
	// a repair or a first start's backfill, or streamed since Rel was
	// created). Unknown (a record written before it was kept) is
	// NoFloor.
	Floor uint64
	// Former are the relation ids streamed for the table before Rel (the
	// old table of a swap, renamed away): while one exists its inserts are
	// still the table's events, never "unmapped".
	Former []uint32
	// Names are the names the table had before the configuration followed
	// a rename (the newest last, a few kept): a parked record names the
	// table as it was, and its redrive finds it by them.
	Names []string
	// Files are the storage files (pg_relation_filenode) of Rel, or of its
	// leaf partitions, by relation id, read before Floor was: a row's xid
	// tells it from the rows below Floor only while its table is not
	// rewritten (ALTER TABLE ... TYPE, a volatile default, VACUUM FULL,
	// CLUSTER give every row a new file, and most a new xid). One of them
	// in another file now means the Floor no longer tells which rows were
	// streamed: retention deletes nothing of the table until a new Floor is
	// set, with the files it has then. Kept only with a Floor above 0; nil
	// in a record written before they were kept.
	Files map[uint32]uint32
	// Seen, while set, is what the snapshot of the repair that made Rel
	// the table's showed, where its rows went before its message (at the
	// first of Rel's events the stream met): the stream passes over Rel's
	// events of the transactions it shows, whose rows the repair sent,
	// until it meets a transaction that began after the snapshot (Past)
	// or the repair's message. nil otherwise.
	Seen *Seen
}

// NoteTables returns the tables a session noted (noted: its watch's
// view, Record.Tables as of a position) as the record with tables saved
// takes them. A table whose relation saved already records as every row
// delivered (Floor 0: a first start's backfill finished, SetBackfill)
// stays so: within a relation the Floor never goes back up in a note,
// and the watch's view of the other tables may predate the backfill's
// end (a repair's note carries every table).
func NoteTables(saved, noted map[string]Table) map[string]Table {
	out := make(map[string]Table, len(noted))
	for name, st := range noted {
		if old, ok := saved[name]; ok && old.Rel == st.Rel && old.Floor == 0 {
			st.Floor, st.Files = 0, nil
		}
		out[name] = st
	}
	return out
}

// NoFloor is Table.Floor where nothing is known of what was delivered:
// retention deletes none of the table's rows until a start sets it.
const NoFloor = ^uint64(0)

// Skip names one event by its transaction's commit LSN and its id.
type Skip struct {
	CommitLSN pglogrepl.LSN
	ID        string
}

// ForgetCoverage drops what retention knows, and what a repair's snapshot
// showed (Table.Seen), at a gap accepted
// (docs/design.md, "Retention"): the marks were taken in a history the
// server may not have (a restore reuses xids and positions), and the rows
// of the gap were never streamed. The next start sets each table's floor
// afresh.
func (r *Record) ForgetCoverage() {
	r.RetentionMarks = nil
	if r.Tables != nil {
		tables := map[string]Table{}
		for name, st := range r.Tables {
			// A repair's snapshot's xids, too, belong to a history
			// the server may not have: passed over there, another
			// transaction's events would be lost.
			st.Floor, st.Seen = NoFloor, nil
			tables[name] = st
		}
		r.Tables = tables
	}
}

// Skipped reports whether an operator chose, with cdc skip, to send the
// event id of the transaction committed at commitLSN to the dead-letter
// topic.
func (r *Record) Skipped(commitLSN pglogrepl.LSN, id string) bool {
	for _, k := range r.Skips {
		if k.CommitLSN == commitLSN && k.ID == id {
			return true
		}
	}
	return false
}

// Job is one backfill job's durable progress. A running pipeline
// writes it with the confirmed position it belongs to: the rows it counts
// as sent are acknowledged by Kafka, and a restart continues after After.
type Job struct {
	ID    string
	Table string // the table, as SQL names it
	Where string // the condition; "" for every row
	// After is the key (as text) of the last row sent, in the job's Order;
	// nil before the first.
	After []string
	// Order is the order the job reads rows in (tableread.Order): "" for
	// columns, Key's (nil if saved before Key was kept: order_by's and the
	// primary key, the primary key alone before commit order was the
	// default), "commit" or "commit-time" for the rows' commit order. Kept
	// so that a job resumes in the order After is in, whatever order_by says.
	Order string
	Key   []string
	// Horizon, for a job in commit order, is the 64-bit xid below which
	// every transaction had ended when the job's rows were first read: a
	// row changed since (an UPDATE gives it its transaction's xid, so its
	// place in the order moved) has its xid at or above it, and a job
	// resumed reads such rows again wherever they now sort, so none is
	// skipped. 0 before the first read.
	Horizon uint64
	Whole   bool // After's commit was sent whole: a resume starts past it
	// Until is the key of the last row that matched when a backfill
	// beside the stream started: it stops there, since the stream sends
	// what committed after. nil for the first start's, which reads a
	// snapshot.
	Until []string
	Rows  int64 // rows sent
	Total int64 // rows that matched when it started (an estimate after)
	// Initial: started in the snapshot of the first start. Rel is the
	// relation a first start's job reads (0: the one its table's name
	// has): a table swapped while the job is unfinished is read by the
	// relation the job began on, which holds its rows, not by the name.
	Initial bool
	Rel     uint32
	// Leaves are the leaf partitions a first start's snapshot showed, the
	// only ones the job reads (tableread.SnapshotLeaves); nil: all.
	Leaves   []uint32
	Started  time.Time
	Finished time.Time // zero while it runs
	// Error says why a finished job stopped before its last row.
	Error string
	// RequestedAt and MAC are those of the signed request that started
	// the job (Request), kept so that a job read back from the
	// checkpoint topic runs only when its request verifies: the topic is
	// not proof enough (VerifyJob).
	RequestedAt time.Time
	MAC         string
}

func (b Job) toJSON() jsonBackfill {
	jb := jsonBackfill{ID: b.ID, Table: b.Table, Where: b.Where, After: b.After, Until: b.Until, Order: b.Order, Key: b.Key, Horizon: b.Horizon, Whole: b.Whole, Rows: b.Rows, Total: b.Total, Initial: b.Initial, Rel: b.Rel, Leaves: b.Leaves, Started: b.Started.UTC(), Error: b.Error, MAC: b.MAC}
	if !b.RequestedAt.IsZero() {
		t := b.RequestedAt.UTC()
		jb.RequestedAt = &t
	}
	if b.Done() {
		t := b.Finished.UTC()
		jb.Finished = &t
	}
	return jb
}

// MarshalJSON writes a job as the checkpoint does.
func (b Job) MarshalJSON() ([]byte, error) { return json.Marshal(b.toJSON()) }

// Done reports whether the job finished.
func (b *Job) Done() bool { return !b.Finished.IsZero() }

// maxFinishedBackfills is how many finished jobs a record keeps at least;
// it keeps more while they are younger than KeepFinished, up to
// maxKeptBackfills.
const (
	maxFinishedBackfills = 10
	maxKeptBackfills     = 1000
)

// KeepFinished is how long a record keeps a finished job at least: twice
// RequestMaxAge, so that a request announced again while it may
// still be taken for new finds its job and runs nothing (a test in
// internal/backfill pins the two together).
const KeepFinished = 20 * time.Minute

// ActiveBackfill returns the first unfinished job, or nil.
func (r *Record) ActiveBackfill() *Job {
	for i := range r.Backfills {
		if !r.Backfills[i].Done() {
			return &r.Backfills[i]
		}
	}
	return nil
}

// FindBackfill returns the job with id, or nil.
func (r *Record) FindBackfill(id string) *Job {
	for i := range r.Backfills {
		if r.Backfills[i].ID == id {
			return &r.Backfills[i]
		}
	}
	return nil
}

// SetBackfill records b, replacing the job with its id or adding it, and
// keeps the newest maxFinishedBackfills finished jobs, and any finished
// job started within KeepFinished of the newest job (at most
// maxKeptBackfills in all). It copies the list: a record's slices may be
// shared with the one last saved.
//
// A first start's backfill of every row of a table, done without an
// error, sent every row committed before the slot, and the stream
// carries the rest: from then on all of the table's rows are known
// delivered (Table.Floor 0).
func (r *Record) SetBackfill(b Job) {
	if st, ok := r.Tables[b.Table]; ok && b.Initial && b.Done() && b.Error == "" && b.Where == "" {
		tables := maps.Clone(r.Tables)
		st.Floor, st.Files = 0, nil
		tables[b.Table] = st
		r.Tables = tables
	}
	jobs := make([]Job, 0, len(r.Backfills)+1)
	found := false
	for _, j := range r.Backfills {
		if j.ID == b.ID {
			j, found = b, true
		}
		jobs = append(jobs, j)
	}
	if !found {
		jobs = append(jobs, b)
	}
	finished := 0
	var newest time.Time
	for _, j := range jobs {
		if j.Done() {
			finished++
		}
		if j.Started.After(newest) {
			newest = j.Started
		}
	}
	out := jobs[:0]
	for i, j := range jobs {
		young := newest.Sub(j.Started) < KeepFinished && len(jobs)-i <= maxKeptBackfills
		if j.Done() && finished > maxFinishedBackfills && !young {
			finished--
			continue
		}
		out = append(out, j)
	}
	r.Backfills = out
}

// Mark, Marks and Skew are package timemark's, which the record keeps.
type (
	Mark  = timemark.Mark
	Marks = timemark.List
)

const Skew = timemark.Skew

// Jump is a move of the stream's position an operator made (an accepted gap
// or a rewind), recorded in the checkpoint's history.
type Jump struct {
	Kind   string // JumpAcceptedGap or JumpRewind
	From   pglogrepl.LSN
	To     pglogrepl.LSN
	At     time.Time
	Reason string
}

const (
	JumpAcceptedGap = "accepted-gap"
	JumpRewind      = "rewind"
	maxHistory      = 20
)

// MarshalJSON writes a Jump as the checkpoint's history does.
func (e Jump) MarshalJSON() ([]byte, error) {
	return json.Marshal(jsonJump{Kind: e.Kind, From: e.From.String(), To: e.To.String(), At: e.At.UTC(), Reason: e.Reason})
}

// AddJump appends ev to the history, keeping the newest maxHistory.
func (r *Record) AddJump(ev Jump) {
	r.History = append(r.History, ev)
	if n := len(r.History) - maxHistory; n > 0 {
		r.History = append([]Jump(nil), r.History[n:]...)
	}
}

// Key is the record's key in the checkpoint topic: one per slot and
// database system, so that pipelines of several databases can share a topic.
func Key(slot, systemID string) string { return slot + "/" + systemID }

// Key returns r's key.
func (r *Record) Key() string { return Key(r.Slot, r.SystemID) }

// The JSON shape: LSNs in Postgres' text form, times in RFC 3339, so that
// an operator reading the topic with a console consumer can act on it.
type jsonMark struct {
	LSN  string    `json:"lsn"`
	Time time.Time `json:"time"`
}

type jsonJump struct {
	Kind   string    `json:"kind"`
	From   string    `json:"from_lsn"`
	To     string    `json:"to_lsn"`
	At     time.Time `json:"at"`
	Reason string    `json:"reason,omitempty"`
}

type jsonRecord struct {
	Slot         string                `json:"slot"`
	SystemID     string                `json:"system_identifier"`
	Timeline     int32                 `json:"timeline"`
	Address      string                `json:"address,omitempty"`
	Confirmed    string                `json:"confirmed_lsn"`
	CommitLSN    string                `json:"commit_lsn"`
	CommitTime   *time.Time            `json:"commit_time,omitempty"`
	Version      string                `json:"connector_version"`
	UpdatedAt    time.Time             `json:"updated_at"`
	ReplayWindow *jsonMark             `json:"replay_window,omitempty"`
	Marks        []jsonMark            `json:"replay_marks,omitempty"`
	History      []jsonJump            `json:"history,omitempty"`
	Backfills    []jsonBackfill        `json:"backfills,omitempty"`
	Tables       map[string]uint32     `json:"tables,omitempty"`
	Streams      map[string]jsonStream `json:"streams,omitempty"`
	Skips        []jsonSkip            `json:"skips,omitempty"`
	Retention    []jsonRetention       `json:"retention_marks,omitempty"`
	Seq          uint64                `json:"seq,omitempty"`
	Parked       []jsonParked          `json:"parked,omitempty"`
	Used         []jsonUsed            `json:"used_requests,omitempty"`
}

// jsonStream is a Table but its relation id, which "tables" holds (as
// records written before streams were kept do).
// ParkedSize is what p takes of a checkpoint record: its JSON, as the
// record writes it (a key of '<' is six bytes a character there), and a
// comma.
func ParkedSize(p Parked) int {
	b, _ := json.Marshal(toJSONParked(p))
	return len(b) + 1
}

type jsonParked struct {
	Table     string    `json:"table"`
	Dest      string    `json:"dest"`
	Key       string    `json:"key"`
	Reason    string    `json:"reason"`
	First     string    `json:"first"`
	FirstSum  uint64    `json:"sum,omitempty"`
	FirstLSN  string    `json:"first_lsn"`
	Episode   string    `json:"episode"`
	Since     time.Time `json:"since"`
	Events    int64     `json:"events"`
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Start     int64     `json:"start_offset"`
	Runs      []jsonRun `json:"runs,omitempty"`
	Released  int64     `json:"released,omitempty"`
	Read      bool      `json:"read,omitempty"`
}

type jsonRun struct {
	ID   string `json:"id"`
	From int64  `json:"from"`
	Key  string `json:"key,omitempty"`
}

func toJSONParked(p Parked) jsonParked {
	j := jsonParked{Table: p.Table, Dest: p.Dest, Key: p.Key, Reason: p.Reason, First: p.First, FirstSum: p.FirstSum, FirstLSN: p.FirstLSN.String(), Episode: p.Episode,
		Since: p.Since.UTC(), Events: p.Events, Topic: p.Topic, Partition: p.Partition, Start: p.Start, Released: p.Released, Read: p.Read}
	for _, r := range p.Runs {
		j.Runs = append(j.Runs, jsonRun(r))
	}
	return j
}

func (j jsonParked) parked() (Parked, error) {
	lsn, err := pglogrepl.ParseLSN(j.FirstLSN)
	if err != nil {
		return Parked{}, fmt.Errorf("checkpoint parked key %q: first_lsn %q: %w", j.Key, j.FirstLSN, err)
	}
	p := Parked{Table: j.Table, Dest: j.Dest, Key: j.Key, Reason: j.Reason, First: j.First, FirstSum: j.FirstSum, FirstLSN: lsn, Episode: j.Episode,
		Since: j.Since, Events: j.Events, Topic: j.Topic, Partition: j.Partition, Start: j.Start, Released: j.Released, Read: j.Read}
	for _, r := range j.Runs {
		p.Runs = append(p.Runs, Run(r))
	}
	return p, nil
}

// parked is j's parked keys.
func (j jsonRecord) parked() ([]Parked, error) {
	var out []Parked
	for _, jp := range j.Parked {
		p, err := jp.parked()
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

type jsonUsed struct {
	ID      string    `json:"id"`
	At      time.Time `json:"at"`
	Done    bool      `json:"done,omitempty"`
	Outcome string    `json:"outcome,omitempty"`
}

type jsonStream struct {
	Member string            `json:"member,omitempty"`
	Floor  *uint64           `json:"floor,omitempty"` // absent: NoFloor
	Former []uint32          `json:"former,omitempty"`
	Names  []string          `json:"names,omitempty"`
	Files  map[uint32]uint32 `json:"files,omitempty"`
	Seen   *jsonSeen         `json:"seen,omitempty"`
}

type jsonSeen struct {
	Xmin uint64   `json:"xmin"`
	Xmax uint64   `json:"xmax"`
	Xip  []uint64 `json:"xip,omitempty"`
	IDs  []string `json:"ids,omitempty"`
	All  bool     `json:"all_ids,omitempty"`
}

// tables are j's relation ids with their streams; a table without one
// (a record written before they were kept) knows nothing of its rows.
func (j jsonRecord) tables() map[string]Table {
	if j.Tables == nil {
		return nil
	}
	tables := map[string]Table{}
	for name, rel := range j.Tables {
		t := Table{Rel: rel, Floor: NoFloor}
		if js, ok := j.Streams[name]; ok {
			t.Member, t.Former, t.Names, t.Files = js.Member, js.Former, js.Names, js.Files
			if js.Floor != nil {
				t.Floor = *js.Floor
			}
			// One that no snapshot could show is dropped: without it the
			// stream passes over nothing (and may send a row twice).
			if js.Seen != nil {
				if seen := (&Seen{Xmin: js.Seen.Xmin, Xmax: js.Seen.Xmax, Xip: js.Seen.Xip, IDs: js.Seen.IDs, All: js.Seen.All}); seen.valid() {
					t.Seen = seen
				}
			}
		}
		tables[name] = t
	}
	return tables
}

type jsonRetention struct {
	XMin     uint64    `json:"xmin"`
	LSN      string    `json:"lsn"`
	Time     time.Time `json:"time"`
	Timeline int32     `json:"timeline,omitempty"`
}

type jsonSkip struct {
	CommitLSN string `json:"commit_lsn"`
	ID        string `json:"id"`
}

type jsonBackfill struct {
	ID       string     `json:"id"`
	Table    string     `json:"table"`
	Where    string     `json:"where,omitempty"`
	After    []string   `json:"after,omitempty"`
	Until    []string   `json:"until,omitempty"`
	Order    string     `json:"order,omitempty"`
	Key      []string   `json:"key,omitempty"`
	Horizon  uint64     `json:"horizon,omitempty"`
	Whole    bool       `json:"whole,omitempty"`
	Rows     int64      `json:"rows"`
	Total    int64      `json:"total"`
	Initial  bool       `json:"initial,omitempty"`
	Rel      uint32     `json:"rel,omitempty"`
	Leaves   []uint32   `json:"leaves,omitempty"`
	Started  time.Time  `json:"started_at"`
	Finished *time.Time `json:"finished_at,omitempty"`
	Error    string     `json:"error,omitempty"`
	// The request's, for a job cdc backfill started.
	RequestedAt *time.Time `json:"requested_at,omitempty"`
	MAC         string     `json:"mac,omitempty"`
}

// MarshalJSON writes the documented JSON shape.
func (r Record) MarshalJSON() ([]byte, error) {
	j := jsonRecord{
		Slot: r.Slot, SystemID: r.SystemID, Timeline: r.Timeline, Address: r.Address,
		Confirmed: r.Confirmed.String(), CommitLSN: r.CommitLSN.String(),
		Version: r.Version, UpdatedAt: r.UpdatedAt.UTC(), Seq: r.Seq,
	}
	if r.Tables != nil {
		j.Tables, j.Streams = map[string]uint32{}, map[string]jsonStream{}
		for name, t := range r.Tables {
			j.Tables[name] = t.Rel
			js := jsonStream{Member: t.Member, Former: t.Former, Names: t.Names, Files: t.Files}
			if t.Floor != NoFloor {
				js.Floor = &t.Floor
			}
			if t.Seen != nil {
				js.Seen = &jsonSeen{Xmin: t.Seen.Xmin, Xmax: t.Seen.Xmax, Xip: t.Seen.Xip, IDs: t.Seen.IDs, All: t.Seen.All}
			}
			j.Streams[name] = js
		}
	}
	if !r.CommitTime.IsZero() {
		t := r.CommitTime.UTC()
		j.CommitTime = &t
	}
	if r.Window.LSN != 0 {
		j.ReplayWindow = &jsonMark{LSN: r.Window.LSN.String(), Time: r.Window.Time.UTC()}
	}
	for _, m := range r.Marks {
		j.Marks = append(j.Marks, jsonMark{LSN: m.LSN.String(), Time: m.Time.UTC()})
	}
	for _, e := range r.History {
		j.History = append(j.History, jsonJump{Kind: e.Kind, From: e.From.String(), To: e.To.String(), At: e.At.UTC(), Reason: e.Reason})
	}
	for _, b := range r.Backfills {
		j.Backfills = append(j.Backfills, b.toJSON())
	}
	for _, s := range r.Skips {
		j.Skips = append(j.Skips, jsonSkip{CommitLSN: s.CommitLSN.String(), ID: s.ID})
	}
	for _, p := range r.Parked {
		j.Parked = append(j.Parked, toJSONParked(p))
	}
	for _, u := range r.Used {
		j.Used = append(j.Used, jsonUsed{ID: u.ID, At: u.At.UTC(), Done: u.Done, Outcome: u.Outcome})
	}
	for _, m := range r.RetentionMarks {
		j.Retention = append(j.Retention, jsonRetention{XMin: m.XMin, LSN: m.LSN.String(), Time: m.Time.UTC(), Timeline: m.Timeline})
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads the documented JSON shape.
func (r *Record) UnmarshalJSON(b []byte) error {
	var j jsonRecord
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	lsn := func(name, s string) (pglogrepl.LSN, error) {
		l, err := pglogrepl.ParseLSN(s)
		if err != nil {
			return 0, fmt.Errorf("checkpoint %s %q: %w", name, s, err)
		}
		return l, nil
	}
	var err error
	*r = Record{Slot: j.Slot, SystemID: j.SystemID, Timeline: j.Timeline, Address: j.Address, Version: j.Version, UpdatedAt: j.UpdatedAt, Seq: j.Seq, Tables: j.tables()}
	if r.Confirmed, err = lsn("confirmed_lsn", j.Confirmed); err != nil {
		return err
	}
	if r.CommitLSN, err = lsn("commit_lsn", j.CommitLSN); err != nil {
		return err
	}
	if j.CommitTime != nil {
		r.CommitTime = *j.CommitTime
	}
	if j.ReplayWindow != nil {
		if r.Window.LSN, err = lsn("replay_window", j.ReplayWindow.LSN); err != nil {
			return err
		}
		r.Window.Time = j.ReplayWindow.Time
	}
	for _, m := range j.Marks {
		l, err := lsn("replay_marks", m.LSN)
		if err != nil {
			return err
		}
		r.Marks = append(r.Marks, Mark{LSN: l, Time: m.Time})
	}
	for _, e := range j.History {
		from, err := lsn("history", e.From)
		if err != nil {
			return err
		}
		to, err := lsn("history", e.To)
		if err != nil {
			return err
		}
		r.History = append(r.History, Jump{Kind: e.Kind, From: from, To: to, At: e.At, Reason: e.Reason})
	}
	for _, m := range j.Retention {
		l, err := lsn("retention_marks", m.LSN)
		if err != nil {
			return err
		}
		r.RetentionMarks = append(r.RetentionMarks, RetentionMark{XMin: m.XMin, LSN: l, Time: m.Time, Timeline: m.Timeline})
	}
	if r.Parked, err = j.parked(); err != nil {
		return err
	}
	for _, u := range j.Used {
		r.Used = append(r.Used, Used(u))
	}
	for _, s := range j.Skips {
		l, err := lsn("skips", s.CommitLSN)
		if err != nil {
			return err
		}
		r.Skips = append(r.Skips, Skip{CommitLSN: l, ID: s.ID})
	}
	for _, b := range j.Backfills {
		rb := Job{ID: b.ID, Table: b.Table, Where: b.Where, After: b.After, Until: b.Until, Order: b.Order, Key: b.Key, Horizon: b.Horizon, Whole: b.Whole, Rows: b.Rows, Total: b.Total, Initial: b.Initial, Rel: b.Rel, Leaves: b.Leaves, Started: b.Started, Error: b.Error, MAC: b.MAC}
		if b.RequestedAt != nil {
			rb.RequestedAt = *b.RequestedAt
		}
		if b.Finished != nil {
			rb.Finished = *b.Finished
		}
		r.Backfills = append(r.Backfills, rb)
	}
	return nil
}

// FindUsed returns the request id the record remembers as taken, or nil.
func (r Record) FindUsed(id string) *Used {
	for i := range r.Used {
		if r.Used[i].ID == id {
			return &r.Used[i]
		}
	}
	return nil
}
