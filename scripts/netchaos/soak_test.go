package netchaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestSoak is make soak: for CDC_SOAK (3 minutes unless set) in each
// delivery mode of CDC_SOAK_MODES, 8 writers commit CDC_SOAK_RATE events a
// second (400) in 1-3 row transactions, one in 20 rolled back, while two
// replicas share the slot and a nemesis, every 20-60 s, picks one fault at
// random: kill -9 of the holder; SIGSTOP of the holder until the standby
// takes over; a Postgres crash; a broker stall or restart; a black hole or
// latency on a link; a cdc backfill; a cdc replay into a side topic.
//
// A reader follows the topic throughout and the checker counts at the end,
// against the table: 0 lost, 0 reordered per aggregate, 0 rows of
// rolled-back transactions, 0 confirms ahead of Kafka (sampled), and
// duplicates within what docs/operations.md promises per fault. Into
// CDC_SOAK_OUT (a directory; the test's own otherwise) it writes
// history-<mode>.jsonl (a sample a second, each fault) and
// report-<mode>.md; make soak draws the plot from the history.
func TestSoak(t *testing.T) {
	d := 3 * time.Minute
	if v := os.Getenv("CDC_SOAK"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatalf("CDC_SOAK=%q: %v", v, err)
		}
	}
	rate := 400
	if v := os.Getenv("CDC_SOAK_RATE"); v != "" {
		var err error
		if rate, err = strconv.Atoi(v); err != nil || rate < 16 {
			t.Fatalf("CDC_SOAK_RATE=%q: want events a second, at least 16", v)
		}
	}
	modes := strings.Fields(os.Getenv("CDC_SOAK_MODES"))
	if len(modes) == 0 {
		modes = []string{"at-least-once", "exactly-once"}
	}
	out := os.Getenv("CDC_SOAK_OUT")
	if out == "" {
		out = t.TempDir()
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			s := &soak{mode: mode, length: d, rate: rate, out: out, rolledBack: map[string]bool{}}
			s.run(t)
		})
	}
}

type soak struct {
	mode   string
	length time.Duration
	rate   int
	out    string

	n       *netEnv
	config  string
	procs   [2]*proc
	outs    [2]*testenv.Buffer
	started time.Time

	histMu sync.Mutex
	hist   *bufio.Writer

	faults []faultRun
	// allowed is the duplicates the faults so far may cause outside any
	// window (docs/operations.md, "Soak"): the rows backfills re-sent
	// (backfilled) and 100 a Postgres crash.
	allowed, backfilled int
	// windows are what the session-ending faults so far may send again in
	// at-least-once mode, by commit LSN.
	windows  []window
	replayed int // events cdc replay reported sending

	mu         sync.Mutex
	rolledBack map[string]bool
	committed  atomic.Int64

	reader *reader
}

type faultRun struct {
	At      float64 `json:"t"`
	Kind    string  `json:"kind"` // "fault"
	Fault   string  `json:"fault"`
	Seconds float64 `json:"seconds"`
	Detail  string  `json:"detail,omitempty"`
}

type sample struct {
	At        float64    `json:"t"`
	Kind      string     `json:"kind"` // "sample"
	PerSecond float64    `json:"events_per_s"`
	BehindS   float64    `json:"behind_s"`
	LagBytes  int64      `json:"lag_bytes"`
	RSSMB     [2]float64 `json:"rss_mb"`
	Holder    int        `json:"holder"`
}

func (s *soak) record(v any) {
	s.histMu.Lock()
	defer s.histMu.Unlock()
	b, _ := json.Marshal(v)
	s.hist.Write(append(b, '\n'))
	s.hist.Flush()
}

func (s *soak) since() float64 { return time.Since(s.started).Seconds() }

func (s *soak) run(t *testing.T) {
	s.n = newNet(t, s.mode)
	n := s.n
	testenv.Exec(t, n.db, `ALTER TABLE outbox ADD COLUMN created_at timestamptz NOT NULL DEFAULT clock_timestamp()`)
	s.config = n.config(t, fmt.Sprintf(`
max_in_flight: %d
standby: {takeover_after: 10s}
replay: {window: 1h}
`, maxInFlight))
	f, err := os.Create(filepath.Join(s.out, "history-"+s.mode+".jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s.hist = bufio.NewWriter(f)
	s.started = time.Now()
	for i := range s.procs {
		s.outs[i] = &testenv.Buffer{}
		s.procs[i] = launch(t, s.config, s.outs[i])
	}
	t.Cleanup(func() {
		if t.Failed() {
			for i, o := range s.outs {
				t.Logf("replica %d output (last 8 KB):\n%s", i, tail(o.String(), 8<<10))
			}
		}
	})
	s.waitHolder(t, 2*time.Minute)
	n.sampleConfirms(t)
	s.reader = newReader(t, n)
	stopSampling := s.sampleEverySecond(t)

	ctx, stopWriters := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() { defer wg.Done(); s.writer(ctx, w) }()
	}

	// The nemesis: one fault at a time, 20-60 s apart, picked at random;
	// with CDC_SOAK_EACH (all, or kinds such as 8,9), each kind once in
	// turn, 10 s apart: a smoke run of the nemesis itself.
	deadline := s.started.Add(s.length)
	var each []int
	switch v := os.Getenv("CDC_SOAK_EACH"); v {
	case "":
	case "all":
		for k := 0; k < faultKinds; k++ {
			each = append(each, k)
		}
	default:
		for _, f := range strings.Split(v, ",") {
			k, err := strconv.Atoi(f)
			if err != nil || k < 0 || k >= faultKinds {
				t.Fatalf("CDC_SOAK_EACH=%q: want all, or kinds from 0 to %d", v, faultKinds-1)
			}
			each = append(each, k)
		}
	}
	for i := 0; ; i++ {
		wait, kind := 20*time.Second+rand.N(40*time.Second), rand.N(faultKinds)
		if each != nil {
			if i == len(each) {
				break
			}
			wait, kind = 10*time.Second, each[i]
		}
		if each == nil && time.Now().Add(wait).After(deadline) {
			break
		}
		time.Sleep(wait) // the nemesis' rhythm: the fault, not a synchronisation
		s.fault(t, kind)
	}
	if d := time.Until(deadline); d > 0 {
		time.Sleep(d) // the soak's length
	}
	stopWriters()
	wg.Wait()

	// Every row in the table, read back through the topic.
	rows := s.table(t)
	testenv.Eventually(t, 5*time.Minute, fmt.Sprintf("all %d committed events, and the %d replayed, to be read", len(rows), s.replayed), func() bool {
		return s.reader.has(rows, s.replayed)
	})
	stopSampling()
	s.reader.stop()
	s.check(t, rows)
}

// writer commits transactions of 1-3 rows for its own 5 aggregates, each
// row a sequence number per aggregate, one transaction in 20 rolled back,
// at rate/8 rows a second, straight to Postgres; it reconnects after a
// crash. A commit whose answer is lost is judged by the table at the end.
func (s *soak) writer(ctx context.Context, w int) {
	seq := map[string]int{}
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	tick := time.NewTicker(time.Duration(float64(time.Second) * 2 * 8 / float64(s.rate))) // the load's pace
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if conn == nil || conn.IsClosed() {
			c, err := pgx.Connect(ctx, s.n.db)
			if err != nil {
				continue // Postgres restarting: the next tick tries again
			}
			conn = c
		}
		rows := 1 + rand.N(3)
		rollback := rand.N(20) == 0
		tx, err := conn.Begin(ctx)
		if err != nil {
			conn.Close(context.Background())
			conn = nil
			continue
		}
		var ids []string
		for r := 0; r < rows && err == nil; r++ {
			agg := fmt.Sprintf("w%d-%d", w, rand.N(5))
			seq[agg]++
			var id string
			err = tx.QueryRow(ctx, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
				VALUES ('order', $1, 'E', jsonb_build_object('seq', $2::int)) RETURNING id::text`, agg, seq[agg]).Scan(&id)
			ids = append(ids, id)
		}
		if err == nil && rollback {
			err = tx.Rollback(ctx)
			if err == nil {
				s.mu.Lock()
				for _, id := range ids {
					s.rolledBack[id] = true
				}
				s.mu.Unlock()
			}
		} else if err == nil {
			if err = tx.Commit(ctx); err == nil {
				s.committed.Add(int64(rows))
			}
		}
		if err != nil {
			tx.Rollback(context.Background())
			conn.Close(context.Background())
			conn = nil
		}
	}
}

// holder is the replica that streams, or -1.
func (s *soak) holder() int {
	for i, p := range s.procs {
		if p.probe("/readyz") == http.StatusOK {
			return i
		}
	}
	return -1
}

func (s *soak) waitHolder(t *testing.T, within time.Duration) int {
	t.Helper()
	h := -1
	testenv.Eventually(t, within, "a replica to stream", func() bool { h = s.holder(); return h >= 0 })
	return h
}

// window is the commit LSNs a fault that ends a session without a clean
// stop may send again in at-least-once mode: what was read and
// acknowledged but not yet confirmed (docs/operations.md, "Soak"). from is
// the slot's confirmed position when the fault began, which no later
// session starts below; to is the server's WAL position once, after the
// fault, the slot was confirmed past where the WAL then stood: a session
// that confirms past that point is through, and anything a session that
// ended earlier had read was committed before it. Exactly-once mode
// re-sends nothing a read_committed consumer sees, and keeps no windows.
//
// A window may hold many more events than that (a 30 s black hole); what
// one session's end may send again is bounded by what the connector holds
// unacknowledged (max_in_flight) and what Kafka acknowledged that the
// confirm, every confirm_interval, has not yet reached: windowCap copies.
type window struct {
	from, to pglogrepl.LSN
	at       float64 // when its fault began, seconds into the soak
	copies   int     // extra copies of its events, counted by check
}

// maxInFlight is the soak's max_in_flight: how many events the connector
// may hold unacknowledged.
const maxInFlight = 4096

// windowCap is the most copies one window may hold: max_in_flight, and 2 s
// of events for the confirm to follow Kafka's acks (docs/operations.md,
// "Soak").
func (s *soak) windowCap() int { return maxInFlight + 2*s.rate }

// attribute gives the extra copies of an event committed at commit to the
// windows holding it, one to each, and returns how many it gave and
// whether any window holds the event.
func (s *soak) attribute(commit pglogrepl.LSN, extra int) (given int, held bool) {
	for i := range s.windows {
		w := &s.windows[i]
		if w.from <= commit && commit <= w.to {
			held = true
			if given < extra {
				w.copies++
				given++
			}
		}
	}
	return given, held
}

// slotAt reads the slot's confirmed position and the server's WAL position,
// straight from Postgres (not through the proxy the fault may black-hole).
func (s *soak) slotAt(t *testing.T) (confirmed, current pglogrepl.LSN) {
	t.Helper()
	testenv.Eventually(t, 2*time.Minute, "the slot's position", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, s.n.db)
		if err != nil {
			return false // Postgres restarting
		}
		defer conn.Close(ctx)
		var c, w string
		if conn.QueryRow(ctx, `SELECT coalesce(confirmed_flush_lsn, '0/0')::text, pg_current_wal_lsn()::text FROM pg_replication_slots WHERE slot_name = 'outbox_cdc'`).Scan(&c, &w) != nil {
			return false
		}
		confirmed, _ = pglogrepl.ParseLSN(c)
		current, _ = pglogrepl.ParseLSN(w)
		return true
	})
	return confirmed, current
}

// through waits for the slot to be confirmed past where the WAL stands now,
// and returns the WAL position then: the end of a fault's window.
func (s *soak) through(t *testing.T) pglogrepl.LSN {
	t.Helper()
	_, want := s.slotAt(t)
	var end pglogrepl.LSN
	testenv.Eventually(t, 3*time.Minute, "the slot to be confirmed past "+want.String(), func() bool {
		var c pglogrepl.LSN
		c, end = s.slotAt(t)
		return c >= want
	})
	return end
}

// faultKinds is how many kinds of fault fault knows.
const faultKinds = 10

// fault runs one fault of the kind given, and records it.
func (s *soak) fault(t *testing.T, kind int) {
	t.Helper()
	n := s.n
	start := time.Now()
	at := s.since()
	name, detail := "", ""
	// ending: the fault may end a session without a clean stop.
	ending := false
	from, _ := s.slotAt(t)
	switch kind {
	case 0:
		name = "kill -9 holder"
		h := s.waitHolder(t, 2*time.Minute)
		s.procs[h].cmd.Process.Signal(syscall.SIGKILL)
		<-s.procs[h].exited
		s.procs[h] = launch(t, s.config, s.outs[h])
		ending = true
		detail = fmt.Sprintf("replica %d", h)
	case 1:
		name = "SIGSTOP holder until takeover"
		h := s.waitHolder(t, 2*time.Minute)
		s.procs[h].cmd.Process.Signal(syscall.SIGSTOP)
		other := 1 - h
		testenv.Eventually(t, 2*time.Minute, "the standby to take over", func() bool { return s.procs[other].probe("/readyz") == http.StatusOK })
		detail = fmt.Sprintf("replica %d frozen; replica %d took over in %s", h, other, time.Since(start).Round(100*time.Millisecond))
		s.procs[h].cmd.Process.Signal(syscall.SIGCONT)
		ending = true
	case 2:
		name = "Postgres crash"
		if err := pg.Crash(); err != nil {
			t.Fatalf("crash Postgres: %v", err)
		}
		s.allowed += 100 // docs/design.md, rule 7
	case 3:
		name = "broker stall"
		d := 10*time.Second + rand.N(10*time.Second)
		n.broker.Signal(t, syscall.SIGSTOP)
		time.Sleep(d) // the stall: the fault
		n.broker.Signal(t, syscall.SIGCONT)
		ending = true
	case 4:
		name = "broker restart"
		n.broker.Stop(t)
		n.broker.Start(t)
		ending = true
	case 5, 6:
		px, link := n.pgProxy, "Postgres"
		if kind == 6 {
			px, link = n.kProxy, "Kafka"
		}
		name = "black hole on the " + link + " link"
		d := 10*time.Second + rand.N(20*time.Second)
		heal := toxic(t, px, "timeout", `{"timeout": 0}`)
		time.Sleep(d) // the black hole: the fault
		heal()
		ending = true
	case 7:
		name = "20 ms latency on both links"
		var heal []func()
		for _, px := range []*toxiproxy.Proxy{n.pgProxy, n.kProxy} {
			heal = append(heal, toxic(t, px, "latency", `{"latency": 20}`))
		}
		time.Sleep(30 * time.Second) // the fault's length
		for _, h := range heal {
			h()
		}
	case 8:
		name = "cdc backfill"
		out := s.cli(t, 3*time.Minute, "backfill", "--config", s.config, "--table", "outbox", "--where", "created_at > now() - interval '3 seconds'")
		// What it sent: the rows that matched when it was asked, and those
		// committed since that match and sort below its last key.
		m := regexp.MustCompile(`backfilled (\d+) rows`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("cdc backfill said no row count:\n%s", out)
		}
		rows, _ := strconv.Atoi(m[1])
		s.allowed += rows
		s.backfilled += rows
		detail = fmt.Sprintf("%d rows", rows)
	case 9:
		name = "cdc replay into a side topic"
		// The last 10 s, within the window (which starts with the soak).
		fromT := time.Now().Add(-10 * time.Second)
		if early := s.started.Add(10 * time.Second); fromT.Before(early) {
			fromT = early
		}
		from := fromT.UTC().Format(time.RFC3339)
		out := s.cli(t, 3*time.Minute, "replay", "--config", s.config, "--from-time", from, "--to-time", time.Now().UTC().Format(time.RFC3339), "--topic-suffix", ".replay")
		m := regexp.MustCompile(`replayed (\d+) events`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("cdc replay said no count:\n%s", out)
		}
		ev, _ := strconv.Atoi(m[1])
		s.replayed += ev
		detail = fmt.Sprintf("%d events", ev)
	}
	// The next fault finds the connector streaming.
	s.waitHolder(t, 3*time.Minute)
	if ending && s.mode != "exactly-once" {
		w := window{from: from, to: s.through(t), at: at}
		s.windows = append(s.windows, w)
		detail = strings.TrimSpace(detail + fmt.Sprintf(" window %s-%s", w.from, w.to))
	}
	fr := faultRun{At: at, Kind: "fault", Fault: name, Seconds: time.Since(start).Seconds(), Detail: detail}
	s.faults = append(s.faults, fr)
	s.record(fr)
	t.Logf("%6.0fs %s (%s) %s", at, name, time.Since(start).Round(100*time.Millisecond), detail)
}

// cli runs a cdc command and returns its output; a failure fails the soak.
func (s *soak) cli(t *testing.T, within time.Duration, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "CDC_HTTP_LISTEN=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cdc %s: %v\n%s", args[0], err, out)
	}
	return string(out)
}

// sampleEverySecond writes a sample a second to the history: events a
// second first seen, how far behind the newest event read is, the slot's
// lag, each replica's RSS, and which one holds the slot.
func (s *soak) sampleEverySecond(t *testing.T) (stop func()) {
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(time.Second) // the sampling rate
		defer tick.Stop()
		last := 0
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			first, newest := s.reader.progress()
			sm := sample{At: s.since(), Kind: "sample", PerSecond: float64(first - last), Holder: s.holder(), LagBytes: -1}
			last = first
			if !newest.IsZero() {
				sm.BehindS = time.Since(newest).Seconds()
			}
			for i, p := range s.procs {
				sm.RSSMB[i] = rssMB(p.cmd.Process.Pid)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			if conn, err := pgx.Connect(ctx, s.n.db); err == nil {
				conn.QueryRow(ctx, `SELECT coalesce((pg_current_wal_lsn() - confirmed_flush_lsn)::bigint, -1) FROM pg_replication_slots WHERE slot_name = 'outbox_cdc'`).Scan(&sm.LagBytes)
				conn.Close(ctx)
			}
			cancel()
			s.record(sm)
		}
	}()
	return func() { close(done); <-stopped }
}

func rssMB(pid int) float64 {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			var kb int
			fmt.Sscanf(strings.TrimSpace(v), "%d", &kb)
			return float64(kb) / 1024
		}
	}
	return 0
}

// row is one committed event, from the table.
type row struct {
	agg string
	seq int
}

func (s *soak) table(t *testing.T) map[string]row {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), s.n.db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	rs, err := conn.Query(context.Background(), `SELECT id::text, aggregateid, (payload->>'seq')::int FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]row{}
	for rs.Next() {
		var id string
		var r row
		if err := rs.Scan(&id, &r.agg, &r.seq); err != nil {
			t.Fatal(err)
		}
		out[id] = r
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// reader follows the event topic (read_committed in exactly-once mode)
// and the replay side topic, keeping what the checker needs of each
// record: how often each id came, and where its first copy is.
type reader struct {
	cl   *kgo.Client
	main string
	done chan struct{}
	wg   sync.WaitGroup

	mu       sync.Mutex
	seen     map[string]*copyOf
	order    []string // ids, in the order first seen, per partition below
	replayed map[string]int
	first    int
	newest   time.Time
	// Per aggregate: the last sequence number of a first copy, and the
	// events whose first copy came after a later one's.
	last      map[string]int
	reordered []string
	reorders  []reorder
	unparsed  int
}

type copyOf struct {
	count     int
	commit    pglogrepl.LSN
	offset    int64
	partition int32
	// appended is the first copy's timestamp: when the broker appended
	// it, on a topic with message.timestamp.type LogAppendTime.
	appended time.Time
}

// reorder is an aggregate's event seq whose first copy came after that
// of a later one, after.
type reorder struct {
	agg        string
	seq, after int
}

func newReader(t *testing.T, n *netEnv) *reader {
	t.Helper()
	r := &reader{main: n.kafka.Prefix + "outbox.event.order", done: make(chan struct{}),
		seen: map[string]*copyOf{}, replayed: map[string]int{}, last: map[string]int{}}
	opts := []kgo.Opt{kgo.SeedBrokers(n.kafka.Brokers...), kgo.ConsumeTopics(r.main, r.main+".replay"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// The side topic appears with the first replay: look for it often.
		kgo.MetadataMinAge(time.Second), kgo.MetadataMaxAge(2 * time.Second)}
	if n.mode == "exactly-once" {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	r.cl = cl
	t.Cleanup(cl.Close)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			select {
			case <-r.done:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			fs := cl.PollFetches(ctx)
			cancel()
			r.mu.Lock()
			fs.EachRecord(r.add)
			r.mu.Unlock()
		}
	}()
	return r
}

// add takes one record; r.mu is held.
func (r *reader) add(rec *kgo.Record) {
	id := testenv.Header(rec, route.HeaderID)
	if rec.Topic != r.main {
		r.replayed[id]++
		return
	}
	if c, ok := r.seen[id]; ok {
		c.count++
		return
	}
	lsn, _ := pglogrepl.ParseLSN(testenv.Header(rec, route.HeaderCommitLSN))
	r.seen[id] = &copyOf{count: 1, commit: lsn, offset: rec.Offset, partition: rec.Partition, appended: rec.Timestamp}
	r.first++
	if rec.Timestamp.After(r.newest) {
		r.newest = rec.Timestamp
	}
	var v struct {
		Seq int `json:"seq"`
	}
	if err := json.Unmarshal(rec.Value, &v); err != nil || v.Seq == 0 {
		r.unparsed++
		return
	}
	agg := string(rec.Key)
	if v.Seq <= r.last[agg] {
		r.reordered = append(r.reordered, fmt.Sprintf("%s: event %d after %d", agg, v.Seq, r.last[agg]))
		r.reorders = append(r.reorders, reorder{agg, v.Seq, r.last[agg]})
	}
	r.last[agg] = max(r.last[agg], v.Seq)
}

func (r *reader) progress() (first int, newest time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.first, r.newest
}

// has reports whether every row's event, and replayed events in the
// side topic, have been read.
func (r *reader) has(rows map[string]row, replayed int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.replayed) < replayed {
		return false
	}
	for id := range rows {
		if r.seen[id] == nil {
			return false
		}
	}
	return true
}

func (r *reader) stop() {
	close(r.done)
	r.wg.Wait()
	// One last read of what is there now.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	fs := r.cl.PollFetches(ctx)
	r.mu.Lock()
	fs.EachRecord(r.add)
	r.mu.Unlock()
}

// check counts and writes the report.
func (s *soak) check(t *testing.T, rows map[string]row) {
	r := s.reader
	r.mu.Lock()
	defer r.mu.Unlock()
	lost, dups, rolledBack, unknown := 0, 0, 0, 0
	for id := range rows {
		if r.seen[id] == nil {
			lost++
		}
	}
	// Each copy after the first is the fault windows' (one per window
	// holding the event's commit) or, past that, counts against allowed.
	inWindows, outside, windowEvents := 0, 0, 0
	s.mu.Lock()
	for id, c := range r.seen {
		dups += c.count - 1
		given, held := s.attribute(c.commit, c.count-1)
		if held {
			windowEvents++
		}
		inWindows += given
		outside += c.count - 1 - given
		if _, ok := rows[id]; !ok {
			if s.rolledBack[id] {
				rolledBack++
			} else {
				unknown++
			}
		}
	}
	s.mu.Unlock()
	replayUnknown := 0
	for id := range r.replayed {
		if _, ok := rows[id]; !ok {
			replayUnknown++
		}
	}
	ahead, points := s.aheadOfKafka()

	var b strings.Builder
	fmt.Fprintf(&b, "# Soak, %s\n\n", s.mode)
	fmt.Fprintf(&b, "%s in %s: 8 writers at %d events/s in 1-3 row transactions (one in 20 rolled back), two replicas, %d faults. Apache Kafka and Postgres on the same box, each behind a toxiproxy.\n\n",
		time.Now().UTC().Format("2006-01-02"), s.length, s.rate, len(s.faults))
	fmt.Fprintf(&b, "| committed events | read | lost | reordered | rolled-back rows seen | unknown | duplicates | in fault windows (events there) | outside them (allowed) | of which backfills | confirms sampled | ahead of Kafka | replayed (side topic) | replayed, not rows |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	fmt.Fprintf(&b, "| %d | %d | %d | %d | %d | %d | %d | %d (%d) | %d (%d) | %d | %d | %d | %d | %d |\n\n",
		len(rows), len(r.seen), lost, len(r.reordered), rolledBack, unknown, dups, inWindows, windowEvents, outside, s.allowed, s.backfilled, points, ahead, len(r.replayed), replayUnknown)
	for _, w := range s.windows {
		fmt.Fprintf(&b, "Window of the fault at %.0f s, %s-%s: %d copies (at most %d).\n\n", w.at, w.from, w.to, w.copies, s.windowCap())
	}
	fmt.Fprintf(&b, "| at (s) | fault | took (s) | |\n|---|---|---|---|\n")
	count := map[string]int{}
	for _, f := range s.faults {
		fmt.Fprintf(&b, "| %.0f | %s | %.1f | %s |\n", f.At, f.Fault, f.Seconds, f.Detail)
		count[f.Fault]++
	}
	if err := os.WriteFile(filepath.Join(s.out, "report-"+s.mode+".md"), []byte(b.String()), 0o644); err != nil {
		t.Error(err)
	}
	t.Logf("\n%s", b.String())

	if lost+len(r.reordered)+rolledBack+unknown+ahead+replayUnknown > 0 {
		for _, e := range r.reordered[:min(3, len(r.reordered))] {
			t.Errorf("reordered: %s", e)
		}
		t.Errorf("%d lost, %d reordered, %d rolled-back rows seen, %d unknown, %d confirmed ahead of Kafka, %d replayed events of no row; want 0 each",
			lost, len(r.reordered), rolledBack, unknown, ahead, replayUnknown)
	}
	if r.unparsed > 0 {
		t.Errorf("%d records without a sequence number in their value", r.unparsed)
	}
	for _, w := range s.windows {
		if w.copies > s.windowCap() {
			t.Errorf("the fault at %.0f s sent %d events again; one session's end may send at most %d (max_in_flight and 2 s of events)", w.at, w.copies, s.windowCap())
		}
	}
	if outside > s.allowed {
		t.Errorf("%d duplicates outside the session-ending faults' windows; the faults allow %d there (%d of them backfilled rows)", outside, s.allowed, s.backfilled)
	}
	if points == 0 {
		t.Errorf("no confirm was sampled")
	}
}

// aheadOfKafka counts events confirmed to the slot before Kafka had
// appended them, at each sampled confirm: per partition, the first copies
// by offset with the lowest commit LSN from each offset on.
func (s *soak) aheadOfKafka() (ahead, points int) {
	r := s.reader
	type placed struct {
		offset int64
		commit pglogrepl.LSN
	}
	parts := map[int32][]placed{}
	for _, c := range r.seen {
		parts[c.partition] = append(parts[c.partition], placed{c.offset, c.commit})
	}
	minFrom := map[int32][]pglogrepl.LSN{}
	for p, ps := range parts {
		slices.SortFunc(ps, func(a, b placed) int { return int(a.offset - b.offset) })
		m := make([]pglogrepl.LSN, len(ps)+1)
		m[len(ps)] = ^pglogrepl.LSN(0)
		for i := len(ps) - 1; i >= 0; i-- {
			m[i] = min(m[i+1], ps[i].commit)
		}
		minFrom[p] = m
	}
	n := s.n
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, pt := range n.points {
		points++
		for p, ps := range parts {
			end, ok := pt.ends[r.main][p]
			if !ok {
				continue
			}
			i, _ := slices.BinarySearchFunc(ps, end, func(a placed, off int64) int { return int(a.offset - off) })
			if minFrom[p][i] < pt.confirmed {
				ahead++
			}
		}
	}
	return ahead, points
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
