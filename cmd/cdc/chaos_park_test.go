//go:build chaos

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestChaosKillDuringRedrive (issues 48 and 53): 20 aggregates, each with
// an event over max_message_bytes early on, park; with the limit raised, a
// cdc redrive of every key (about 20,000 events) is killed with SIGKILL at
// a random point of its progress, three times, the connector started
// again each time. At least one kill lands while the redrive is under way
// (the topic holds some of its events, and the checkpoint, read by cdc
// status while the connector is down, still lists parkings), or the test
// proves nothing and fails.
// Every aggregate reads on its topic in commit order with no gap, the
// first copies in order; in exactly-once mode, read read_committed, none
// twice; at least once, no more copies than one redrive's worth a kill
// (a crash sends the redrive again from each parking's first event: its
// request's transaction is confirmed whole; docs/operations.md).
func TestChaosKillDuringRedrive(t *testing.T) {
	for _, exactlyOnce := range []bool{false, true} {
		t.Run(deliveryMode(exactlyOnce), func(t *testing.T) {
			db := testenv.Require(t, pg).NewDatabase(t)
			testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
				aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`)
			kafka := testenv.NewKafka(t)
			limit := 64 << 10
			config := func() string { return parkConfig(t, kafka, db, exactlyOnce, limit) }
			proc := startProc(t, config())
			testenv.Eventually(t, 30*time.Second, "the connector to hold the slot", func() bool { return slotActive(t, db) })
			const aggs, per = 20, 1000
			conn, err := pgx.Connect(context.Background(), db)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			for s := 1; s <= per; s++ {
				batch := &pgx.Batch{}
				for a := 0; a < aggs; a++ {
					pad := ""
					if s == 5 {
						pad = strings.Repeat("x", 70_000)
					}
					batch.Queue(`INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', $1, 'E', jsonb_build_object('seq', $2::int, 'pad', $3::text))`, fmt.Sprintf("agg-%02d", a), s, pad)
				}
				if err := conn.SendBatch(context.Background(), batch).Close(); err != nil {
					t.Fatal(err)
				}
			}
			c := kafka.NewConsumer(t, kafka.AllTopics())
			if exactlyOnce {
				c = kafka.NewCommittedConsumer(t, kafka.AllTopics())
			}
			parked := kafka.Prefix + "outbox.parked"
			c.WaitFor(t, 3*time.Minute, "every aggregate parked from its 5th event", func(recs []*kgo.Record) bool {
				n := 0
				for _, r := range recs {
					if r.Topic == parked {
						n++
					}
				}
				return n >= aggs*(per-4)
			})

			limit = 1 << 20
			// Kills that found the redrive begun (the topic held more than
			// the 4 events each aggregate sent before it parked) and not
			// done (the checkpoint, read while the connector is down, still
			// lists parkings; at least once it lists them whole until the
			// request's transaction is confirmed).
			midway := 0
			kill := func(during bool) {
				proc.cmd.Process.Signal(syscall.SIGKILL)
				proc.cmd.Wait()
				if during && len(statusParked(t, config())) > 0 {
					midway++
				}
				proc = startProc(t, config())
			}
			kill(false) // the limit raised
			testenv.Eventually(t, time.Minute, "the connector to hold the slot", func() bool { return slotActive(t, db) })
			out := startCmd(t, "redrive", "--config", config(), "--all", "--no-wait")
			if err := out.cmd.Wait(); err != nil {
				t.Fatalf("cdc redrive: %v\n%s", err, out.out)
			}
			topic := kafka.Prefix + "outbox.event.order"
			delivered := func(recs []*kgo.Record) int {
				first := map[string]bool{}
				for _, r := range recs {
					if r.Topic == topic {
						first[testenv.Header(r, "id")] = true
					}
				}
				return len(first)
			}
			// Each kill comes once the topic holds a random number of the
			// events, drawn at the start; a kill the redrive outran comes
			// at once (a restart after it).
			// The first in the redrive's first quarter, so that one kill at
			// least lands while it runs (it sends 20,000 in seconds).
			points := []int{4*aggs + 1 + rand.N(aggs*(per-4)/4)}
			for range 2 {
				points = append(points, 4*aggs+1+rand.N(aggs*(per-4)))
			}
			slices.Sort(points)
			for k, at := range points {
				c.WaitFor(t, 5*time.Minute, fmt.Sprintf("%d events on the topic before kill %d", at, k+1), func(recs []*kgo.Record) bool { return delivered(recs) >= at })
				kill(true) // once the topic holds at > 4*aggs events
				testenv.Eventually(t, time.Minute, "the connector to hold the slot", func() bool { return slotActive(t, db) })
			}
			c.WaitFor(t, 5*time.Minute, "every event on its topic", func(recs []*kgo.Record) bool { return delivered(recs) == aggs*per })
			c.Settle(t)
			next, dups := map[string]int{}, 0
			seen := map[string]bool{}
			for _, r := range c.Records {
				if r.Topic != topic {
					continue
				}
				id := testenv.Header(r, "id")
				if seen[id] {
					dups++
					continue
				}
				seen[id] = true
				var v struct{ Seq int }
				if err := json.Unmarshal(r.Value, &v); err != nil {
					t.Fatal(err)
				}
				agg := string(r.Key)
				if v.Seq != next[agg]+1 {
					t.Fatalf("%s: event %d after %d (a gap or a reorder)", agg, v.Seq, next[agg])
				}
				next[agg] = v.Seq
			}
			if exactlyOnce && dups > 0 {
				t.Fatalf("%d events twice in exactly-once mode, read read_committed", dups)
			}
			if bound := len(points) * aggs * (per - 4); dups > bound {
				t.Fatalf("%d events twice through %d kills, more than one redrive's worth each (%d)", dups, len(points), bound)
			}
			if midway == 0 {
				t.Fatalf("no kill landed while the redrive was under way (kills at %v of %d events): the test proved nothing", points, aggs*per)
			}
			t.Logf("%s: %d events, %d redriven through 3 kills (%d of them during the redrive), %d duplicates", deliveryMode(exactlyOnce), aggs*per, aggs*(per-4), midway, dups)
		})
	}
}

// parkedState is a parking as cdc status --json shows it.
type parkedState struct {
	Key      string `json:"key"`
	Events   int64  `json:"events"`
	Released int64  `json:"released"`
}

// statusParked runs cdc status --json and returns the parked keys.
func statusParked(t *testing.T, config string) []parkedState {
	t.Helper()
	p := startCmd(t, "status", "--config", config, "--json")
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("cdc status: %v: %s", err, p.out)
	}
	var st struct {
		Checkpoint *struct {
			Parked []parkedState `json:"parked"`
		} `json:"checkpoint"`
	}
	out := p.out.String()
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &st); err != nil {
		t.Fatalf("cdc status --json: %v: %s", err, out)
	}
	if st.Checkpoint == nil {
		return nil
	}
	return st.Checkpoint.Parked
}

// parkConfig is the config of a connector whose outbox parks invalid
// events' keys, with a record limit of limit bytes and a signing key (a
// redrive request is signed).
func parkConfig(t *testing.T, kafka *testenv.Kafka, db string, exactlyOnce bool, limit int) string {
	t.Helper()
	dir := t.TempDir()
	key, config := filepath.Join(dir, "signing.key"), filepath.Join(dir, "cdc.yaml")
	if err := os.WriteFile(key, []byte(strings.Repeat("7a", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`
postgres: {url: %q}
kafka: {brokers: [%s], max_message_bytes: %d}
tables: [{name: outbox, topic: %q, on_invalid: park, parked_topic: %q}]
checkpoint: {topic: %s, signing_key_file: %q}
delivery: %s
http: {listen: ""}
log: {level: info}
`, db, strings.Join(kafka.Brokers, ", "), limit, kafka.Prefix+"outbox.event.{aggregate_type}", kafka.Prefix+"outbox.parked", kafka.CheckpointTopic(), key, deliveryMode(exactlyOnce))
	if err := os.WriteFile(config, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return config
}
