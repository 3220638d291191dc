package pipeline_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outboxcdc/cdc/internal/testenv"
	"github.com/outboxcdc/cdc/internal/testenv/testregistry"
)

// The benchmarks in this file measure what a user sees: the built cdc
// binary, run as its own process with the default settings, timed up to
// Postgres's confirm of the last event, next to pg_recvlogical reading an
// identical slot in the same run (docs/benchmarks.md).
//
//	make bench                        (real broker, 3 paired runs)
//	CDC_BENCH_EVENTS=20000 go test -run '^$' -bench 'Drain|Latency' -benchtime 1x ./internal/pipeline
//
// CDC_BENCH_OUT names a file each run appends its figures to, as JSON
// lines, for scripts/benchplot.

// fillTxProcedure writes n outbox rows, committing every per rows.
const fillTxProcedure = `CREATE PROCEDURE fill_tx(n int, per int) LANGUAGE plpgsql AS $$
	BEGIN
	  FOR i IN 1..n LOOP
	    INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
	    VALUES ('order', 'agg-' || (i % 1000), 'OrderCreated', jsonb_build_object('i', i, 'pad', repeat('x', 200)));
	    IF i % per = 0 THEN COMMIT; END IF;
	  END LOOP;
	END $$`

// fillPayloadProcedure writes n outbox rows in 1-row transactions, each
// with a payload of size bytes of hexadecimal digits from random(), a
// window of one random string at a different offset in each row: as
// incompressible as a real payload can be to TOAST's pglz (which finds no
// repeats inside the value) and to the producer's snappy (whose window is
// shorter than the distance to the row before), where a run of one letter
// would shrink to nothing in the WAL and on the broker.
const fillPayloadProcedure = `CREATE PROCEDURE fill_payload(n int, size int) LANGUAGE plpgsql AS $$
	DECLARE
	  pad text;
	BEGIN
	  SELECT string_agg(md5(random()::text), '') INTO pad FROM generate_series(1, 2 * size / 32 + 1);
	  FOR i IN 1..n LOOP
	    INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
	    VALUES ('order', 'agg-' || (i % 1000), 'OrderCreated',
	            jsonb_build_object('i', i, 'pad', substr(pad, 1 + (i * 7919) % size, size - 20)));
	    COMMIT;
	  END LOOP;
	END $$`

func benchEvents() int {
	if v := os.Getenv("CDC_BENCH_EVENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err == nil && n > 0 {
			return n
		}
	}
	return 100_000
}

// benchResult is one run's figures, as written to CDC_BENCH_OUT.
type benchResult struct {
	Bench  string `json:"bench"`
	Broker string `json:"broker"`
	Events int    `json:"events"`
	TxSize int    `json:"tx_size,omitempty"`
	// PayloadBytes: the size of each payload, where it is not 200 bytes.
	PayloadBytes int       `json:"payload_bytes,omitempty"`
	Rate         float64   `json:"rate,omitempty"`    // events/s offered (latency)
	Seconds      float64   `json:"seconds,omitempty"` // connector, start to confirm
	RefSecs      float64   `json:"ref_seconds,omitempty"`
	Ratio        float64   `json:"ratio,omitempty"` // connector speed / pg_recvlogical speed
	CPU          float64   `json:"cpu_seconds,omitempty"`
	RSSMB        float64   `json:"peak_rss_mb,omitempty"`
	Latency      []float64 `json:"latency_ms,omitempty"` // the CDF: 1001 quantiles
	PerRequest   float64   `json:"events_per_request,omitempty"`
	AckP50       float64   `json:"ack_p50_ms,omitempty"` // commit → Kafka's ack, bucket bounds
	AckP99       float64   `json:"ack_p99_ms,omitempty"`
	Reached      float64   `json:"reached,omitempty"` // events/s the writer reached
	// FloorP50 and FloorP99: commit → received for pg_recvlogical alone,
	// the same writer at the same rate, in the same run (latencyFloor).
	FloorP50 float64 `json:"floor_p50_ms,omitempty"`
	FloorP99 float64 `json:"floor_p99_ms,omitempty"`
	// CPUPercent: each process's CPU while the writer wrote, in percent
	// of one core (sweep).
	CPUPercent map[string]float64 `json:"cpu_percent,omitempty"`
	// CPUSeconds: the other processes' CPU in a drain (drained).
	CPUSeconds map[string]float64 `json:"other_cpu_seconds,omitempty"`
	// Stages: start-up, ms from the process's start to each stage.
	Stages map[string]float64 `json:"stages_ms,omitempty"`
	// Delivery and NetMS: the network runs' delivery mode, and the
	// latency each way a proxy added between the connector and the broker.
	Delivery string  `json:"delivery,omitempty"`
	NetMS    float64 `json:"net_latency_ms,omitempty"`
}

func (r benchResult) save(b *testing.B) {
	out := os.Getenv("CDC_BENCH_OUT")
	if out == "" {
		return
	}
	f, err := os.OpenFile(out, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := json.NewEncoder(f).Encode(r); err != nil {
		b.Fatal(err)
	}
}

func brokerName() string {
	if testenv.External() {
		return "Apache Kafka"
	}
	return "kfake"
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// connectorBinary builds cmd/cdc once per test process, as make build does.
func connectorBinary(b *testing.B) string {
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "cdc-bench-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "cdc")
		out, err := exec.Command("go", "build", "-trimpath", "-o", binPath, "github.com/outboxcdc/cdc/cmd/cdc").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		b.Fatal(binErr)
	}
	return binPath
}

// connector is the cdc binary running on db's outbox_cdc slot.
type connector struct {
	cmd   *exec.Cmd
	start time.Time
	out   strings.Builder
	http  string // its metrics endpoint
	// peakAnon and peakFile are the largest RssAnon and RssFile
	// sampleRSS saw, in MB.
	peakAnon, peakFile float64

	exited  chan struct{} // closed when the process has ended
	waitErr error         // how it ended, once exited is closed
}

// metric reads one unlabelled counter or gauge from the connector's
// /metrics, or sums a labelled one.
func (c *connector) metric(b *testing.B, name string) float64 {
	b.Helper()
	resp, err := http.Get("http://" + c.http + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	sum := 0.0
	for _, l := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(l, name+" ") || strings.HasPrefix(l, name+"{") {
			f := strings.Fields(l)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum += v
		}
	}
	return sum
}

// ready reports whether the connector's /readyz answers 200: it streams
// (the moment cdc_streaming turns 1). A poll of /readyz costs the
// connector next to nothing, where one of /metrics at the backfill's
// sample period (gathering every family, compressing it, reading /proc
// for the process collector) took a quarter of its CPU on two cores.
func (c *connector) ready(b *testing.B) bool {
	b.Helper()
	resp, err := http.Get("http://" + c.http + "/readyz")
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// histogramQuantile reads quantile q of a histogram from the connector's
// /metrics, as the upper bound of the bucket it falls in (in seconds).
func (c *connector) histogramQuantile(b *testing.B, name string, q float64) float64 {
	b.Helper()
	resp, err := http.Get("http://" + c.http + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	type bucket struct{ le, n float64 }
	var bs []bucket
	// name_bucket{le="0.005",pipeline="outbox_cdc"} 12: every series
	// carries the pipeline label, in whichever order.
	line := regexp.MustCompile(`^` + regexp.QuoteMeta(name) + `_bucket\{(?:.*,)?le="([^"]+)"[^}]*\} (\S+)$`)
	for _, l := range strings.Split(string(body), "\n") {
		m := line.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		le, count := m[1], m[2]
		bound, err := strconv.ParseFloat(le, 64)
		if err != nil { // +Inf
			bound = math.Inf(1)
		}
		n, _ := strconv.ParseFloat(count, 64)
		bs = append(bs, bucket{bound, n})
	}
	if len(bs) == 0 {
		b.Fatalf("no histogram %s in /metrics", name)
	}
	total := bs[len(bs)-1].n
	for _, bk := range bs {
		if bk.n >= q*total {
			return bk.le
		}
	}
	return math.Inf(1)
}

// freeAddr is a free local TCP address.
func freeAddr(b *testing.B) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func startConnector(b *testing.B, db string, kafka *testenv.Kafka) *connector {
	return startConnectorWith(b, db, kafka, "", "")
}

// startConnectorWith starts it with more settings for the outbox table,
// and top-level ones.
func startConnectorWith(b *testing.B, db string, kafka *testenv.Kafka, table, top string) *connector {
	return startConnectorOpts(b, db, kafka, settings{table: table, top: top})
}

// settings are what a benchmark adds to the default configuration: lines
// of the outbox table's entry, of the kafka section, and top-level ones.
type settings struct {
	table, kafka, top string
	// signing gives the checkpoint a signing key (on_invalid: park needs
	// one).
	signing bool
}

// connectorBrokers is where the connector finds the broker: the test's
// broker, or CDC_BENCH_CONNECTOR_BROKERS, a proxy in front of it (make
// bench-network) that only the connector goes through.
func connectorBrokers(kafka *testenv.Kafka) string {
	if v := os.Getenv("CDC_BENCH_CONNECTOR_BROKERS"); v != "" {
		return v
	}
	return strings.Join(kafka.Brokers, ", ")
}

func startConnectorOpts(b *testing.B, db string, kafka *testenv.Kafka, set settings) *connector {
	b.Helper()
	table, top := set.table, set.top
	cfg := fmt.Sprintf(`postgres:
  url: %q
kafka:
  brokers: [%s]
%s
tables:
  - name: public.outbox
    topic: %q
%s
checkpoint:
  topic: %s
`, db, connectorBrokers(kafka), set.kafka, kafka.Prefix+"outbox.event.{aggregate_type}", table, kafka.CheckpointTopic())
	if set.signing {
		key := filepath.Join(b.TempDir(), "signing.key")
		if err := os.WriteFile(key, []byte(strings.Repeat("5a", 32)+"\n"), 0o600); err != nil {
			b.Fatal(err)
		}
		cfg += "  signing_key_file: " + key + "\n"
	}
	if !strings.Contains(top, "log:") {
		cfg += "log:\n  level: warn\n"
	}
	if d := os.Getenv("CDC_BENCH_BATCH_DELAY"); d != "" { // for comparisons
		cfg = strings.Replace(cfg, "kafka:\n", "kafka:\n  max_batch_delay: "+d+"\n", 1)
	}
	cfg += top
	cfg += os.Getenv("CDC_BENCH_YAML") // top-level settings to compare, such as max_in_flight
	file := filepath.Join(b.TempDir(), "cdc.yaml")
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		b.Fatal(err)
	}
	c := &connector{cmd: exec.Command(connectorBinary(b), "run", "--config", file), http: freeAddr(b)}
	c.cmd.Env = append(os.Environ(), "CDC_HTTP_LISTEN="+c.http)
	// The connector's own environment, to compare (GOMAXPROCS=2, say).
	c.cmd.Env = append(c.cmd.Env, strings.Fields(os.Getenv("CDC_BENCH_CONNECTOR_ENV"))...)
	c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.out
	c.start = time.Now()
	if err := c.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	c.exited = make(chan struct{})
	go func() { c.waitErr = c.cmd.Wait(); close(c.exited) }()
	return c
}

// stop ends the process with SIGTERM and returns its CPU time and peak RSS.
// The peak is the process's own VmHWM, read just before the signal: the
// rusage of a child counts its parent's RSS too, because Go starts
// children with vfork, and the exec inherits the parent's high-water mark.
func (c *connector) stop(b *testing.B) (cpu time.Duration, rssMB float64) {
	b.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.cmd.Process.Pid))
	if err != nil {
		b.Fatalf("read the connector's peak RSS: %v", err)
	}
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			rssMB = kb / 1024
		}
	}
	if rssMB == 0 {
		b.Fatalf("no VmHWM in /proc/%d/status", c.cmd.Process.Pid)
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	<-c.exited
	if c.waitErr != nil {
		b.Fatalf("connector: %v\n%s", c.waitErr, c.out.String())
	}
	ru := c.cmd.ProcessState.SysUsage().(*syscall.Rusage)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), rssMB
}

// sampleRSS keeps the largest RssAnon and RssFile seen: the peak's split
// between the mapped files' pages (the binary's, and about 1.2 MB of
// libc's and the loader's) and the rest (VmHWM is only their sum), as
// seen at waitConfirmed's sample period.
func (c *connector) sampleRSS() {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.cmd.Process.Pid))
	if err != nil {
		return
	}
	for _, l := range strings.Split(string(status), "\n") {
		k, v, _ := strings.Cut(l, ":")
		kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		switch k {
		case "RssAnon":
			c.peakAnon = max(c.peakAnon, kb/1024)
		case "RssFile":
			c.peakFile = max(c.peakFile, kb/1024)
		}
	}
}

// waitConfirmed polls the slot until Postgres has been told a position past
// after, and returns when it saw it.
func (c *connector) waitConfirmed(b *testing.B, conn *pgx.Conn, after pglogrepl.LSN) time.Time {
	b.Helper()
	deadline := time.Now().Add(10 * time.Minute)
	for {
		var s string
		if err := conn.QueryRow(context.Background(), `SELECT coalesce(confirmed_flush_lsn, '0/0')::text FROM pg_replication_slots WHERE slot_name = 'outbox_cdc'`).Scan(&s); err != nil {
			b.Fatal(err)
		}
		if l, _ := pglogrepl.ParseLSN(s); l > after {
			return time.Now()
		}
		c.sampleRSS()
		select {
		case <-c.exited:
			b.Fatalf("the connector ended (%v) before it confirmed past %s\n%s", c.waitErr, after, c.out.String())
		case <-time.After(2 * time.Millisecond): // polling Postgres: the sample period
		}
		if time.Now().After(deadline) {
			b.Fatalf("the connector did not confirm past %s\n%s", after, c.out.String())
		}
	}
}

// BenchmarkDrain drains a backlog written in 1-row and in 1000-row
// transactions: the cdc binary from process start to Postgres's confirm of
// the last event, against pg_recvlogical (no decoding into events, no
// Kafka) reading identical slots, before and after it, to the same end.
func BenchmarkDrain(b *testing.B) {
	for _, per := range []int{1, 1000} {
		b.Run(fmt.Sprintf("tx=%d", per), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				drainOnce(b, per)
			}
		})
	}
}

func drainOnce(b *testing.B, per int) {
	events := benchEvents()
	d := drain(b, per, "")
	ratio := d.ref.Seconds() / d.elapsed.Seconds()
	b.ReportMetric(float64(events)/d.elapsed.Seconds(), "events/s")
	b.ReportMetric(ratio, "ratio")
	b.ReportMetric(d.cpu.Seconds()*100_000/float64(events), "cpu_s/100k")
	b.ReportMetric(d.rss, "peak_rss_MB")
	b.ReportMetric(d.anon, "peak_anon_MB")
	b.ReportMetric(d.file, "peak_file_MB")
	fmt.Printf("\ndrain %d events in %d-row transactions (%s):\n", events, per, brokerName())
	fmt.Printf("  cdc, start to confirm: %7.3f s  %8.0f events/s  cpu %.2f s  peak RSS %.1f MB (sampled: anon %.1f, the binary's pages %.1f)\n", d.elapsed.Seconds(), float64(events)/d.elapsed.Seconds(), d.cpu.Seconds(), d.rss, d.anon, d.file)
	fmt.Printf("  pg_recvlogical:        %7.3f s  (before %.3f, after %.3f)\n", d.ref.Seconds(), d.refBefore.Seconds(), d.refAfter.Seconds())
	fmt.Printf("  ratio:                 %7.2f  (cdc speed / pg_recvlogical speed)\n", ratio)
	fmt.Printf("  CPU (s): walsender %.2f for cdc, %.2f for pg_recvlogical; broker %.2f while cdc ran\n\n", d.walsender, d.refWalsender, d.broker)
	benchResult{Bench: "drain", CPUSeconds: d.cpuSeconds(), Broker: brokerName(), Events: events, TxSize: per, Seconds: d.elapsed.Seconds(),
		RefSecs: d.ref.Seconds(), Ratio: ratio, CPU: d.cpu.Seconds(), RSSMB: d.rss}.save(b)
}

// BenchmarkIdle starts the cdc binary, its slot, checkpoint and topic
// made by an earlier run, and reads its RSS once it has streamed one event
// and Postgres has the confirm, with nothing more to do: the connector's
// fixed cost as a user sees it, the binary's pages (RssFile) apart from
// the rest (RssAnon). docs/benchmarks.md, "Memory (issue 56)".
func BenchmarkIdle(b *testing.B) {
	p := testenv.Require(b, pg)
	db := p.NewDatabase(b)
	kafka := testenv.NewKafka(b)
	conn := testenv.Connect(b, db)
	warmUpWith(b, db, kafka, conn, settings{})
	for i := 0; i < b.N; i++ {
		c := startConnector(b, db, kafka)
		testenv.Exec(b, db, "CALL fill_tx(1, 1)")
		c.waitConfirmed(b, conn, testenv.CurrentWAL(b, db)-1)
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.cmd.Process.Pid))
		if err != nil {
			b.Fatal(err)
		}
		c.stop(b)
		for _, l := range strings.Split(string(status), "\n") {
			k, v, _ := strings.Cut(l, ":")
			if k == "VmRSS" || k == "RssFile" || k == "RssAnon" {
				kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
				b.ReportMetric(kb/1024, strings.ToLower(k)+"_MB")
			}
		}
	}
}

// BenchmarkPayload drains backlogs of large payloads, in 1-row
// transactions: 20,000 of 10 KB, 10,000 of 100 KB and 1,000 of 1 MB (scaled
// by CDC_BENCH_EVENTS/100,000), against pg_recvlogical on the same
// backlog, with the default max_in_flight_bytes. The topic and the
// connector allow 2 MB records.
func BenchmarkPayload(b *testing.B) {
	scale := float64(benchEvents()) / 100_000
	for _, c := range []struct {
		name         string
		size, events int
	}{
		{"10KB", 10_000, 20_000},
		{"100KB", 100_000, 10_000},
		{"1MB", 1_000_000, 1_000},
	} {
		b.Run("size="+c.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				payloadOnce(b, c.size, max(10, int(float64(c.events)*scale)))
			}
		})
	}
}

// bigRecords lets the connector and the topics it creates take records of
// up to 2 MB (the broker's own limit is 1 MB).
const bigRecords = `  max_message_bytes: 2000000
  topic_defaults:
    configs: {max.message.bytes: "2000000"}`

func payloadOnce(b *testing.B, size, events int) {
	d := drainBacklog(b, backlog{events: events, size: size, set: settings{kafka: bigRecords}})
	ratio := d.ref.Seconds() / d.elapsed.Seconds()
	mbs := float64(events) * float64(size) / d.elapsed.Seconds() / 1e6
	b.ReportMetric(mbs, "MB/s")
	b.ReportMetric(ratio, "ratio")
	b.ReportMetric(d.rss, "peak_rss_MB")
	fmt.Printf("\ndrain %d events of %d-byte payloads in 1-row transactions (%s):\n", events, size, brokerName())
	fmt.Printf("  cdc, start to confirm: %7.3f s  %7.1f MB/s  %7.0f events/s  cpu %.2f s  peak RSS %.1f MB\n", d.elapsed.Seconds(), mbs, float64(events)/d.elapsed.Seconds(), d.cpu.Seconds(), d.rss)
	fmt.Printf("  pg_recvlogical:        %7.3f s  (before %.3f, after %.3f)\n", d.ref.Seconds(), d.refBefore.Seconds(), d.refAfter.Seconds())
	fmt.Printf("  ratio:                 %7.2f  (cdc speed / pg_recvlogical speed)\n", ratio)
	fmt.Printf("  CPU (s): walsender %.2f for cdc, %.2f for pg_recvlogical; broker %.2f while cdc ran\n\n", d.walsender, d.refWalsender, d.broker)
	benchResult{Bench: "payload", CPUSeconds: d.cpuSeconds(), Broker: brokerName(), Events: events, TxSize: 1, PayloadBytes: size, Seconds: d.elapsed.Seconds(),
		RefSecs: d.ref.Seconds(), Ratio: ratio, CPU: d.cpu.Seconds(), RSSMB: d.rss}.save(b)
}

// drained is one drain's figures.
type drained struct {
	elapsed, cpu, ref, refBefore, refAfter time.Duration
	rss                                    float64
	// The largest RssAnon and RssFile sampled while it drained, in MB:
	// the peak's split, the binary's pages apart from the rest.
	anon, file float64
	// The CPU of the walsenders feeding the connector and the first
	// pg_recvlogical, and the broker's while the connector ran, in
	// seconds (0 when unknown).
	walsender, refWalsender, broker float64
}

func (d drained) cpuSeconds() map[string]float64 {
	m := map[string]float64{"walsender": d.walsender, "ref_walsender": d.refWalsender}
	if d.broker > 0 {
		m["broker"] = d.broker
	}
	return m
}

// slotCPU follows the walsender that streams slot, once one does, and
// returns a function that stops following it and gives its CPU time in
// seconds: the walsender starts with its connection, so its total is its
// work for that reader.
func slotCPU(db, slot string) (stop func() float64) {
	done, out := make(chan struct{}), make(chan float64, 1)
	go func() {
		conn, err := pgx.Connect(context.Background(), db)
		if err != nil {
			out <- 0
			return
		}
		defer conn.Close(context.Background())
		pid, last := 0, int64(0)
		for t := time.NewTicker(10 * time.Millisecond); ; <-t.C {
			select {
			case <-done:
				out <- float64(last) / 100
				return
			default:
			}
			if pid == 0 {
				_ = conn.QueryRow(context.Background(), `SELECT coalesce(active_pid, 0) FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&pid)
				continue
			}
			if n := cpuTicks(pid); n > last {
				last = n
			}
		}
	}()
	return func() float64 { close(done); return <-out }
}

// drain runs one drain of a backlog in per-row transactions, the connector
// with top-level settings top, timed between pg_recvlogical runs on
// identical slots.
func drain(b *testing.B, per int, top string) drained {
	return drainBacklog(b, backlog{events: benchEvents(), per: per, set: settings{top: top}})
}

// backlog is what a drain reads: events rows in per-row transactions,
// with 200-byte payloads or, with size set, 1-row transactions of size
// bytes each; set is the connector's settings.
type backlog struct {
	events, per, size int
	set               settings
	// pre is SQL run before the backlog is written, after the warm-up:
	// rows the drain starts with.
	pre string
}

func (bl backlog) fill(b *testing.B, db string, n int) {
	if bl.size > 0 {
		// In calls of at most 100 MB, each within a statement's time.
		for chunk := max(1, 100_000_000/bl.size); n > 0; n -= chunk {
			testenv.Exec(b, db, fmt.Sprintf("CALL fill_payload(%d, %d)", min(n, chunk), bl.size))
		}
		return
	}
	testenv.Exec(b, db, fmt.Sprintf("CALL fill_tx(%d, %d)", n, bl.per))
}

func drainBacklog(b *testing.B, bl backlog) drained {
	if bl.size > 0 {
		bl.per = 1
	}
	p := testenv.Require(b, pg)
	recvlogical := filepath.Join(p.Bin, "pg_recvlogical")
	db := p.NewDatabase(b)
	kafka := testenv.NewKafka(b)
	conn := testenv.Connect(b, db)
	warmUpWith(b, db, kafka, conn, bl.set)
	// The connector has run before and stopped; the reference slots start
	// where it did.
	testenv.Exec(b, db,
		`SELECT pg_create_logical_replication_slot('ref_before', 'pgoutput')`,
		`SELECT pg_create_logical_replication_slot('ref_after', 'pgoutput')`)
	if bl.pre != "" {
		testenv.Exec(b, db, bl.pre)
	}
	bl.fill(b, db, bl.events-bl.per)
	beforeLast := testenv.CurrentWAL(b, db)
	bl.fill(b, db, bl.per)
	end := testenv.CurrentWAL(b, db)
	// The test server commits asynchronously, and a walsender sends only
	// flushed WAL: wait for the flush, or the first reader would be timed
	// waiting for it (up to wal_writer_delay).
	testenv.Eventually(b, time.Minute, "the backlog to be flushed", func() bool {
		var flushed bool
		testenv.QueryRow(b, db, `SELECT pg_current_wal_flush_lsn() >= $1::pg_lsn`, []any{end.String()}, &flushed)
		return flushed
	})

	b.ResetTimer()
	var d drained
	refWalsender := slotCPU(db, "ref_before")
	d.refBefore = recvlogicalTime(b, recvlogical, db, "ref_before", end)
	d.refWalsender = refWalsender()
	walsender, broker := slotCPU(db, "outbox_cdc"), cpuTicks(brokerPID())
	c := startConnectorOpts(b, db, kafka, bl.set)
	done := c.waitConfirmed(b, conn, beforeLast)
	d.elapsed = done.Sub(c.start)
	if broker >= 0 && brokerPID() > 0 {
		d.broker = float64(cpuTicks(brokerPID())-broker) / 100
	}
	d.walsender = walsender()
	d.refAfter = recvlogicalTime(b, recvlogical, db, "ref_after", end)
	b.StopTimer()
	d.cpu, d.rss = c.stop(b)
	d.anon, d.file = c.peakAnon, c.peakFile
	d.ref = (d.refBefore + d.refAfter) / 2
	// Slot names are the cluster's: free them for the next drain, once
	// the walsenders of the processes that exited have noticed.
	testenv.Eventually(b, time.Minute, "the drain's slots released", func() bool {
		var active int
		testenv.QueryRow(b, db, `SELECT count(*) FROM pg_replication_slots WHERE database = current_database() AND active`, nil, &active)
		return active == 0
	})
	testenv.Exec(b, db, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database()`)
	return d
}

// BenchmarkExactlyOnce drains the same 1-row-transaction backlog with
// delivery: at-least-once and exactly-once, one after the other in one run,
// and reports exactly-once's speed as a share of at-least-once's (issue 11:
// at least 0.8). Each is also timed against pg_recvlogical.
func BenchmarkExactlyOnce(b *testing.B) {
	for i := 0; i < b.N; i++ {
		events := benchEvents()
		alo := drain(b, 1, "")
		eos := drain(b, 1, "delivery: exactly-once\n")
		share := alo.elapsed.Seconds() / eos.elapsed.Seconds()
		b.ReportMetric(share, "eos/alo")
		fmt.Printf("\ndrain %d events in 1-row transactions (%s), by delivery:\n", events, brokerName())
		fmt.Printf("  at-least-once: %7.3f s  %8.0f events/s  (pg_recvlogical %.3f s)\n", alo.elapsed.Seconds(), float64(events)/alo.elapsed.Seconds(), alo.ref.Seconds())
		fmt.Printf("  exactly-once:  %7.3f s  %8.0f events/s  (pg_recvlogical %.3f s)  cpu %.2f s  peak RSS %.1f MB\n", eos.elapsed.Seconds(), float64(events)/eos.elapsed.Seconds(), eos.ref.Seconds(), eos.cpu.Seconds(), eos.rss)
		fmt.Printf("  exactly-once / at-least-once speed: %.2f\n\n", share)
		benchResult{Bench: "exactly-once", Broker: brokerName(), Events: events, TxSize: 1, Seconds: eos.elapsed.Seconds(),
			RefSecs: alo.elapsed.Seconds(), Ratio: share, CPU: eos.cpu.Seconds(), RSSMB: eos.rss}.save(b)
	}
}

// BenchmarkSchema drains the same 1-row-transaction backlog twice in one
// run: the payloads as written (schema: json), and encoded as Avro against
// a registry (schema: avro, subject by event type, so that one registered
// schema serves every drain's topic). It reports Avro's speed as a share
// of JSON's (issue 28: at least 0.9), and the CPU each took.
func BenchmarkSchema(b *testing.B) {
	reg := testregistry.NewFake(b)
	const avsc = `{"type":"record","name":"OrderCreated","fields":[{"name":"i","type":"long"},{"name":"pad","type":"string"}]}`
	if _, _, err := reg.RegisterSchema("OrderCreated", sr.Schema{Schema: avsc, Type: sr.TypeAvro}); err != nil {
		b.Fatal(err)
	}
	avro := settings{table: "    schema: {format: avro, subject: record}\n", top: "schema_registry:\n  url: " + reg.URL + "\n"}
	for i := 0; i < b.N; i++ {
		events := benchEvents()
		plain := drain(b, 1, "")
		enc := drainBacklog(b, backlog{events: events, per: 1, set: avro})
		share := plain.elapsed.Seconds() / enc.elapsed.Seconds()
		b.ReportMetric(share, "avro/json")
		fmt.Printf("\ndrain %d events in 1-row transactions (%s), by schema:\n", events, brokerName())
		fmt.Printf("  json: %7.3f s  %8.0f events/s  cpu %.2f s  (pg_recvlogical %.3f s)\n", plain.elapsed.Seconds(), float64(events)/plain.elapsed.Seconds(), plain.cpu.Seconds(), plain.ref.Seconds())
		fmt.Printf("  avro: %7.3f s  %8.0f events/s  cpu %.2f s  (pg_recvlogical %.3f s)  peak RSS %.1f MB\n", enc.elapsed.Seconds(), float64(events)/enc.elapsed.Seconds(), enc.cpu.Seconds(), enc.ref.Seconds(), enc.rss)
		fmt.Printf("  avro / json speed: %.2f\n\n", share)
		benchResult{Bench: "schema-avro", Broker: brokerName(), Events: events, TxSize: 1, Seconds: enc.elapsed.Seconds(),
			RefSecs: plain.elapsed.Seconds(), Ratio: share, CPU: enc.cpu.Seconds(), RSSMB: enc.rss,
			CPUSeconds: map[string]float64{"json": plain.cpu.Seconds()}}.save(b)
	}
}

// BenchmarkBackfill is a first start on a table that holds a backlog of
// rows (1,000,000 by default, CDC_BENCH_BACKFILL_ROWS): the cdc binary from
// process start until it streams, which it does once Kafka acknowledged
// every backfilled row and the checkpoint says so. The reference is psql
// copying the same rows, ordered by the primary key (its index serves
// that order; the connector's, the commits', is a sort), to /dev/null:
// what reading them out of Postgres costs. tx=all writes the backlog in one transaction,
// as the figures of docs/benchmarks.md before issue 56 did: the worst
// case of a read in commit order, whose rows of one commit are sorted
// again by command and place (tableread); tx=100 writes it in
// transactions of 100 rows, as an application's events come.
func BenchmarkBackfill(b *testing.B) {
	for _, per := range []int{0, 100} {
		name := "tx=all"
		if per > 0 {
			name = fmt.Sprintf("tx=%d", per)
		}
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				backfillOnce(b, per)
			}
		})
	}
}

// txName says in what transactions a backfill's backlog was written.
func txName(per int) string {
	if per == 0 {
		return "written in one transaction"
	}
	return fmt.Sprintf("written in %d-row transactions", per)
}

// backfillOnce is one backfill of a backlog written in per-row
// transactions (0: one).
func backfillOnce(b *testing.B, per int) {
	rows := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("CDC_BENCH_BACKFILL_ROWS")); err == nil && v > 0 {
		rows = v
	}
	p := testenv.Require(b, pg)
	db := p.NewDatabase(b)
	kafka := testenv.NewKafka(b)
	insert := `INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
		SELECT 'order', 'agg-' || (i %% 1000), 'OrderCreated', jsonb_build_object('i', i, 'pad', repeat('x', 200))
		FROM generate_series(%s, %s) i`
	fill := []string{schema, fmt.Sprintf(insert, "1", strconv.Itoa(rows))}
	if per > 0 {
		// A procedure's COMMIT needs a CALL of its own, outside any
		// transaction block.
		fill = []string{schema, fmt.Sprintf(`CREATE PROCEDURE fill_backfill() LANGUAGE plpgsql AS $$
			BEGIN
				FOR j IN 0..%d BY %d LOOP
					`+insert+`;
					COMMIT;
				END LOOP;
			END $$`, rows-1, per, "j + 1", fmt.Sprintf("least(j + %d, %d)", per, rows)), "CALL fill_backfill()"}
	}
	testenv.Exec(b, db, append(fill, "VACUUM ANALYZE outbox")...)

	server := serverCPU(b, db)
	b.ResetTimer()
	refStart := time.Now()
	psql := exec.Command(filepath.Join(p.Bin, "psql"), "-X", "-q", "-d", db, "-c",
		`\copy (SELECT id, aggregatetype, aggregateid, type, payload FROM outbox ORDER BY id) TO '/dev/null'`)
	out, err := psql.CombinedOutput()
	if err != nil {
		b.Fatalf("psql: %v\n%s", err, out)
	}
	ref := time.Since(refStart)
	refServer := server()
	psqlCPU := (psql.ProcessState.UserTime() + psql.ProcessState.SystemTime()).Seconds()
	server, broker := serverCPU(b, db), cpuTicks(brokerPID())
	c := startConnectorWith(b, db, kafka, "    backfill: {}", "")
	deadline := time.Now().Add(20 * time.Minute)
	// The endpoint comes up once the config is read.
	testenv.Eventually(b, time.Minute, "the connector's endpoint", func() bool {
		resp, err := http.Get("http://" + c.http + "/metrics")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	for !c.ready(b) {
		select {
		case <-c.exited:
			b.Fatalf("the connector ended (%v) before it streamed\n%s", c.waitErr, c.out.String())
		case <-time.After(5 * time.Millisecond): // polling its endpoint: the sample period
		}
		if time.Now().After(deadline) {
			b.Fatalf("the connector did not finish the backfill\n%s", c.out.String())
		}
	}
	elapsed := time.Since(c.start)
	b.StopTimer()
	// Where the CPU went: the box has two cores for the connector (or
	// psql), Postgres and the broker (docs/benchmarks.md, "Backfill").
	others := map[string]float64{"ref_postgres": refServer, "psql": psqlCPU}
	if broker >= 0 && brokerPID() > 0 {
		others["broker"] = float64(cpuTicks(brokerPID())-broker) / 100
	}
	sent := c.metric(b, "cdc_backfill_rows_total")
	cpu, rss := c.stop(b)
	others["postgres"] = server() // once the connector's backends ended
	if int(sent) != rows {
		b.Fatalf("the backfill sent %.0f rows, want %d", sent, rows)
	}
	ratio := ref.Seconds() / elapsed.Seconds()
	b.ReportMetric(float64(rows)/elapsed.Seconds(), "rows/s")
	b.ReportMetric(ratio, "ratio")
	b.ReportMetric(rss, "peak_rss_MB")
	fmt.Printf("\nbackfill %d rows on the first start, %s (%s):\n", rows, txName(per), brokerName())
	fmt.Printf("  cdc, start to streaming: %7.3f s  %8.0f rows/s  cpu %.2f s  peak RSS %.1f MB\n", elapsed.Seconds(), float64(rows)/elapsed.Seconds(), cpu.Seconds(), rss)
	fmt.Printf("  psql \\copy to /dev/null: %7.3f s\n", ref.Seconds())
	fmt.Printf("  ratio:                   %7.2f  (cdc speed / psql's)\n", ratio)
	fmt.Printf("  CPU (s): postgres %.2f and broker %.2f for cdc; postgres %.2f and psql %.2f for psql\n\n",
		others["postgres"], others["broker"], others["ref_postgres"], others["psql"])
	benchResult{Bench: "backfill", Broker: brokerName(), Events: rows, TxSize: per, Seconds: elapsed.Seconds(),
		RefSecs: ref.Seconds(), Ratio: ratio, CPU: cpu.Seconds(), RSSMB: rss, CPUSeconds: others}.save(b)
}

// warmUp prepares db for a benchmark as a deployment would be: the outbox
// table and publication, and a connector that has run (its slot,
// checkpoint and topic exist) and stopped.
func warmUp(b *testing.B, db string, kafka *testenv.Kafka, conn *pgx.Conn) {
	warmUpWith(b, db, kafka, conn, settings{})
}

// warmUpWith is warmUp with the connector's settings, which create the
// topic (its max.message.bytes, for one).
func warmUpWith(b *testing.B, db string, kafka *testenv.Kafka, conn *pgx.Conn, set settings) {
	b.Helper()
	testenv.Exec(b, db, schema,
		`CREATE PUBLICATION outbox_cdc FOR TABLE outbox WITH (publish = 'insert')`,
		`SELECT pg_create_logical_replication_slot('outbox_cdc', 'pgoutput')`,
		fillTxProcedure, fillPayloadProcedure, "CALL fill_tx(1, 1)")
	last := testenv.CurrentWAL(b, db)
	c := startConnectorOpts(b, db, kafka, set)
	c.waitConfirmed(b, conn, last-1)
	c.stop(b)
}

// recvlogicalTime is how long pg_recvlogical takes from its start to
// reaching end on slot.
func recvlogicalTime(b *testing.B, bin, db, slot string, end pglogrepl.LSN) time.Duration {
	b.Helper()
	start := time.Now()
	out, err := exec.Command(bin, "-d", db, "--slot", slot, "--start", "--no-loop",
		"-o", "proto_version=1", "-o", "publication_names=outbox_cdc",
		"-E", end.String(), "-f", "/dev/null").CombinedOutput()
	if err != nil {
		b.Fatalf("pg_recvlogical: %v\n%s", err, out)
	}
	return time.Since(start)
}

// BenchmarkLatency writes 1-row transactions at a steady rate while the cdc
// binary streams them, and measures commit → visible: when a consumer
// receives each record, minus its timestamp (the transaction's commit time).
// The first second is warm-up and not counted.
func BenchmarkLatency(b *testing.B) {
	seconds := 10
	if v := os.Getenv("CDC_BENCH_SECONDS"); v != "" {
		seconds, _ = strconv.Atoi(v)
	}
	for _, rate := range []int{1000, 5000} {
		b.Run(fmt.Sprintf("rate=%d", rate), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				latencyOnce(b, rate, 1, time.Duration(seconds)*time.Second)
			}
		})
	}
}

// BenchmarkSweep is BenchmarkLatency at rising rates, written as 10-row
// transactions (one writer cannot commit 10k transactions a second next to
// everything else on a small box): 5k, 10k, 20k, 40k and 80k events/s, or
// those of CDC_BENCH_RATES. Each rate reports the latency percentiles, the
// rate the writer reached, and the CPU of the connector, the walsender
// feeding it, the writer's backend and the broker (docs/benchmarks.md,
// "Rate sweep").
func BenchmarkSweep(b *testing.B) {
	seconds := 10
	if v := os.Getenv("CDC_BENCH_SECONDS"); v != "" {
		seconds, _ = strconv.Atoi(v)
	}
	rates := []int{5000, 10_000, 20_000, 40_000, 80_000}
	if v := os.Getenv("CDC_BENCH_RATES"); v != "" {
		rates = nil
		for _, f := range strings.Split(v, ",") {
			r, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || r <= 0 {
				b.Fatalf("CDC_BENCH_RATES=%q: want rates in events/s, comma-separated", v)
			}
			rates = append(rates, r)
		}
	}
	for _, rate := range rates {
		b.Run(fmt.Sprintf("rate=%d", rate), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				latencyOnce(b, rate, 10, time.Duration(seconds)*time.Second)
			}
		})
	}
}

// cpuTicks is a process's user and system CPU time from /proc, in clock
// ticks (USER_HZ, 100 a second on Linux), or -1 when it cannot be read.
func cpuTicks(pid int) int64 {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	// The command name, in parentheses, may hold spaces: count fields
	// after its closing parenthesis. utime and stime are fields 14, 15.
	i := strings.LastIndexByte(string(stat), ')')
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 13 {
		return -1
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return u + s
}

// serverCPU starts counting the CPU of the local Postgres server that
// serves db, all its processes, and returns a function that stops and
// gives it in seconds: the postmaster's own and its reaped children's
// (cutime, cstime), plus its live children's.
func serverCPU(b *testing.B, db string) (stop func() float64) {
	b.Helper()
	var backend int
	testenv.QueryRow(b, db, `SELECT pg_backend_pid()`, nil, &backend)
	postmaster := procStat(backend, 1)
	if postmaster <= 0 {
		return func() float64 { return 0 } // not a local server
	}
	total := func() (int64, int) {
		pm := int(postmaster)
		t := procStat(pm, 11) + procStat(pm, 12) + procStat(pm, 13) + procStat(pm, 14)
		entries, _ := os.ReadDir("/proc")
		n := 0
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || procStat(pid, 1) != postmaster {
				continue
			}
			n++
			t += procStat(pid, 11) + procStat(pid, 12)
		}
		return t, n
	}
	start, children := total()
	return func() float64 {
		// A backend that ended is counted once the postmaster has reaped
		// it: wait until no more children run than at the start, or an
		// autovacuum worker may keep one more.
		t, n := total()
		for deadline := time.Now().Add(2 * time.Second); n > children && time.Now().Before(deadline); t, n = total() {
			time.Sleep(10 * time.Millisecond) // polling /proc: the sample period
		}
		return float64(t-start) / 100
	}
}

// procStat is field i of /proc/pid/stat counted after the command name (0
// is the state, 1 the parent, 11 and 12 utime and stime, 13 and 14 the
// reaped children's), or -1.
func procStat(pid, i int) int64 {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	j := strings.LastIndexByte(string(stat), ')')
	f := strings.Fields(string(stat[j+1:]))
	if len(f) <= i {
		return -1
	}
	v, err := strconv.ParseInt(f[i], 10, 64)
	if err != nil {
		return -1
	}
	return v
}

// cpuMeter samples processes' CPU over a span of time.
type cpuMeter struct {
	pids  map[string]int
	ticks map[string]int64
	at    time.Time
}

func newCPUMeter(pids map[string]int) *cpuMeter {
	m := &cpuMeter{pids: pids, ticks: map[string]int64{}, at: time.Now()}
	for name, pid := range pids {
		m.ticks[name] = cpuTicks(pid)
	}
	return m
}

// percent is each process's CPU since newCPUMeter, in percent of one core.
func (m *cpuMeter) percent() map[string]float64 {
	wall := time.Since(m.at).Seconds()
	out := map[string]float64{}
	for name, pid := range m.pids {
		now := cpuTicks(pid)
		if now < 0 || m.ticks[name] < 0 {
			continue
		}
		out[name] = float64(now-m.ticks[name]) / 100 / wall * 100
	}
	return out
}

// brokerPID is the real broker's process, when make bench started it
// (CDC_TEST_KAFKA_DIR), or 0.
func brokerPID() int {
	dir := os.Getenv("CDC_TEST_KAFKA_DIR")
	if dir == "" {
		return 0
	}
	b, err := os.ReadFile(filepath.Join(dir, "pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

func latencyOnce(b *testing.B, rate, per int, d time.Duration) {
	latencyWith(b, rate, per, d, "")
}

// latencyWith is latencyOnce with top-level settings: in exactly-once
// mode the consumer reads read_committed, as its users' do.
func latencyWith(b *testing.B, rate, per int, d time.Duration, top string) benchResult {
	p := testenv.Require(b, pg)
	db := p.NewDatabase(b)
	kafka := testenv.NewKafka(b)
	conn := testenv.Connect(b, db)
	warmUpWith(b, db, kafka, conn, settings{top: top})
	c := startConnectorOpts(b, db, kafka, settings{top: top})
	testenv.Eventually(b, time.Minute, "the connector to stream", func() bool {
		var active bool
		testenv.QueryRow(b, db, `SELECT active FROM pg_replication_slots WHERE slot_name = 'outbox_cdc'`, nil, &active)
		return active
	})

	opts := []kgo.Opt{kgo.SeedBrokers(kafka.Brokers...),
		kgo.ConsumeTopics(kafka.Prefix + "outbox.event.order"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.MetadataMinAge(50 * time.Millisecond), kgo.FetchMaxWait(time.Second)}
	if strings.Contains(top, "exactly-once") {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()

	// The writer: every 10ms, the rows due by then, one transaction each.
	// The test server runs with synchronous_commit=off, which holds WAL
	// back from the walsender for up to wal_writer_delay (200ms); an
	// application's commits are normally synchronous.
	if _, err := conn.Exec(context.Background(), "SET synchronous_commit = on"); err != nil {
		b.Fatal(err)
	}
	total := rate * int(d/time.Second)
	total -= total % per
	var writer, walsender int
	testenv.QueryRow(b, db, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'outbox_cdc'`, nil, &walsender)
	if err := conn.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&writer); err != nil {
		b.Fatal(err)
	}
	pids := map[string]int{"connector": c.cmd.Process.Pid, "walsender": walsender, "writer": writer}
	if pid := brokerPID(); pid > 0 {
		pids["broker"] = pid
	}
	start := time.Now()
	warmEnd := start.Add(time.Second)
	var cpu *cpuMeter // from the end of the warm-up to the last write
	var wrote time.Duration
	writeDone := steadyWriter(conn, rate, per, total, start, func() { cpu = newCPUMeter(pids) }, &wrote)

	var lat []float64
	seen := -1 // the warm-up event comes first
	deadline := time.Now().Add(d + 2*time.Minute)
	for seen < total && time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		fs := cl.PollFetches(ctx)
		cancel()
		now := time.Now()
		fs.EachRecord(func(r *kgo.Record) {
			seen++
			if r.Timestamp.After(warmEnd) {
				lat = append(lat, float64(now.Sub(r.Timestamp).Microseconds())/1000)
			}
		})
	}
	if err := <-writeDone; err != nil {
		b.Fatal(err)
	}
	var cpuPct map[string]float64
	if cpu != nil {
		cpuPct = cpu.percent() // the consumer has seen the last event
	}
	reached := float64(total) / wrote.Seconds()
	perRequest := c.metric(b, "cdc_events_total") / c.metric(b, "cdc_kafka_produce_requests_total")
	// The connector's own share: commit → Kafka's ack, by its histogram.
	ackP50, ackP99 := c.histogramQuantile(b, "cdc_commit_to_ack_seconds", 0.5)*1000, c.histogramQuantile(b, "cdc_commit_to_ack_seconds", 0.99)*1000
	cpuTime, rss := c.stop(b)
	if seen < total {
		b.Fatalf("consumed %d of %d events", seen, total)
	}
	slices.Sort(lat)
	q := func(f float64) float64 { return lat[min(len(lat)-1, int(f*float64(len(lat))))] }
	var floor []float64
	if top == "" {
		floor = latencyFloor(b, p, db, conn, rate, per, d)
	}
	b.ReportMetric(q(0.5), "p50_ms")
	b.ReportMetric(q(0.99), "p99_ms")
	b.ReportMetric(lat[len(lat)-1], "max_ms")
	b.ReportMetric(perRequest, "events/request")
	b.ReportMetric(reached, "events/s")
	fmt.Printf("\ncommit → visible at %d events/s, %d-row transactions, %s (%d events counted; the writer reached %.0f/s):\n", rate, per, brokerName(), len(lat), reached)
	fmt.Printf("  p50 %.1f ms  p90 %.1f ms  p99 %.1f ms  max %.1f ms  (%.1f events/request, cpu %.2f s, peak RSS %.1f MB)\n", q(0.5), q(0.9), q(0.99), lat[len(lat)-1], perRequest, cpuTime.Seconds(), rss)
	fmt.Printf("  commit → Kafka's ack, by cdc_commit_to_ack_seconds: p50 ≤ %g ms, p99 ≤ %g ms\n", ackP50, ackP99)
	var floorP50, floorP99 float64
	if len(floor) > 0 {
		fq := func(f float64) float64 { return floor[min(len(floor)-1, int(f*float64(len(floor))))] }
		floorP50, floorP99 = fq(0.5), fq(0.99)
		b.ReportMetric(floorP99, "floor_p99_ms")
		b.ReportMetric(q(0.99)-floorP99, "p99_over_floor_ms")
		fmt.Printf("  the floor, pg_recvlogical alone on a slot of its own at the same rate: p50 %.1f ms  p99 %.1f ms  max %.1f ms; the connector's p99 minus the floor's: %+.1f ms\n",
			floorP50, floorP99, floor[len(floor)-1], q(0.99)-floorP99)
	}
	fmt.Printf("  CPU, %% of a core, from the warm-up to the last event:")
	for _, name := range []string{"connector", "walsender", "writer", "broker"} {
		if v, ok := cpuPct[name]; ok {
			fmt.Printf("  %s %.0f", name, v)
		}
	}
	fmt.Printf("\n\n")
	// Keep the file small: the CDF at 1000 points.
	cdf := make([]float64, 0, 1001)
	for i := 0; i <= 1000; i++ {
		cdf = append(cdf, q(float64(i)/1000))
	}
	bench := "latency"
	if per > 1 {
		bench = "sweep"
	}
	r := benchResult{Bench: bench, Broker: brokerName(), Events: total, TxSize: per, Rate: float64(rate), Reached: reached, CPU: cpuTime.Seconds(), RSSMB: rss, PerRequest: perRequest, Latency: cdf,
		AckP50: ackP50, AckP99: ackP99, CPUPercent: cpuPct, FloorP50: floorP50, FloorP99: floorP99}
	if top == "" {
		r.save(b)
	}
	return r
}

// BenchmarkNetwork is what a network between the connector and the broker
// costs (issue 41): the drain of benchEvents() 1-row transactions, against
// pg_recvlogical, and commit → visible at 20,000 events/s in 10-row
// transactions, in both delivery modes. make bench-network runs it three
// times, the connector reaching the broker through a proxy that adds 0, 2
// and 20 ms each way (CDC_BENCH_CONNECTOR_BROKERS; CDC_BENCH_NET_MS says
// which, for the results); the bench's own clients reach the broker
// directly.
func BenchmarkNetwork(b *testing.B) {
	netMS, _ := strconv.ParseFloat(os.Getenv("CDC_BENCH_NET_MS"), 64)
	seconds := 10
	if v := os.Getenv("CDC_BENCH_SECONDS"); v != "" {
		seconds, _ = strconv.Atoi(v)
	}
	for _, mode := range []string{"at-least-once", "exactly-once"} {
		top := "delivery: " + mode + "\n"
		b.Run("drain/"+mode, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				events := benchEvents()
				d := drain(b, 1, top)
				ratio := d.ref.Seconds() / d.elapsed.Seconds()
				b.ReportMetric(float64(events)/d.elapsed.Seconds(), "events/s")
				b.ReportMetric(ratio, "ratio")
				fmt.Printf("\ndrain %d events in 1-row transactions, %s, %g ms each way to the broker: %.3f s, %.0f events/s, ratio %.2f (pg_recvlogical %.3f s)\n\n",
					events, mode, netMS, d.elapsed.Seconds(), float64(events)/d.elapsed.Seconds(), ratio, d.ref.Seconds())
				benchResult{Bench: "network-drain", Broker: brokerName(), Events: events, TxSize: 1, Seconds: d.elapsed.Seconds(),
					RefSecs: d.ref.Seconds(), Ratio: ratio, CPU: d.cpu.Seconds(), RSSMB: d.rss, Delivery: mode, NetMS: netMS}.save(b)
			}
		})
		b.Run("latency/"+mode, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				r := latencyWith(b, 20_000, 10, time.Duration(seconds)*time.Second, top)
				r.Bench, r.Delivery, r.NetMS = "network-latency", mode, netMS
				r.save(b)
			}
		})
	}
}

// BenchmarkStartup starts the cdc binary on a backlog of one event, its
// slot, checkpoint and topic made by an earlier run, and times what a user
// waits for: from the process's start until a consumer sees the event, and
// until Postgres has the confirm. The connector's debug log gives the
// stages on the way (docs/benchmarks.md, "Start-up").
func BenchmarkStartup(b *testing.B) {
	for i := 0; i < b.N; i++ {
		startupOnce(b)
	}
}

// startupStages are the log lines of the stages, in order.
var startupStages = []struct{ name, line string }{
	{"config read", "cdc: starting:"},
	{"kafka answered", "kafka: brokers answered"},
	{"postgres connected", "postgres: replication connection open"},
	{"checkpoint topic ready", "checkpoint topic ready"},
	{"checkpoint read", "checkpoint read"},
	{"streaming", "streaming from replication slot"},
}

func startupOnce(b *testing.B) {
	p := testenv.Require(b, pg)
	db := p.NewDatabase(b)
	kafka := testenv.NewKafka(b)
	conn := testenv.Connect(b, db)
	warmUp(b, db, kafka, conn)
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.Brokers...), kgo.ConsumeTopics(kafka.Prefix+"outbox.event.order"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()), kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	// Join the topic's end before the event exists.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	cl.PollFetches(ctx)
	cancel()
	before := testenv.CurrentWAL(b, db)
	testenv.Exec(b, db, "CALL fill_tx(1, 1)")
	end := testenv.CurrentWAL(b, db)
	testenv.Eventually(b, time.Minute, "the event to be flushed", func() bool {
		var flushed bool
		testenv.QueryRow(b, db, `SELECT pg_current_wal_flush_lsn() >= $1::pg_lsn`, []any{end.String()}, &flushed)
		return flushed
	})

	b.ResetTimer()
	c := startConnectorWith(b, db, kafka, "", "log:\n  level: debug\n")
	var visible time.Time
	deadline := time.Now().Add(time.Minute)
	for visible.IsZero() && time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		fs := cl.PollFetches(ctx)
		cancel()
		if fs.NumRecords() > 0 {
			visible = time.Now()
		}
	}
	if visible.IsZero() {
		b.Fatalf("no consumer saw the event\n%s", c.out.String())
	}
	confirmed := c.waitConfirmed(b, conn, before)
	b.StopTimer()
	c.stop(b)
	log := c.out.String()

	at := map[string]float64{}
	for _, l := range strings.Split(log, "\n") {
		ts, rest, _ := strings.Cut(l, " ")
		t, err := time.Parse("2006-01-02T15:04:05.000Z0700", ts)
		if err != nil {
			continue
		}
		for _, st := range startupStages {
			if _, ok := at[st.name]; !ok && strings.Contains(rest, st.line) {
				at[st.name] = float64(t.Sub(c.start).Microseconds()) / 1000
			}
		}
	}
	visibleMS := float64(visible.Sub(c.start).Microseconds()) / 1000
	confirmMS := float64(confirmed.Sub(c.start).Microseconds()) / 1000
	b.ReportMetric(visibleMS, "visible_ms")
	b.ReportMetric(confirmMS, "confirmed_ms")
	fmt.Printf("\nstart-up on a backlog of one event (%s), ms from the process's start:\n", brokerName())
	stages := map[string]float64{}
	for _, st := range startupStages {
		v, ok := at[st.name]
		if !ok {
			b.Fatalf("no %q line in the connector's log\n%s", st.line, log)
		}
		stages[st.name] = v
		fmt.Printf("  %-22s %7.1f\n", st.name, v)
	}
	fmt.Printf("  %-22s %7.1f\n  %-22s %7.1f\n\n", "event visible", visibleMS, "confirmed", confirmMS)
	benchResult{Bench: "startup", Broker: brokerName(), Events: 1, Seconds: visibleMS / 1000, RefSecs: confirmMS / 1000, Stages: stages}.save(b)
}
