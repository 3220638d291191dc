package netchaos

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
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
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/testenv"
)

var (
	pg  *testenv.Postgres
	bin string // the cdc binary
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "netchaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "cdc")
	// Built in the connector's own module, with its own go.sum.
	build := exec.Command("go", "build", "-o", bin, "./cmd/cdc")
	build.Dir = "../.."
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "netchaos: build cdc:", err)
		os.Exit(1)
	}
	defer os.RemoveAll(dir)
	testenv.Main(m, &pg)
}

// faultFor is CDC_NET_FAULT: how long a black hole lasts, 60 s by default.
func faultFor(t *testing.T) time.Duration {
	if v := os.Getenv("CDC_NET_FAULT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("CDC_NET_FAULT: %v", err)
		}
		return d
	}
	return time.Minute
}

// net is one scenario's parts: a database, a broker, a proxy in front of
// each, and the connector reaching both through them.
type netEnv struct {
	db      string
	broker  *testenv.Broker
	kafka   *testenv.Kafka
	pgProxy *toxiproxy.Proxy
	kProxy  *toxiproxy.Proxy
	mode    string
	out     *testenv.Buffer
	cmd     *exec.Cmd
	http    string // the connector's endpoint
	payload int    // bytes of each event's payload (0: small)

	mu     sync.Mutex
	points []confirmPoint
}

// confirmPoint is what the slot said was confirmed and, read after it, how
// far each partition had been appended: every event committed before the
// confirmed position must be at an offset below.
type confirmPoint struct {
	confirmed pglogrepl.LSN
	ends      map[string]map[int32]int64
}

// sampleConfirms samples confirmPoints every half second until the test
// ends, straight from Postgres and the broker (not through the proxies).
func (n *netEnv) sampleConfirms(t *testing.T) {
	adm := kadm.NewClient(n.kafka.Client(t))
	stop := make(chan struct{})
	done := make(chan struct{})
	t.Cleanup(func() { close(stop); <-done })
	go func() {
		defer close(done)
		tick := time.NewTicker(500 * time.Millisecond) // the sampling rate
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			var lsn string
			conn, err := pgx.Connect(context.Background(), n.db)
			if err != nil {
				continue
			}
			err = conn.QueryRow(context.Background(), `SELECT coalesce(confirmed_flush_lsn, '0/0')::text FROM pg_replication_slots WHERE slot_name = 'outbox_cdc'`).Scan(&lsn)
			conn.Close(context.Background())
			if err != nil {
				continue
			}
			confirmed, _ := pglogrepl.ParseLSN(lsn)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			ends, err := adm.ListEndOffsets(ctx, n.kafka.Prefix+"outbox.event.order")
			cancel()
			if err != nil || ends.Error() != nil {
				continue
			}
			p := confirmPoint{confirmed: confirmed, ends: map[string]map[int32]int64{}}
			ends.Each(func(o kadm.ListedOffset) {
				if p.ends[o.Topic] == nil {
					p.ends[o.Topic] = map[int32]int64{}
				}
				p.ends[o.Topic][o.Partition] = o.Offset
			})
			n.mu.Lock()
			n.points = append(n.points, p)
			n.mu.Unlock()
		}
	}()
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func newNet(t *testing.T, mode string) *netEnv {
	t.Helper()
	p := testenv.Require(t, pg)
	n := &netEnv{db: p.NewDatabase(t), mode: mode, out: &testenv.Buffer{}}
	testenv.Exec(t, n.db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`)
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	kAddr := freeAddr(t)
	n.broker = testenv.StartBroker(t, "CDC_KAFKA_PROXIED="+kAddr)
	n.kafka = n.broker.Kafka()
	if n.broker.Proxied == "" {
		t.Fatal("the broker has no proxied listener: scripts/kafka.sh is older than CDC_KAFKA_PROXIED")
	}
	u, err := url.Parse(n.db)
	if err != nil {
		t.Fatal(err)
	}
	n.pgProxy = toxiproxy.NewProxy(srv, "postgres", freeAddr(t), u.Host)
	n.kProxy = toxiproxy.NewProxy(srv, "kafka", kAddr, n.broker.Proxied)
	for _, px := range []*toxiproxy.Proxy{n.pgProxy, n.kProxy} {
		if err := px.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(px.Stop)
	}
	return n
}

// config writes the connector's configuration: Postgres and Kafka through
// the proxies, the endpoint from CDC_HTTP_LISTEN, which launch sets.
func (n *netEnv) config(t *testing.T, extra string) string {
	t.Helper()
	u, _ := url.Parse(n.db)
	u.Host = n.pgProxy.Listen
	dir := t.TempDir()
	config, key := filepath.Join(dir, "cdc.yaml"), filepath.Join(dir, "signing.key")
	// Signed checkpoint records, as a deployment that runs cdc backfill has.
	if err := os.WriteFile(key, []byte(strings.Repeat("5e", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`
postgres: {url: %q, receive_timeout: 5s}
kafka: {brokers: [%s]}
tables: [{name: outbox, topic: %q}]
checkpoint: {topic: %s, signing_key_file: %q}
delivery: %s
log: {level: info}
%s
`, u.String(), n.kProxy.Listen, n.kafka.Prefix+"outbox.event.{aggregate_type}", n.kafka.CheckpointTopic(), key, n.mode, extra)
	if err := os.WriteFile(config, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return config
}

// proc is one cdc run process.
type proc struct {
	cmd    *exec.Cmd
	out    *testenv.Buffer
	http   string
	exited chan struct{}
}

// launch starts cdc run with config; the test's end stops it (thawing it
// first if it is frozen) and, if the test failed, prints its output.
func launch(t *testing.T, config string, out *testenv.Buffer) *proc {
	t.Helper()
	p := &proc{out: out, http: freeAddr(t), exited: make(chan struct{})}
	p.cmd = exec.Command(bin, "run", "--config", config)
	p.cmd.Env = append(os.Environ(), "CDC_HTTP_LISTEN="+p.http)
	p.cmd.Stdout, p.cmd.Stderr = out, out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() { p.stop() })
	return p
}

// stop ends the process: SIGTERM, and SIGKILL if it has not exited within
// a minute.
func (p *proc) stop() {
	p.cmd.Process.Signal(syscall.SIGCONT)
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(time.Minute):
		p.cmd.Process.Kill()
		<-p.exited
	}
}

// probe is the HTTP status the process's endpoint answers path with.
func (p *proc) probe(path string) int {
	cl := http.Client{Timeout: 2 * time.Second}
	resp, err := cl.Get("http://" + p.http + path)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// start runs one connector through the proxies and waits for it to stream.
func (n *netEnv) start(t *testing.T, extra string) {
	t.Helper()
	p := launch(t, n.config(t, extra), n.out)
	n.cmd, n.http = p.cmd, p.http
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("connector output:\n%s", n.out.String())
		}
	})
	testenv.Eventually(t, time.Minute, "the connector to stream", func() bool { return n.probe("/readyz") == http.StatusOK })
	n.sampleConfirms(t)
}

// probe is the HTTP status the connector's endpoint answers path with.
func (n *netEnv) probe(path string) int { return (&proc{http: n.http}).probe(path) }

// metric is the sum of a metric's samples on the connector's /metrics.
func (n *netEnv) metric(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + n.http + "/metrics")
	if err != nil {
		t.Fatalf("read /metrics: %v", err)
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	body.ReadFrom(resp.Body)
	sum := 0.0
	for _, l := range strings.Split(body.String(), "\n") {
		if rest, ok := strings.CutPrefix(l, name); ok && (strings.HasPrefix(rest, " ") || strings.HasPrefix(rest, "{")) {
			f := strings.Fields(rest[strings.LastIndex(rest, "}")+1:])
			if len(f) > 0 {
				v, _ := strconv.ParseFloat(f[0], 64)
				sum += v
			}
		}
	}
	return sum
}

// toxic adds a toxic to px, both ways, and returns what removes it.
func toxic(t *testing.T, px *toxiproxy.Proxy, kind string, attrs string) func() {
	t.Helper()
	var names []string
	for _, stream := range []string{"upstream", "downstream"} {
		name := kind + "_" + stream
		js := fmt.Sprintf(`{"name": %q, "type": %q, "stream": %q, "toxicity": 1, "attributes": %s}`, name, kind, stream, attrs)
		if _, err := px.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
			t.Fatalf("add toxic %s: %v", js, err)
		}
		names = append(names, name)
	}
	return func() {
		for _, name := range names {
			px.Toxics.RemoveToxic(context.Background(), name)
		}
	}
}

// writer commits events one transaction at a time, each a sequence
// number per aggregate, straight to Postgres (not through the proxy).
type writer struct {
	n     *netEnv
	stop  chan struct{}
	done  chan error
	mu    sync.Mutex
	ids   map[string]string // id -> aggregate/seq
	count atomic.Int64
}

func (n *netEnv) write(t *testing.T, rate int) *writer {
	t.Helper()
	w := &writer{n: n, stop: make(chan struct{}), done: make(chan error, 1), ids: map[string]string{}}
	go func() {
		conn, err := pgx.Connect(context.Background(), n.db)
		if err != nil {
			w.done <- err
			return
		}
		defer conn.Close(context.Background())
		tick := time.NewTicker(time.Second / time.Duration(rate)) // the load's pace, not a synchronisation
		defer tick.Stop()
		seq := map[int]int{}
		blob := strings.Repeat("x", n.payload)
		for i := 0; ; i++ {
			select {
			case <-w.stop:
				w.done <- nil
				return
			case <-tick.C:
			}
			agg := i % 10
			seq[agg]++
			var id string
			err := conn.QueryRow(context.Background(), `INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
				VALUES ('order', $1, 'E', jsonb_build_object('seq', $2::int, 'blob', $3::text)) RETURNING id::text`,
				fmt.Sprintf("a-%d", agg), seq[agg], blob).Scan(&id)
			if err != nil {
				w.done <- err
				return
			}
			w.mu.Lock()
			w.ids[id] = fmt.Sprintf("a-%d/%d", agg, seq[agg])
			w.mu.Unlock()
			w.count.Add(1)
		}
	}()
	return w
}

func (w *writer) finish(t *testing.T) map[string]string {
	t.Helper()
	close(w.stop)
	if err := <-w.done; err != nil {
		t.Fatalf("writer: %v", err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]string, len(w.ids))
	for k, v := range w.ids {
		out[k] = v
	}
	return out
}

// consumer reads the event topics straight from the broker (not through
// the proxy): read_committed in exactly-once mode.
func (n *netEnv) consumer(t *testing.T) *testenv.Consumer {
	if n.mode == "exactly-once" {
		return n.kafka.NewCommittedConsumer(t, n.kafka.AllTopics())
	}
	return n.kafka.NewConsumer(t, n.kafka.AllTopics())
}

// verify waits for every written event and checks none is lost, each
// aggregate's events come in order, and in exactly-once mode none twice.
func (n *netEnv) verify(t *testing.T, c *testenv.Consumer, written map[string]string) (dups int) {
	t.Helper()
	c.WaitFor(t, 3*time.Minute, fmt.Sprintf("all %d events", len(written)), func(recs []*kgo.Record) bool {
		got := map[string]bool{}
		for _, r := range recs {
			got[testenv.Header(r, route.HeaderID)] = true
		}
		for id := range written {
			if !got[id] {
				return false
			}
		}
		return true
	})
	c.Settle(t)
	seen := map[string]int{}
	last := map[string]int{}
	for _, r := range c.Records {
		id := testenv.Header(r, route.HeaderID)
		where, ok := written[id]
		if !ok {
			t.Errorf("a record of no row: %s", id)
			continue
		}
		if seen[id]++; seen[id] > 1 {
			dups++
			continue // a duplicate's place is not the event's
		}
		agg, s, _ := strings.Cut(where, "/")
		seq, _ := strconv.Atoi(s)
		if seq <= last[agg] {
			t.Errorf("aggregate %s: event %d after %d", agg, seq, last[agg])
		}
		last[agg] = seq
	}
	// Nothing confirmed before Kafka had appended it.
	type placed struct {
		commit pglogrepl.LSN
		offset int64
		topic  string
		part   int32
	}
	first := map[string]placed{}
	for _, r := range c.Records {
		id := testenv.Header(r, route.HeaderID)
		if _, ok := first[id]; !ok {
			lsn, _ := pglogrepl.ParseLSN(testenv.Header(r, route.HeaderCommitLSN))
			first[id] = placed{lsn, r.Offset, r.Topic, r.Partition}
		}
	}
	n.mu.Lock()
	points := n.points
	n.mu.Unlock()
	ahead := 0
	for _, p := range points {
		for id, pl := range first {
			if pl.commit < p.confirmed && pl.offset >= p.ends[pl.topic][pl.part] {
				if ahead++; ahead <= 3 {
					t.Errorf("event %s (commit %s) was confirmed (slot at %s) before Kafka had appended it", id, pl.commit, p.confirmed)
				}
			}
		}
	}
	if len(points) == 0 {
		t.Errorf("no confirm was sampled")
	}
	t.Logf("%d confirms sampled against the broker's end offsets: %d ahead of Kafka", len(points), ahead)
	if n.mode == "exactly-once" && dups > 0 {
		t.Errorf("%d events read twice read_committed in exactly-once mode", dups)
	}
	return dups
}

// TestNetworkLatency: 2 ms and 20 ms each way on the broker link, in both
// delivery modes: every event arrives once (at least once: no fault here
// to re-send for), in order per aggregate.
func TestNetworkLatency(t *testing.T) {
	for _, mode := range []string{"at-least-once", "exactly-once"} {
		for _, ms := range []int{2, 20} {
			t.Run(fmt.Sprintf("%s/%dms", mode, ms), func(t *testing.T) {
				n := newNet(t, mode)
				remove := toxic(t, n.kProxy, "latency", fmt.Sprintf(`{"latency": %d}`, ms))
				defer remove()
				n.start(t, "")
				c := n.consumer(t)
				w := n.write(t, 200)
				time.Sleep(10 * time.Second) // the load's length
				written := w.finish(t)
				if dups := n.verify(t, c, written); dups != 0 {
					t.Errorf("%d duplicates without a fault", dups)
				}
				t.Logf("%s, %d ms each way to the broker: %d events", mode, ms, len(written))
			})
		}
	}
}

// blackHole drops every packet on px, both ways, without a reset, for
// CDC_NET_FAULT while a writer commits, then heals it. /healthz answers
// 200 throughout (busy or waiting is not stuck), and the connector
// streams again by itself: the events written after the heal arrive
// within the bound docs/operations.md gives.
func blackHole(t *testing.T, n *netEnv, px func(*netEnv) *toxiproxy.Proxy, bound time.Duration) (notReady bool) {
	fault := faultFor(t)
	n.start(t, "")
	c := n.consumer(t)
	w := n.write(t, 50)
	c.WaitFor(t, time.Minute, "events before the fault", func(recs []*kgo.Record) bool { return len(recs) >= 50 })
	heal := toxic(t, px(n), "timeout", `{"timeout": 0}`)
	cut := time.Now()
	deadline := cut.Add(fault)
	for time.Now().Before(deadline) {
		if code := n.probe("/healthz"); code != http.StatusOK {
			heal()
			t.Fatalf("/healthz answered %d during the black hole: waiting is not stuck", code)
		}
		if n.probe("/readyz") != http.StatusOK {
			notReady = true
		}
		time.Sleep(time.Second) // the interval between looks
	}
	// The fault bites: no event committed well into it has arrived.
	c.Settle(t)
	for _, r := range c.Records {
		if r.Timestamp.After(cut.Add(5 * time.Second)) {
			heal()
			t.Fatalf("an event committed %s into the black hole arrived during it: the connector does not go through the proxy", r.Timestamp.Sub(cut).Round(time.Millisecond))
		}
	}
	heal()
	healed := time.Now()
	// A record's timestamp is its transaction's commit time: one after
	// the heal is an event written after it. Any record read, not the
	// last: the partitions are read in no order among them, so an event
	// written during the black hole may be read after a newer one.
	testenv.Eventually(t, bound, "an event written after the heal to arrive", func() bool {
		c.Settle(t)
		return slices.ContainsFunc(c.Records, func(r *kgo.Record) bool { return r.Timestamp.After(healed) })
	})
	recovered := time.Since(healed)
	written := w.finish(t)
	dups := n.verify(t, c, written)
	if code := n.probe("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz answered %d after the heal", code)
	}
	t.Logf("%s: a %s black hole: streaming again %s after the heal; %d events, %d sent twice; /readyz 503 during it: %v", n.mode, fault, recovered.Round(100*time.Millisecond), len(written), dups, notReady)
	return notReady
}

// TestNetworkBlackHoleKafka: the broker link drops every packet for
// CDC_NET_FAULT.
func TestNetworkBlackHoleKafka(t *testing.T) {
	for _, mode := range []string{"at-least-once", "exactly-once"} {
		t.Run(mode, func(t *testing.T) {
			blackHole(t, newNet(t, mode), func(n *netEnv) *toxiproxy.Proxy { return n.kProxy }, 90*time.Second)
		})
	}
}

// TestNetworkBlackHolePostgres: the Postgres link drops every packet for
// CDC_NET_FAULT while the connector streams: postgres.receive_timeout
// finds the connection dead, connects time out, and after the heal the
// connector takes its slot back (its old walsender, silent, is ended).
func TestNetworkBlackHolePostgres(t *testing.T) {
	for _, mode := range []string{"at-least-once", "exactly-once"} {
		t.Run(mode, func(t *testing.T) {
			n := newNet(t, mode)
			notReady := blackHole(t, n, func(n *netEnv) *toxiproxy.Proxy { return n.pgProxy }, 2*time.Minute)
			// The proxy holds what it does not pass, and would deliver it
			// after the heal: without postgres.receive_timeout (5s here)
			// the old session could live on. It must not have had to, and
			// /readyz said so meanwhile.
			if faultFor(t) > 10*time.Second {
				if !strings.Contains(n.out.String(), "taken for dead") {
					t.Errorf("no session was taken for dead during the black hole")
				}
				if !notReady {
					t.Errorf("/readyz answered 200 throughout a black hole on the Postgres link: it is not streaming")
				}
			}
		})
	}
}

// TestNetworkResets: for CDC_NET_FAULT, every 2 s one of the links is cut:
// connections reset (reset_peer) or closed part-way through what they
// carry (limit_data), on Postgres' link and the broker's in turn. Nothing
// is lost or reordered.
func TestNetworkResets(t *testing.T) {
	for _, mode := range []string{"at-least-once", "exactly-once"} {
		t.Run(mode, func(t *testing.T) {
			n := newNet(t, mode)
			n.start(t, "")
			c := n.consumer(t)
			w := n.write(t, 100)
			deadline := time.Now().Add(faultFor(t))
			faults := 0
			for i := 0; time.Now().Before(deadline); i++ {
				px := []*toxiproxy.Proxy{n.kProxy, n.pgProxy}[i%2]
				var remove func()
				if i%4 < 2 {
					remove = toxic(t, px, "reset_peer", `{"timeout": 0}`)
				} else {
					remove = toxic(t, px, "limit_data", `{"bytes": 20000}`)
				}
				time.Sleep(300 * time.Millisecond) // how long the cut lasts: the fault
				remove()
				faults++
				time.Sleep(2 * time.Second) // between cuts: the fault's rhythm
			}
			written := w.finish(t)
			dups := n.verify(t, c, written)
			// The cuts bite: Postgres' ones end sessions.
			restarts := n.metric(t, "cdc_restarts_total")
			if restarts == 0 {
				t.Errorf("cdc_restarts_total is 0 after %d cuts: the faults did not reach the connector", faults)
			}
			t.Logf("%s: %d cuts, %.0f new sessions, %d events, %d sent twice", mode, faults, restarts, len(written), dups)
		})
	}
}

// TestNetworkSlowBroker: the broker link carries 1 MB/s while 250 KB
// payloads are written at about that rate and more: the connector's
// memory stays bounded (peak RSS under 128 MB: what waits for Kafka is
// max_in_flight_bytes) and every event arrives.
func TestNetworkSlowBroker(t *testing.T) {
	n := newNet(t, "at-least-once")
	n.payload = 250_000
	remove := toxic(t, n.kProxy, "bandwidth", `{"rate": 1024}`) // KB/s
	defer remove()
	n.start(t, "")
	c := n.consumer(t)
	w := n.write(t, 6)
	time.Sleep(faultFor(t)) // the load's length
	written := w.finish(t)
	remove()
	n.verify(t, c, written)
	rss := peakRSS(t, n.cmd.Process.Pid)
	t.Logf("%d events of 250 KB through 1 MB/s: peak RSS %.1f MB", len(written), rss)
	if rss > 128 {
		t.Errorf("peak RSS %.1f MB; want at most 128 MB", rss)
	}
}

func peakRSS(t *testing.T, pid int) float64 { return testenv.PeakRSS(t, pid) }
