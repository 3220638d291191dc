package pipeline_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestBackfillAcrossTwoTables (issue 53; rule 32): two or three
// configured outbox tables carry events of the same aggregates (same key,
// same topic), each event in a table drawn at random and in a transaction
// of its own. The first start's backfill ran one table's job, then the
// next: an aggregate's rows came table by table, not in the order they
// were committed, although the stream orders them by commit. The jobs are
// read together now, merged in the order of the commits; in a first start
// and in one interrupted half-way and continued before the stream, with
// events committed meanwhile. Seeds are drawn; CDC_ORDER_SEED replays one.
func TestBackfillAcrossTwoTables(t *testing.T) {
	for _, interrupted := range []bool{false, true} {
		t.Run(fmt.Sprintf("interrupted=%v", interrupted), func(t *testing.T) {
			seed := orderSeed(t)
			rng := rand.New(rand.NewPCG(seed, 11))
			kafka := testenv.NewFakeKafka(t)
			e := newEnv(t, kafka)
			tables := []string{"outbox"}
			for n := 2 + rng.IntN(2); len(tables) < n; {
				name := fmt.Sprintf("outbox%d", len(tables)+1)
				testenv.Exec(t, e.db, `CREATE TABLE `+name+` (LIKE outbox INCLUDING ALL)`)
				tb := *e.cfg.Tables[0]
				tb.Name = outbox.TableName{Schema: "public", Name: name}
				e.cfg.Tables = append(e.cfg.Tables, &tb)
				tables = append(tables, name)
			}
			for _, tb := range e.cfg.Tables {
				tb.Backfill = &outbox.BackfillOptions{ChunkSize: 1 + rng.IntN(10)} // at most the interrupted case's max_in_flight
			}
			want := map[string]bool{}
			conn := testenv.Connect(t, e.db)
			next := map[string]int{}
			write := func(n int) {
				for range n {
					agg := fmt.Sprintf("agg-%d", rng.IntN(4))
					var id string
					if err := conn.QueryRow(context.Background(), `INSERT INTO `+tables[rng.IntN(len(tables))]+` (aggregatetype, aggregateid, type, payload) VALUES ('order', $1, 'Seq', $2) RETURNING id::text`, agg, seqPayload(agg, next[agg])).Scan(&id); err != nil {
						t.Fatal(err)
					}
					next[agg]++
					want[id] = true
				}
			}
			write(60 + rng.IntN(60))
			if interrupted {
				e.cfg.MaxInFlight = 10
				var slow atomic.Bool
				slow.Store(true)
				kafka.Fake.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
					kafka.Fake.KeepControl()
					if slow.Load() {
						kafka.Fake.SleepControl(func() { time.Sleep(100 * time.Millisecond) })
					}
					return nil, nil, false
				})
				r := e.launch(t, ioDiscard{})
				testenv.Eventually(t, time.Minute, "the first start's jobs to save some rows", func() bool {
					rec, ok := loadCheckpoint(t, e)
					rows := int64(0)
					for _, j := range rec.Backfills {
						rows += j.Rows
					}
					return ok && rows >= 10
				})
				r.stop(t)
				rec, _ := loadCheckpoint(t, e)
				done := true
				for _, j := range rec.Backfills {
					done = done && j.Done()
				}
				if done {
					t.Skipf("seed %d: the jobs finished before the stop: this case proves nothing", seed)
				}
				slow.Store(false)
				write(10 + rng.IntN(20)) // committed after the slot, before the next start
			}
			e.start(t)
			write(5)
			expectFirstArrivalsInOrder(t, kafka.NewConsumer(t, kafka.AllTopics()), want, want)
		})
	}
}

// orderSeed is a drawn seed, or CDC_ORDER_SEED's, logged for a replay.
func orderSeed(t *testing.T) uint64 {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CDC_ORDER_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seed = n
	}
	t.Logf("seed %d (CDC_ORDER_SEED replays it)", seed)
	return seed
}
