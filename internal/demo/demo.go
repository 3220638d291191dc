package demo

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/mattn/go-isatty"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/delivery"
	"github.com/outboxcdc/cdc/internal/localpg"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/replay"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/sink"
)

const demoSchema = `
CREATE SCHEMA cdc_demo;
CREATE TABLE cdc_demo.orders (
  id text PRIMARY KEY, customer text NOT NULL, status text NOT NULL, total numeric(10,2) NOT NULL
);
CREATE TABLE cdc_demo.outbox (
  id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  aggregatetype text NOT NULL,
  aggregateid text NOT NULL,
  type text NOT NULL,
  payload jsonb
);`

// demoCleanup removes what an earlier demo left behind in the user's
// database; the demo's names never collide with a real deployment's.
const demoCleanup = `
SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name IN ('cdc_demo', 'cdc_demo_replay') AND NOT active;
DROP PUBLICATION IF EXISTS cdc_demo;
DROP SCHEMA IF EXISTS cdc_demo CASCADE;`

// Run runs the demo for duration, rate business transactions a second,
// and returns the process's exit code. getenv reads CDC_DEMO_POSTGRES_URL
// and CDC_DEMO_KAFKA_BROKERS.
func Run(ctx context.Context, duration time.Duration, rate int, getenv func(string) string, out, errOut io.Writer) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(errOut, "demo: "+format+"\n", a...)
		return 1
	}

	pg, err := demoPostgres(getenv, out)
	if err != nil {
		return fail("%v", err)
	}
	defer pg.stop()
	conn, err := pgx.Connect(ctx, pg.addr)
	if err != nil {
		return fail("connect to postgres: %v", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, demoCleanup); err != nil {
		return fail("clean up an earlier demo: %v", err)
	}
	if _, err := conn.Exec(ctx, demoSchema); err != nil {
		return fail("create the demo tables: %v", err)
	}
	defer conn.Exec(context.Background(), demoCleanup)

	kafka, err := demoKafka(getenv)
	if err != nil {
		return fail("%v", err)
	}
	defer kafka.stop()

	cfg := demoConfig(pg.addr, strings.Split(kafka.addr, ","))
	if err := forgetDemoCheckpoint(ctx, conn, cfg); err != nil {
		return fail("%v", err)
	}
	board := &board{}
	connector, err := startDemoConnector(ctx, cfg, board)
	if err != nil {
		return fail("%v", err)
	}
	defer connector.stop()
	if connector == nil { // Ctrl-C before it streamed
		return 0
	}

	fmt.Fprintf(out, "postgres: %s\nkafka:    %s\nconnector: slot cdc_demo streams cdc_demo.outbox -> topics outbox.event.<aggregatetype>\n\n", pg.where, kafka.where)
	fmt.Fprintf(out, "an order service writes orders and their events in the same transactions for %s (Ctrl-C to stop early)\n\n", duration)

	// The order service has its own connection: cancelling it
	// mid-transaction closes that connection, and conn is still needed for
	// the summary and the clean-up.
	svcConn, err := pgx.Connect(ctx, pg.addr)
	if err != nil {
		return fail("connect to postgres: %v", err)
	}
	defer svcConn.Close(context.Background())
	wctx, stopWriting := context.WithTimeout(ctx, duration)
	defer stopWriting()
	svc := make(chan error, 1)
	since := time.Now()
	go func() { svc <- newOrderService(svcConn, board).run(wctx, rate) }()

	runErr := showUntilDone(ctx, newDisplay(out), board, svc, connector.done)
	if runErr == nil && ctx.Err() == nil {
		runErr = replayDemo(ctx, cfg, since, out)
	}
	if err := connector.stop(); err != nil && runErr == nil {
		runErr = err
	}

	var confirmed *pglogrepl.LSN
	conn.QueryRow(context.Background(), `SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'cdc_demo'`).Scan(&confirmed)
	board.summary(out, confirmed)
	if runErr != nil {
		fmt.Fprintf(errOut, "\ndemo: %v\n%s", runErr, connector.logs())
		return 1
	}
	fmt.Fprintln(out, "cleaned up: the demo schema, slot and publication are dropped; the throwaway Postgres and the embedded broker are stopped.")
	return 0
}

// demoServer is a server the demo uses, and how to take it down.
type demoServer struct {
	addr  string // a Postgres URL, or comma-separated brokers
	where string // what it is, for the banner
	stop  func()
}

// demoPostgres starts a throwaway Postgres, or uses CDC_DEMO_POSTGRES_URL.
func demoPostgres(getenv func(string) string, out io.Writer) (demoServer, error) {
	if url := getenv("CDC_DEMO_POSTGRES_URL"); url != "" {
		return demoServer{addr: url, where: "your Postgres (CDC_DEMO_POSTGRES_URL)", stop: func() {}}, nil
	}
	fmt.Fprintln(out, "starting a throwaway PostgreSQL (wal_level=logical) ...")
	// synchronous_commit on: the walsender only sends flushed WAL, so with
	// it off every commit would wait for the WAL writer (200 ms) and the
	// latency shown would be Postgres', not the connector's.
	// A password of its own on TCP: trust there would let any local user
	// in as the superuser while the demo runs.
	pw := make([]byte, 16)
	if _, err := crand.Read(pw); err != nil {
		return demoServer{}, err
	}
	srv, err := localpg.StartWith(localpg.Options{Settings: []string{"synchronous_commit=on"}, Password: hex.EncodeToString(pw)})
	if err != nil {
		if _, ferr := localpg.FindBinaries(); ferr != nil {
			return demoServer{}, errors.New("PostgreSQL server binaries not found: install postgresql (apt-get install postgresql, or run make setup) or set CDC_DEMO_POSTGRES_URL to a server with wal_level=logical")
		}
		return demoServer{}, fmt.Errorf("could not start PostgreSQL: %v", err)
	}
	return demoServer{addr: srv.URL, where: "a throwaway PostgreSQL in " + srv.Bin, stop: srv.Stop}, nil
}

// demoKafka starts an embedded Kafka-protocol broker, or uses
// CDC_DEMO_KAFKA_BROKERS.
func demoKafka(getenv func(string) string) (demoServer, error) {
	if b := getenv("CDC_DEMO_KAFKA_BROKERS"); b != "" {
		return demoServer{addr: b, where: "your Kafka (CDC_DEMO_KAFKA_BROKERS)", stop: func() {}}, nil
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(3))
	if err != nil {
		return demoServer{}, fmt.Errorf("start the embedded Kafka broker: %v", err)
	}
	addrs := strings.Join(c.ListenAddrs(), ",")
	return demoServer{addr: addrs, where: "an embedded Kafka-protocol broker (kfake) at " + addrs, stop: c.Close}, nil
}

// demoConnector is the connector, built exactly as cdc run builds it, with
// its warnings kept for the end.
type demoConnector struct {
	done   chan error // Run's result; read once by stop or the display
	cancel context.CancelFunc
	mu     sync.Mutex
	log    strings.Builder
	err    error
	ended  bool
}

// demoConfig is the connector's config: cdc_demo.outbox with Debezium's
// layout, and a replay window.
func demoConfig(pgURL string, brokers []string) config.Config {
	return config.Config{
		Postgres:   postgres.Config{URL: pgURL, Slot: "cdc_demo", Publication: "cdc_demo", StatusInterval: 250 * time.Millisecond},
		Kafka:      sink.Config{Brokers: brokers},
		Tables:     []*outbox.Source{{Name: outbox.TableName{Schema: "cdc_demo", Name: "outbox"}, Columns: outbox.DefaultColumns}},
		Checkpoint: config.CheckpointConfig{Topic: "cdc-demo.checkpoints"},
		Replay:     config.ReplayConfig{Window: time.Hour},
	}
}

// forgetDemoCheckpoint deletes what an earlier demo left in the checkpoint
// topic: the demo dropped its slot when it ended, and the connector would
// rightly refuse that gap.
func forgetDemoCheckpoint(ctx context.Context, conn *pgx.Conn, cfg config.Config) error {
	var sysid string
	if err := conn.QueryRow(ctx, `SELECT system_identifier::text FROM pg_control_system()`).Scan(&sysid); err != nil {
		return fmt.Errorf("read the system identifier: %v", err)
	}
	store, err := checkpoint.OpenStore(ctx, cfg.Checkpoint.Topic, sink.ClientOpts(cfg.Kafka, hclog.NewNullLogger()), hclog.NewNullLogger())
	if err != nil {
		return err
	}
	store.SignWith(cfg.Checkpoint.SigningKeys)
	return store.Delete(ctx, checkpoint.Key(cfg.Postgres.Slot, sysid))
}

// replayDemo replays what the order service wrote since, to the .replay
// topics, while the connector keeps streaming: cdc replay --from-time.
func replayDemo(ctx context.Context, cfg config.Config, since time.Time, out io.Writer) error {
	p, err := pipeline.New(cfg, hclog.NewNullLogger(), pipeline.Options{})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nreplay: re-sending every event committed since %s to outbox.event.<aggregatetype>.replay, from the replay window, while the connector streams on ...\n",
		since.Format("15:04:05.000"))
	sum, err := p.Replay(ctx, replay.Request{Range: replay.Range{FromTime: since}, TopicSuffix: ".replay"}, nil)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	fmt.Fprintf(out, "replayed %d events in %d transactions (commit LSN %s to %s) in %s; the same as cdc replay --from-time %s --topic-suffix .replay\n",
		sum.Events, sum.Transactions, sum.FirstCommit, sum.LastCommit, sum.Elapsed.Round(time.Millisecond), since.UTC().Format(time.RFC3339Nano))
	return nil
}

// startDemoConnector runs the connector in the background and waits until
// it streams. It returns nil, nil if ctx ends first.
func startDemoConnector(ctx context.Context, cfg config.Config, b *board) (*demoConnector, error) {
	c := &demoConnector{done: make(chan error, 1)}
	streaming := make(chan struct{})
	var once sync.Once
	p, err := pipeline.New(cfg, hclog.New(&hclog.LoggerOptions{Name: "cdc", Level: hclog.Warn, Output: lockedWriter{&c.mu, &c.log}}), pipeline.Options{
		OnSession:   func(*delivery.Tracker) { once.Do(func() { close(streaming) }) },
		OnDelivered: b.delivered,
	})
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() { c.done <- p.Run(pctx) }()
	select {
	case <-streaming:
		return c, nil
	case err := <-c.done:
		cancel()
		return nil, fmt.Errorf("the connector stopped: %v", err)
	case <-ctx.Done():
		cancel()
		<-c.done
		return nil, nil
	}
}

// stop shuts the connector down once and returns its error.
func (c *demoConnector) stop() error {
	if c == nil {
		return nil
	}
	c.cancel()
	if !c.ended {
		c.err, c.ended = <-c.done, true
	}
	return c.err
}

func (c *demoConnector) logs() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.log.String()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// showUntilDone redraws the display until the order service ends (or the
// connector fails), then gives Kafka up to ten seconds to acknowledge what
// was written. It returns the first real error.
func showUntilDone(ctx context.Context, d *display, b *board, svc <-chan error, connector chan error) error {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
writing:
	for {
		select {
		case <-tick.C:
			d.draw(b)
		case err := <-svc:
			if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("order service: %w", err)
			}
			break writing
		case err := <-connector:
			connector <- err // for demoConnector.stop
			return fmt.Errorf("the connector stopped: %v", err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for b.pending() > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		<-tick.C
		d.draw(b)
	}
	d.draw(b)
	return nil
}

// orderService creates orders for a few customers and moves them through
// created -> paid -> shipped, each step one transaction that changes the
// order row and inserts its outbox event. It is the code a newcomer copies
// first, so it writes the way an application should: query parameters,
// the business change and the event in one transaction.
type orderService struct {
	conn   *pgx.Conn
	board  *board
	rng    *rand.Rand
	status map[string]string // order id -> created, paid
	open   []string          // orders not shipped yet
	next   int
}

func newOrderService(conn *pgx.Conn, b *board) *orderService {
	return &orderService{conn: conn, board: b, rng: rand.New(rand.NewSource(time.Now().UnixNano())), status: map[string]string{}, next: 1}
}

// run writes rate transactions a second until ctx ends.
func (o *orderService) run(ctx context.Context, rate int) error {
	t := time.NewTicker(time.Second / time.Duration(max(rate, 1)))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		// A transaction, once begun, runs to its end: cancelled during
		// its COMMIT, it could commit on the server yet not be counted
		// (the demo's test saw 99 written and 100 delivered).
		if err := pgx.BeginFunc(context.WithoutCancel(ctx), o.conn, o.step); err != nil {
			return err
		}
		o.board.written()
	}
}

// step is one business transaction: create an order, or move one on.
func (o *orderService) step(tx pgx.Tx) error {
	ctx := context.Background()
	customers := []string{"alice", "bob", "carol", "dave", "erin"}
	var id, typ string
	var payload map[string]any
	if len(o.open) < 6 || o.rng.Intn(3) == 0 {
		id = fmt.Sprintf("ord-%04d", o.next)
		o.next++
		cust := customers[o.rng.Intn(len(customers))]
		total := float64(o.rng.Intn(20000)) / 100
		if _, err := tx.Exec(ctx, `INSERT INTO cdc_demo.orders (id, customer, status, total) VALUES ($1, $2, 'created', $3)`, id, cust, total); err != nil {
			return err
		}
		typ, payload = "OrderCreated", map[string]any{"order": id, "customer": cust, "total": total}
		o.status[id] = "created"
		o.open = append(o.open, id)
	} else {
		i := o.rng.Intn(len(o.open))
		id = o.open[i]
		if o.status[id] == "created" {
			typ, o.status[id] = "OrderPaid", "paid"
		} else {
			typ = "OrderShipped"
			delete(o.status, id)
			o.open = append(o.open[:i], o.open[i+1:]...)
		}
		status := strings.ToLower(strings.TrimPrefix(typ, "Order"))
		if _, err := tx.Exec(ctx, `UPDATE cdc_demo.orders SET status = $1 WHERE id = $2`, status, id); err != nil {
			return err
		}
		payload = map[string]any{"order": id, "status": status}
	}
	_, err := tx.Exec(ctx, `INSERT INTO cdc_demo.outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', $1, $2, $3)`, id, typ, payload)
	return err
}

// board collects what the display shows. delivered runs on franz-go's
// promise goroutine, so it only appends under a mutex.
type board struct {
	mu        sync.Mutex
	nWritten  int
	nAcked    int
	nFailed   int
	latencies []time.Duration
	recent    []row
}

type row struct {
	topic     string
	partition int32
	offset    int64
	key, typ  string
	latency   time.Duration
}

func (b *board) written() {
	b.mu.Lock()
	b.nWritten++
	b.mu.Unlock()
}

func (b *board) pending() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.nWritten - b.nAcked
}

func (b *board) delivered(rec *kgo.Record, err error) {
	lat := time.Since(rec.Timestamp) // the record's timestamp is the commit time
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		b.nFailed++
		return
	}
	b.nAcked++
	b.latencies = append(b.latencies, lat)
	typ := ""
	for _, h := range rec.Headers {
		if h.Key == route.HeaderEventType {
			typ = string(h.Value)
		}
	}
	b.recent = append(b.recent, row{rec.Topic, rec.Partition, rec.Offset, string(rec.Key), typ, lat})
	if len(b.recent) > 8 {
		b.recent = b.recent[len(b.recent)-8:]
	}
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(float64(len(sorted))*p))]
}

func (b *board) summary(out io.Writer, confirmed *pglogrepl.LSN) {
	b.mu.Lock()
	defer b.mu.Unlock()
	lat := append([]time.Duration(nil), b.latencies...)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	slot := "unknown"
	if confirmed != nil {
		slot = confirmed.String()
	}
	fmt.Fprintf(out, "\nsummary\n  events written:     %d\n  events delivered:   %d (acknowledged by Kafka)\n", b.nWritten, b.nAcked)
	if b.nFailed > 0 {
		fmt.Fprintf(out, "  produce failures:   %d\n", b.nFailed)
	}
	fmt.Fprintf(out, "  commit -> ack:      p50 %s, p99 %s\n  slot confirmed at:  %s\n\n",
		percentile(lat, 0.50).Round(100*time.Microsecond), percentile(lat, 0.99).Round(100*time.Microsecond), slot)
}

// display redraws a compact table in a terminal, or prints a progress line
// every two seconds when the output is not a terminal.
type display struct {
	out   io.Writer
	tty   bool
	lines int
	last  time.Time
}

func newDisplay(out io.Writer) *display {
	f, ok := out.(*os.File)
	return &display{out: out, tty: ok && isatty.IsTerminal(f.Fd())}
}

func (d *display) draw(b *board) {
	b.mu.Lock()
	written, acked, recent := b.nWritten, b.nAcked, append([]row(nil), b.recent...)
	b.mu.Unlock()
	if !d.tty {
		if time.Since(d.last) >= 2*time.Second {
			fmt.Fprintf(d.out, "written %d, delivered %d, in flight %d\n", written, acked, written-acked)
			d.last = time.Now()
		}
		return
	}
	var s strings.Builder
	if d.lines > 0 {
		fmt.Fprintf(&s, "\x1b[%dA\x1b[J", d.lines) // back to the top of the table, clear below
	}
	fmt.Fprintf(&s, "written %-6d delivered %-6d in flight %d\n", written, acked, written-acked)
	fmt.Fprintf(&s, "%-20s %4s %7s  %-9s %-13s %9s\n", "TOPIC", "PART", "OFFSET", "KEY", "EVENT", "COMMIT→ACK")
	for _, r := range recent {
		fmt.Fprintf(&s, "%-20s %4d %7d  %-9s %-13s %9s\n", r.topic, r.partition, r.offset, r.key, r.typ, r.latency.Round(100*time.Microsecond))
	}
	d.lines = 2 + len(recent)
	io.WriteString(d.out, s.String())
}
