package netchaos

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestTableLife is the table-life nemesis (make chaos, short; make soak,
// long): for CDC_TABLELIFE (2 minutes unless set) in each delivery mode of
// CDC_TABLELIFE_MODES, 4 writers commit CDC_TABLELIFE_RATE events a second
// (200) into two outbox tables, public.outbox (retention mode delete) and
// public.outbox_p (partitioned by 10-second ranges of created_at, which a
// partman of the test creates ahead; retention mode drop_partitions, after
// 8s, so that a partition whose range has passed stays a while for the
// nemesis to detach), the first with retention.after 2s, each row with a ledger row in the same
// transaction, while two replicas share the slot and a nemesis, every
// 4-10 s, makes one of the changes a platform team makes to its tables: a
// rename (and back), a swap, a drop and create again in one transaction,
// the table removed from the publication and added back (the connector
// stops, loudly; the operator sends the rows of the gap with cdc backfill
// and starts it again), a partition attached with rows in it, a partition
// detached and attached again, publish_via_partition_root turned off, a
// kill -9 of the holder, and a rewrite of a table (ALTER COLUMN ... TYPE);
// recreates and swaps come with a transaction
// left open across the change. With CDC_TABLELIFE_EACH=all, each change
// once in turn: CI's short run.
//
// Checked: every committed insert (the ledger) delivered, 0 unknown; no
// row ever left the tables before its event was in Kafka (a monitor reads
// every row of the tables three times a second, and two reads in a row
// must miss a row, and the broker stamps each record with its append time); the rows of an attached partition never
// deleted and never sent; no stop but the ones the changes must cause,
// each naming the table; per-aggregate order, but where a repair sent rows
// of a recreated table written before it was published (documented:
// docs/operations.md, "The outbox table's life"). Into CDC_SOAK_OUT it
// writes history-tablelife-<mode>.jsonl and report-tablelife-<mode>.md.
func TestTableLife(t *testing.T) {
	d := envDuration(t, "CDC_TABLELIFE", 2*time.Minute)
	rate := 200
	if v := os.Getenv("CDC_TABLELIFE_RATE"); v != "" {
		var err error
		if rate, err = strconv.Atoi(v); err != nil || rate < 8 {
			t.Fatalf("CDC_TABLELIFE_RATE=%q: want events a second, at least 8", v)
		}
	}
	modes := strings.Fields(os.Getenv("CDC_TABLELIFE_MODES"))
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
			l := &life{mode: mode, length: d, rate: rate, out: out, names: map[string]string{"outbox": "outbox", "outbox_p": "outbox_p"},
				exempt: map[string]bool{}, prefilled: map[string]bool{}, present: map[string]time.Time{}, missing: map[string]time.Time{}, gone: map[string]time.Time{}}
			l.run(t)
		})
	}
}

// envDuration is the duration in the environment variable name, or def.
func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return d
}

// life is one run of the table-life nemesis.
type life struct {
	mode   string
	length time.Duration
	rate   int
	out    string

	n       *netEnv
	config  string
	procs   [2]*proc
	outs    [2]*testenv.Buffer
	started time.Time
	reader  *reader
	hist    *bufio.Writer
	histMu  sync.Mutex

	// mu guards the tables' names (each family's current name), and is
	// held across a change that renames them.
	mu    sync.Mutex
	names map[string]string
	// leftovers are swapped-out tables the test drops once their rows
	// were read; swaps counts them.
	leftovers []string
	swaps     int
	rewrites  int // the "rewritten" changes made: each alternates the type column's type

	// Guarded by track: the rows the test itself removed with a table
	// (exempt), the rows attached with a partition (prefilled), every row
	// seen in the tables and when (present), rows missing from the last
	// read and since when (missing), and when each row was first seen
	// gone (gone).
	track     sync.Mutex
	exempt    map[string]bool
	prefilled map[string]bool
	present   map[string]time.Time
	missing   map[string]time.Time
	gone      map[string]time.Time
	reads     int

	// open counts the transactions openTx left open, which the checker
	// waits for before it reads the ledger.
	open sync.WaitGroup

	ops []faultRun
	// repairs are from a recreate or a swap to repairWindow after; gaps, from a
	// table leaving the publication to a second after it is back: what a
	// repair or the operator's backfill sends of them comes after later
	// events of the same aggregates.
	repairs, gaps [][2]time.Time
	stops         []string // the stops the changes caused
	expect        [2]bool  // a replica whose exit a change causes
	backed        int      // rows cdc backfill re-sent
}

func (l *life) run(t *testing.T) {
	l.n = newNet(t, l.mode)
	n := l.n
	testenv.Exec(t, n.db,
		`ALTER TABLE outbox ADD COLUMN created_at timestamptz NOT NULL DEFAULT clock_timestamp()`,
		`CREATE TABLE ledger (id uuid PRIMARY KEY, agg text NOT NULL, seq int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`,
		`CREATE TABLE outbox_p (id uuid NOT NULL DEFAULT gen_random_uuid(), created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
			aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb, PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)`,
		`CREATE TABLE outbox_p_default PARTITION OF outbox_p DEFAULT`)
	l.partman(t, context.Background())
	l.config = l.writeConfig(t)
	f, err := os.Create(filepath.Join(l.out, "history-tablelife-"+l.mode+".jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l.hist = bufio.NewWriter(f)
	l.started = time.Now()
	for i := range l.procs {
		l.outs[i] = &testenv.Buffer{}
		l.procs[i] = launch(t, l.config, l.outs[i])
	}
	t.Cleanup(func() {
		if t.Failed() {
			for i, o := range l.outs {
				t.Logf("replica %d output (last 8 KB):\n%s", i, tail(o.String(), 8<<10))
			}
		}
	})
	l.waitHolder(t, 2*time.Minute)
	n.sampleConfirms(t)
	l.reader = newReader(t, n)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() { defer wg.Done(); l.writer(ctx, w) }()
	}
	wg.Add(3)
	go func() { defer wg.Done(); l.monitor(ctx) }()
	go func() { defer wg.Done(); l.partman(t, ctx) }()
	go func() { defer wg.Done(); l.sample(ctx) }()

	l.nemesis(t)
	stop()
	wg.Wait()
	l.open.Wait()
	l.finish(t)
}

// writeConfig is the connector's configuration: the two tables with
// retention, a catalog look every second, a standby that takes over a
// silent holder in 10 s, and records stamped with the broker's append
// time.
func (l *life) writeConfig(t *testing.T) string {
	t.Helper()
	n := l.n
	base, err := os.ReadFile(n.config(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	topic := n.kafka.Prefix + "outbox.event.{aggregate_type}"
	body := regexp.MustCompile(`(?m)^tables: .*$`).ReplaceAllString(string(base), fmt.Sprintf(`tables:
  - {name: outbox, topic: %q, retention: {after: 2s}}
  - {name: outbox_p, topic: %q, retention: {after: 8s, mode: drop_partitions}}`, topic, topic))
	body = strings.Replace(body, "kafka: {brokers: [", "kafka: {topic_defaults: {configs: {message.timestamp.type: LogAppendTime}}, brokers: [", 1)
	body = strings.Replace(body, "postgres: {", "postgres: {catalog_check_interval: 1s, ", 1)
	body += "standby: {takeover_after: 10s}\n"
	file := filepath.Join(t.TempDir(), "cdc.yaml")
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// partman creates outbox_p's 10-second partitions ahead, every second
// until ctx ends (once, at once, with a context that does not).
func (l *life) partman(t *testing.T, ctx context.Context) {
	for {
		l.mu.Lock()
		root := l.names["outbox_p"]
		l.mu.Unlock()
		now := time.Now().Unix() / 10 * 10
		for k := int64(0); k < 4; k++ {
			from := time.Unix(now+10*k, 0).UTC()
			sql := fmt.Sprintf(`CREATE TABLE IF NOT EXISTS outbox_p_%d PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')`,
				from.Unix(), root, from.Format(time.RFC3339), from.Add(10*time.Second).Format(time.RFC3339))
			if err := l.exec(context.Background(), sql); err != nil && ctx.Done() == nil {
				t.Fatalf("partman: %v", err)
			}
		}
		if ctx.Done() == nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second): // partman's pace
		}
	}
}

// exec runs statements on a connection of their own.
func (l *life) exec(ctx context.Context, sql ...string) error {
	conn, err := pgx.Connect(ctx, l.n.db)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for _, s := range sql {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// insert writes rows events of family into its current table, each with
// its ledger row, in tx; seq numbers the aggregate's events.
func (l *life) insert(ctx context.Context, tx pgx.Tx, table, agg string, seq func() int, rows int) error {
	for r := 0; r < rows; r++ {
		s := seq()
		var id string
		err := tx.QueryRow(ctx, `INSERT INTO `+table+` (aggregatetype, aggregateid, type, payload)
			VALUES ('order', $1, 'E', jsonb_build_object('seq', $2::int)) RETURNING id::text`, agg, s).Scan(&id)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO ledger (id, agg, seq) VALUES ($1, $2, $3)`, id, agg, s); err != nil {
			return err
		}
	}
	return nil
}

// writer commits transactions of 1-3 events for its own aggregates, one of
// the two tables each, one in 20 rolled back. A table renamed or dropped
// under it fails the transaction, which it rolls back, as an application
// does. An aggregate's sequence numbers go up only with commits.
func (l *life) writer(ctx context.Context, w int) {
	seq := map[string]int{}
	tick := time.NewTicker(time.Duration(float64(time.Second) * 2 * 4 / float64(l.rate))) // the load's pace
	defer tick.Stop()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if conn == nil || conn.IsClosed() {
			c, err := pgx.Connect(ctx, l.n.db)
			if err != nil {
				continue
			}
			conn = c
		}
		family := []string{"outbox", "outbox_p"}[rand.N(2)]
		agg := fmt.Sprintf("w%d-%s-%d", w, family, rand.N(4))
		l.mu.Lock()
		table := l.names[family]
		l.mu.Unlock()
		next := seq[agg]
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if err := l.insert(ctx, tx, table, agg, func() int { next++; return next }, 1+rand.N(3)); err != nil {
				return err
			}
			if rand.N(20) == 0 {
				return errRolledBack
			}
			return nil
		})
		if err == nil {
			seq[agg] = next
		} else if !errors.Is(err, errRolledBack) && conn.IsClosed() {
			conn = nil
		}
	}
}

var errRolledBack = errors.New("rolled back on purpose")

// openTx begins a transaction that writes an event into family's table
// now and commits it after hold, with another: open across the change the
// nemesis makes meanwhile.
func (l *life) openTx(t *testing.T, family string, hold time.Duration) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, l.n.db)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	table := l.names[family]
	l.mu.Unlock()
	agg, seq := fmt.Sprintf("open-%d", time.Now().UnixNano()), 0
	next := func() int { seq++; return seq }
	if err := l.insert(ctx, tx, table, agg, next, 1); err != nil {
		t.Fatalf("open transaction: %v", err)
	}
	l.open.Add(1)
	go func() {
		defer l.open.Done()
		defer conn.Close(ctx)
		time.Sleep(hold) // the transaction's length: the fault
		if err := l.insert(ctx, tx, table, agg, next, 1); err != nil {
			tx.Rollback(ctx)
			return
		}
		tx.Commit(ctx)
	}()
}

// changes are the nemesis' changes, by kind.
var changes = []string{
	"rename and back", "swap", "drop and create again", "removed from the publication and added back",
	"partition attached with rows", "partition detached and attached again", "publish_via_partition_root off", "kill -9 holder",
	"rewritten",
}

// nemesis makes one change every 4-10 s, picked at random, until the run's
// length; with CDC_TABLELIFE_EACH=all, each kind once in turn, 5 s apart.
func (l *life) nemesis(t *testing.T) {
	deadline := l.started.Add(l.length)
	var each []int
	if os.Getenv("CDC_TABLELIFE_EACH") == "all" {
		for k := range changes {
			each = append(each, k)
		}
	}
	for i := 0; ; i++ {
		wait, kind := 4*time.Second+rand.N(6*time.Second), rand.N(len(changes))
		if each != nil {
			if i == len(each) {
				break
			}
			wait, kind = 5*time.Second, each[i]
		}
		if each == nil && time.Now().Add(wait).After(deadline) {
			break
		}
		time.Sleep(wait) // the nemesis' rhythm: the change, not a synchronisation
		l.change(t, kind)
		l.dropLeftovers(t)
	}
	if d := time.Until(deadline); d > 0 && each == nil {
		time.Sleep(d) // the run's length
	}
}

// change makes one change of the kind given, waits for the connector to
// stream again, and records it.
func (l *life) change(t *testing.T, kind int) {
	t.Helper()
	start, at := time.Now(), time.Since(l.started).Seconds()
	detail := ""
	switch kind {
	case 0:
		family := []string{"outbox", "outbox_p"}[rand.N(2)]
		l.openTx(t, other(family), 4*time.Second) // open across the rename, on the other table
		l.mu.Lock()
		l.must(t, fmt.Sprintf(`ALTER TABLE %s RENAME TO %s_r`, family, family))
		l.names[family] = family + "_r"
		l.mu.Unlock()
		time.Sleep(3*time.Second + rand.N(3*time.Second)) // the rename's length: the change
		l.mu.Lock()
		l.must(t, fmt.Sprintf(`ALTER TABLE %s_r RENAME TO %s`, family, family))
		l.names[family] = family
		l.mu.Unlock()
		detail = family
	case 1:
		l.openTx(t, "outbox_p", time.Second) // open across the swap, on the other table
		l.swaps++
		old := fmt.Sprintf("outbox_old_%d", l.swaps)
		l.mu.Lock()
		l.must(t, `BEGIN`, `ALTER TABLE outbox RENAME TO `+old, `CREATE TABLE outbox (LIKE `+old+` INCLUDING ALL)`, `COMMIT`)
		l.leftovers = append(l.leftovers, old)
		l.mu.Unlock()
		l.repairs = append(l.repairs, [2]time.Time{start, start.Add(repairWindow)})
		l.openTx(t, "outbox", 2*time.Second+rand.N(time.Second))
		l.straggler(t, old)
		detail = "old table " + old + ", 5 events written to it after"
	case 2:
		l.openTx(t, "outbox_p", time.Second) // open across the recreate, on the other table
		l.recreate(t)
		l.repairs = append(l.repairs, [2]time.Time{start, start.Add(repairWindow)})
		l.openTx(t, "outbox", 2*time.Second+rand.N(time.Second))
	case 3:
		l.openTx(t, "outbox", 2*time.Second) // open across the table's leaving the publication, on the table
		detail = l.leftAndBack(t)
	case 4:
		detail = l.attachFilled(t)
	case 5:
		detail = l.detachAndBack(t)
	case 6:
		l.must(t, `ALTER PUBLICATION outbox_cdc SET (publish_via_partition_root = false)`)
		testenv.Eventually(t, time.Minute, "the connector to set publish_via_partition_root back", func() bool {
			var on bool
			testenv.QueryRow(t, l.n.db, `SELECT pubviaroot FROM pg_publication WHERE pubname = 'outbox_cdc'`, nil, &on)
			return on
		})
	case 7:
		h := l.waitHolder(t, 2*time.Minute)
		l.expect[h] = true
		l.procs[h].cmd.Process.Signal(syscall.SIGKILL)
		<-l.procs[h].exited
		l.procs[h] = launch(t, l.config, l.outs[h])
		l.expect[h] = false
		detail = fmt.Sprintf("replica %d", h)
	case 8:
		// A migration that rewrites the table: every row gets a new
		// file and the rewrite's xid (retention's floor no longer tells
		// the rows, docs/design.md, "Retention"). USING forces the
		// rewrite both ways.
		family := []string{"outbox", "outbox_p"}[rand.N(2)]
		l.openTx(t, other(family), 2*time.Second) // open across the rewrite, on the other table
		to := []string{"varchar(200)", "text"}[l.rewrites%2]
		l.rewrites++
		l.must(t, fmt.Sprintf(`ALTER TABLE %s ALTER COLUMN type TYPE %s USING type::%s`, family, to, to))
		detail = family + ", type " + to
	}
	l.waitHolder(t, 3*time.Minute)
	l.checkStops(t)
	fr := faultRun{At: at, Kind: "fault", Fault: changes[kind], Seconds: time.Since(start).Seconds(), Detail: detail}
	l.ops = append(l.ops, fr)
	l.record(fr)
	t.Logf("%6.0fs %s (%s) %s", at, changes[kind], time.Since(start).Round(100*time.Millisecond), detail)
}

// repairWindow bounds a repair's reach in time: the watch looks every
// second, then waits for the transaction left open across the change (2-3
// s) and sends the snapshot. A repair sends the rows a recreated table
// received before it was published first, in commit order
// (docs/design.md, "Table changes"), but what the table cannot tell stays
// out of order: an aggregate written in a swap's old table and its new
// one, and overlapping transactions where track_commit_timestamp is off
// (the nemesis leaves one open across each change). So reorders within
// the window are still counted apart.
const repairWindow = 10 * time.Second

// other is the other table family.
func other(family string) string {
	if family == "outbox" {
		return "outbox_p"
	}
	return "outbox"
}

// must runs statements on one connection, in order; a failure fails the run.
func (l *life) must(t *testing.T, sql ...string) {
	t.Helper()
	if err := l.exec(context.Background(), sql...); err != nil {
		t.Fatal(err)
	}
}

// straggler writes 5 events into old, a swap's old table, as an
// application instance that still has it would.
func (l *life) straggler(t *testing.T, old string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, l.n.db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	agg, seq := "straggler-"+old, 0
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		return l.insert(ctx, tx, old, agg, func() int { seq++; return seq }, 5)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// recreate drops and creates outbox again in one transaction, as a
// migration tool does, noting the rows it drops with it (their events are
// in the WAL, and must still arrive; their leaving is the test's doing).
func (l *life) recreate(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, l.n.db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	l.track.Lock()
	defer l.track.Unlock()
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE`); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT id::text FROM outbox`)
		if err != nil {
			return err
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		for _, id := range ids {
			l.exempt[id] = true
		}
		_, err = tx.Exec(ctx, `CREATE TABLE outbox_next (LIKE outbox INCLUDING ALL); DROP TABLE outbox; ALTER TABLE outbox_next RENAME TO outbox`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// leftAndBack removes outbox from the publication and adds it back: the
// holder stops, naming the table, and so does the standby if it takes the
// slot while the table is out; once it is back a start takes the new
// membership (saying so). As the operator, the test then sends the rows
// written since with cdc backfill, and starts the stopped replicas again.
func (l *life) leftAndBack(t *testing.T) string {
	t.Helper()
	h := l.waitHolder(t, 2*time.Minute)
	l.expect = [2]bool{true, true}
	var from time.Time
	testenv.QueryRow(t, l.n.db, `SELECT clock_timestamp() - interval '1 second'`, nil, &from)
	l.must(t, `ALTER PUBLICATION outbox_cdc DROP TABLE outbox`)
	select {
	case <-l.procs[h].exited:
	case <-time.After(time.Minute):
		t.Fatalf("replica %d streams on after public.outbox left the publication", h)
	}
	l.must(t, `ALTER PUBLICATION outbox_cdc ADD TABLE outbox`)
	l.gaps = append(l.gaps, [2]time.Time{from, time.Now().Add(time.Second)})
	// Every replica that stopped (the standby too, if it took the slot
	// while the table was out) names the table, and is started again,
	// until one streams: a standby that waits on the held slot reads no
	// catalog, so none stops after that.
	var stops []string
	testenv.Eventually(t, 2*time.Minute, "a replica to stream with the table back", func() bool {
		for i, p := range l.procs {
			select {
			case <-p.exited:
			default:
				continue
			}
			stop := lastError(l.outs[i].String())
			if !strings.Contains(stop, "public.outbox") || !strings.Contains(stop, "left publication") {
				t.Fatalf("replica %d stopped with %q; want a stop that names public.outbox leaving the publication", i, stop)
			}
			stops = append(stops, fmt.Sprintf("replica %d: %s", i, stop))
			l.procs[i] = launch(t, l.config, l.outs[i])
		}
		return l.holder() >= 0
	})
	l.stops = append(l.stops, stops...)
	l.expect = [2]bool{}
	out := l.cli(t, "backfill", "--config", l.config, "--table", "outbox", "--where", fmt.Sprintf("created_at >= '%s'", from.UTC().Format(time.RFC3339Nano)))
	m := regexp.MustCompile(`backfilled (\d+) rows`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("cdc backfill said no row count:\n%s", out)
	}
	rows, _ := strconv.Atoi(m[1])
	l.backed += rows
	return fmt.Sprintf("%d replicas stopped (%s); %d rows backfilled", len(stops), strings.Join(stops, "; "), rows)
}

// attachFilled attaches a table with 10 rows as a partition of outbox_p:
// they were never inserted into the outbox, so never events; retention
// must keep them.
func (l *life) attachFilled(t *testing.T) string {
	t.Helper()
	k := len(l.ops)
	name := fmt.Sprintf("prefill_%d", k)
	from := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC).AddDate(0, 0, k)
	l.mu.Lock()
	root := l.names["outbox_p"]
	l.must(t, fmt.Sprintf(`CREATE TABLE %s (LIKE %s INCLUDING DEFAULTS)`, name, root),
		fmt.Sprintf(`INSERT INTO %s (created_at, aggregatetype, aggregateid, type) SELECT '%s', 'order', 'prefilled', 'Old' FROM generate_series(1, 10)`, name, from.Format(time.RFC3339)))
	ids := l.ids(t, name)
	l.track.Lock()
	for _, id := range ids {
		l.prefilled[id] = true
	}
	l.track.Unlock()
	l.must(t, fmt.Sprintf(`ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')`, root, name, from.Format(time.RFC3339), from.AddDate(0, 0, 1).Format(time.RFC3339)))
	l.mu.Unlock()
	return name
}

// detachAndBack detaches a partition of outbox_p whose range has passed
// and attaches it again with its bounds a few seconds later.
func (l *life) detachAndBack(t *testing.T) string {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	root := l.names["outbox_p"]
	var name, bound string
	conn, err := pgx.Connect(context.Background(), l.n.db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	err = conn.QueryRow(context.Background(), `SELECT c.relname, coalesce(pg_get_expr(c.relpartbound, c.oid), '') FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = $1::regclass AND c.relname ~ '^outbox_p_[0-9]+$' AND substring(c.relname FROM 10)::bigint + 10 < extract(epoch FROM now())
		ORDER BY c.relname DESC LIMIT 1`, root).Scan(&name, &bound)
	if errors.Is(err, pgx.ErrNoRows) {
		return "no partition whose range has passed"
	}
	if err != nil {
		t.Fatal(err)
	}
	if bound == "" {
		return name + " being dropped by retention"
	}
	if err := l.exec(context.Background(), fmt.Sprintf(`ALTER TABLE %s DETACH PARTITION %s`, root, name)); err != nil {
		// Retention dropped it between the look and the detach.
		if err != nil && !strings.Contains(err.Error(), "does not exist") && !strings.Contains(err.Error(), "is not a partition") {
			t.Fatal(err)
		}
		return name + " dropped by retention meanwhile"
	}
	time.Sleep(2*time.Second + rand.N(2*time.Second)) // detached: the change
	l.must(t, fmt.Sprintf(`ALTER TABLE %s ATTACH PARTITION %s %s`, root, name, bound))
	return name
}

// dropLeftovers drops the swapped-out tables whose rows were all read
// from the topic: as a team drops the old table once the migration is
// done. Their rows' leaving is the test's doing.
func (l *life) dropLeftovers(t *testing.T) {
	t.Helper()
	var kept []string
	for _, old := range l.leftovers {
		ids := l.ids(t, old)
		read := true
		l.reader.mu.Lock()
		for _, id := range ids {
			read = read && l.reader.seen[id] != nil
		}
		l.reader.mu.Unlock()
		if !read {
			kept = append(kept, old)
			continue
		}
		l.track.Lock()
		for _, id := range ids {
			l.exempt[id] = true
		}
		l.must(t, `DROP TABLE `+old)
		l.track.Unlock()
	}
	l.leftovers = kept
}

// ids is the id of every row of table, on a connection of its own.
func (l *life) ids(t *testing.T, table string) []string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, l.n.db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT id::text FROM `+table)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// lastError is the last error line a replica logged, or its last line.
func lastError(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], "[ERROR]") {
			return strings.TrimSpace(lines[i])
		}
	}
	return strings.TrimSpace(lines[len(lines)-1])
}

// holder is the replica that streams, or -1.
func (l *life) holder() int {
	for i, p := range l.procs {
		if p.probe("/readyz") == http.StatusOK {
			return i
		}
	}
	return -1
}

func (l *life) waitHolder(t *testing.T, within time.Duration) int {
	t.Helper()
	h := -1
	testenv.Eventually(t, within, "a replica to stream", func() bool {
		l.checkStops(t)
		h = l.holder()
		return h >= 0
	})
	return h
}

// checkStops fails the run on a replica that exited when no change made it
// stop: every stop must be one the changes cause, and loud.
func (l *life) checkStops(t *testing.T) {
	t.Helper()
	for i, p := range l.procs {
		select {
		case <-p.exited:
			if !l.expect[i] {
				t.Fatalf("replica %d stopped: %s", i, lastError(l.outs[i].String()))
			}
		default:
		}
	}
}

// cli runs a cdc command and returns its output; a failure fails the run.
func (l *life) cli(t *testing.T, args ...string) string {
	t.Helper()
	s := &soak{}
	return s.cli(t, 3*time.Minute, args...)
}

func (l *life) record(v any) {
	l.histMu.Lock()
	defer l.histMu.Unlock()
	b, _ := json.Marshal(v)
	l.hist.Write(append(b, '\n'))
	l.hist.Flush()
}

// family reads, in one snapshot, the id of every row of every table with
// an aggregateid column (the outbox tables under any name, their
// partitions, detached ones, swapped-out ones), and when the snapshot was
// taken at the latest.
func (l *life) family(ctx context.Context, conn *pgx.Conn) (map[string]bool, time.Time, error) {
	ids := map[string]bool{}
	var at time.Time
	err := pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = 'public' AND c.relkind = 'r' AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'aggregateid' AND NOT a.attisdropped)`)
		if err != nil {
			return err
		}
		tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		at = time.Now() // the snapshot was taken by the query above
		if len(tables) == 0 {
			return nil
		}
		var q []string
		for _, tb := range tables {
			q = append(q, "SELECT id::text FROM "+tb)
		}
		rows, err = tx.Query(ctx, strings.Join(q, " UNION ALL "))
		if err != nil {
			return err
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		for _, id := range got {
			ids[id] = true
		}
		return err
	})
	return ids, at, err
}

// monitor reads the tables' rows three times a second until ctx ends, and
// notes when each row was first found gone.
func (l *life) monitor(ctx context.Context) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	for ctx.Err() == nil {
		if conn == nil || conn.IsClosed() {
			c, err := pgx.Connect(ctx, l.n.db)
			if err != nil {
				continue
			}
			conn = c
		}
		ids, at, err := l.family(ctx, conn)
		if err == nil {
			l.track.Lock()
			l.reads++
			// A row is gone when two reads in a row miss it, as of the
			// first: a table rewrite (ALTER TABLE ... TYPE) is not MVCC-safe,
			// and a snapshot taken before it commits reads the rewritten
			// table as empty. A deleted row does not come back.
			for id, since := range l.missing {
				if !ids[id] && !l.exempt[id] {
					l.gone[id] = since
				}
				delete(l.missing, id)
			}
			for id := range ids {
				l.present[id] = at
			}
			for id := range l.present {
				if !ids[id] {
					l.missing[id] = at
					delete(l.present, id)
				}
			}
			l.track.Unlock()
		}
		select {
		case <-ctx.Done():
		case <-time.After(300 * time.Millisecond): // the monitor's pace
		}
	}
}

// sample writes a sample a second to the history: events a second first
// seen, how far behind the newest event read is, each replica's RSS, and
// which one holds the slot.
func (l *life) sample(ctx context.Context) {
	tick := time.NewTicker(time.Second) // the sampling rate
	defer tick.Stop()
	last := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		first, newest := l.reader.progress()
		sm := sample{At: time.Since(l.started).Seconds(), Kind: "sample", PerSecond: float64(first - last), Holder: l.holder(), LagBytes: -1}
		last = first
		if !newest.IsZero() {
			sm.BehindS = time.Since(newest).Seconds()
		}
		for i, p := range l.procs {
			sm.RSSMB[i] = rssMB(p.cmd.Process.Pid)
		}
		l.record(sm)
	}
}

// ledgerRow is one committed event, from the ledger.
type ledgerRow struct {
	agg string
	seq int
	at  time.Time
}

// finish waits for every committed event to be read, and checks.
func (l *life) finish(t *testing.T) {
	t.Helper()
	conn := testenv.Connect(t, l.n.db)
	rows, err := conn.Query(context.Background(), `SELECT id::text, agg, seq, at FROM ledger`)
	if err != nil {
		t.Fatal(err)
	}
	ledger := map[string]ledgerRow{}
	bySeq := map[string]time.Time{}
	for rows.Next() {
		var id string
		var r ledgerRow
		if err := rows.Scan(&id, &r.agg, &r.seq, &r.at); err != nil {
			t.Fatal(err)
		}
		ledger[id] = r
		bySeq[fmt.Sprintf("%s/%d", r.agg, r.seq)] = r.at
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	testenv.Eventually(t, 5*time.Minute, fmt.Sprintf("all %d committed events to be read", len(ledger)), func() bool {
		l.checkStops(t)
		l.reader.mu.Lock()
		defer l.reader.mu.Unlock()
		for id := range ledger {
			if l.reader.seen[id] == nil {
				return false
			}
		}
		return true
	})
	l.reader.stop()
	final, _, err := l.family(context.Background(), conn)
	if err != nil {
		t.Fatal(err)
	}
	r := l.reader
	r.mu.Lock()
	defer r.mu.Unlock()
	l.track.Lock()
	defer l.track.Unlock()
	// What the monitor's last read missed, the final read decides.
	for id, since := range l.missing {
		if !final[id] && !l.exempt[id] {
			l.gone[id] = since
		}
	}
	c := lifeCounts{committed: len(ledger), read: len(r.seen), deletes: len(l.gone), prefilled: len(l.prefilled), backfilled: l.backed, reads: l.reads}
	for id := range ledger {
		if r.seen[id] == nil {
			c.lost++
		}
	}
	for id, cp := range r.seen {
		c.dups += cp.count - 1
		if _, ok := ledger[id]; !ok {
			if l.prefilled[id] {
				c.prefilledSent++
			} else {
				c.unknown++
			}
		}
	}
	for id, at := range l.gone {
		if cp := r.seen[id]; cp == nil || cp.appended.After(at) {
			c.early++
			if c.early <= 3 {
				t.Errorf("row %s left the tables by %s, before its event was in Kafka (appended %v)", id, at.Format(time.RFC3339Nano), cp)
			}
		}
	}
	for id := range l.prefilled {
		if !final[id] {
			c.prefilledGone++
		}
	}
	in := func(windows [][2]time.Time, ro reorder) bool {
		for _, at := range []time.Time{bySeq[fmt.Sprintf("%s/%d", ro.agg, ro.seq)], bySeq[fmt.Sprintf("%s/%d", ro.agg, ro.after)]} {
			for _, w := range windows {
				if !at.Before(w[0]) && at.Before(w[1]) {
					return true
				}
			}
		}
		return false
	}
	for _, ro := range r.reorders {
		switch {
		case in(l.repairs, ro):
			c.repairReordered++
			continue
		case in(l.gaps, ro):
			c.gapReordered++
			continue
		}
		c.reordered++
		if c.reordered <= 3 {
			t.Errorf("reordered: %s: event %d after %d", ro.agg, ro.seq, ro.after)
		}
	}
	c.ahead, c.points = (&soak{reader: r, n: l.n}).aheadOfKafka()
	l.report(t, c)
	if c.lost+c.unknown+c.early+c.prefilledSent+c.prefilledGone+c.reordered > 0 || r.unparsed > 0 {
		t.Errorf("%d lost, %d unknown, %d rows gone before their event was in Kafka, %d attached rows sent, %d attached rows deleted, %d reordered outside a repair, %d records without a sequence number; want 0 each",
			c.lost, c.unknown, c.early, c.prefilledSent, c.prefilledGone, c.reordered, r.unparsed)
	}
	if c.ahead > 0 || c.points == 0 {
		t.Errorf("%d events confirmed to the slot before Kafka had appended them, at %d sampled confirms; want 0, at some", c.ahead, c.points)
	}
	if l.mode == "exactly-once" && c.dups > c.backfilled {
		t.Errorf("%d duplicates in exactly-once mode, read read_committed; only the %d rows the operator's backfill re-sent may come twice", c.dups, c.backfilled)
	}
	if c.deletes == 0 || l.reads == 0 {
		t.Errorf("retention deleted nothing in %d reads of the tables: the run proves nothing of it", l.reads)
	}
}

// lifeCounts is what the checker counted.
type lifeCounts struct {
	committed, read, lost, unknown, dups, deletes, early, prefilled, prefilledSent, prefilledGone int
	reordered, repairReordered, gapReordered, backfilled, reads, ahead, points                    int
}

// report writes report-tablelife-<mode>.md.
func (l *life) report(t *testing.T, c lifeCounts) {
	var b strings.Builder
	fmt.Fprintf(&b, "# Table life, %s\n\n", l.mode)
	fmt.Fprintf(&b, "%s in %s: 4 writers at %d events/s into public.outbox (retention delete, after 2s) and public.outbox_p (10-second partitions, retention drop_partitions, after 8s), two replicas, %d table changes. Apache Kafka and Postgres on the same box.\n\n",
		time.Now().UTC().Format("2006-01-02"), l.length, l.rate, len(l.ops))
	fmt.Fprintf(&b, "| committed events | read | lost | unknown | duplicates | of which backfilled | rows retention deleted | deleted before in Kafka | attached rows kept | attached rows sent | reordered | reordered by a repair | reordered by a gap's backfill | loud stops | confirms sampled, ahead of Kafka |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	fmt.Fprintf(&b, "| %d | %d | %d | %d | %d | %d | %d | %d | %d of %d | %d | %d | %d | %d | %d | %d, %d |\n\n",
		c.committed, c.read, c.lost, c.unknown, c.dups, c.backfilled, c.deletes, c.early, c.prefilled-c.prefilledGone, c.prefilled, c.prefilledSent, c.reordered, c.repairReordered, c.gapReordered, len(l.stops), c.points, c.ahead)
	fmt.Fprintf(&b, "| at (s) | change | took (s) | |\n|---|---|---|---|\n")
	for _, f := range l.ops {
		fmt.Fprintf(&b, "| %.0f | %s | %.1f | %s |\n", f.At, f.Fault, f.Seconds, strings.ReplaceAll(f.Detail, "|", "/"))
	}
	if err := os.WriteFile(filepath.Join(l.out, "report-tablelife-"+l.mode+".md"), []byte(b.String()), 0o644); err != nil {
		t.Error(err)
	}
	t.Logf("\n%s", b.String())
}
