package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// WAL histories (issue 23, items 7 and 12; docs/design.md, rule 21): an LSN in the
// checkpoint means something only on the server, and in the WAL history,
// that wrote it.

// TestRestoreFromBackup: the server is restored from a cold copy of its
// data directory (same system identifier, an older WAL), once taken before
// the slot existed (as pg_basebackup, which leaves slots out) and once
// after. The connector refuses to stream over what was lost; after cdc
// reset --accept-gap, in exactly-once mode, every new transaction arrives.
// New transactions reuse the positions the lost ones had: the checkpoint's
// last commit LSN used to make the connector skip them, without a word.
// With retention on, the gap forgets its marks (the restored server reuses
// xids and positions) and what the stream covered: the rows the restored
// table holds at the next start are kept, and those streamed after it go.
func TestRestoreFromBackup(t *testing.T) {
	for _, tt := range []struct {
		name       string
		slotBackup bool
		gap        checkpoint.GapKind
	}{
		{"backup without the slot", false, checkpoint.GapSlotMissing},
		{"backup with the slot", true, checkpoint.GapHistory},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv, err := testenv.StartPostgres()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(srv.Stop)
			kafka := testenv.NewKafka(t)
			db := srv.NewDatabase(t)
			testenv.Exec(t, db, schema)
			e := &env{db: db, kafka: kafka, cfg: newEnvConfig(db, kafka), retentionInterval: 100 * time.Millisecond}
			e.cfg.Delivery = config.DeliveryExactlyOnce
			e.cfg.Tables[0].Retention = &outbox.Retention{After: time.Second}
			c := kafka.NewCommittedConsumer(t, kafka.AllTopics())
			write := func(n int, typ string) map[string]bool {
				conn := testenv.Connect(t, db)
				ids := map[string]bool{}
				for i := 0; i < n; i++ {
					ids[insertEvent(t, conn, fmt.Sprintf("agg-%d", i%7), typ)] = true
				}
				conn.Close(context.Background())
				return ids
			}
			backup := func() {
				if err := srv.StopKeep(); err != nil {
					t.Fatal(err)
				}
				if err := srv.Backup(); err != nil {
					t.Fatal(err)
				}
				if err := srv.StartAgain(); err != nil {
					t.Fatal(err)
				}
			}
			if !tt.slotBackup {
				backup()
			}
			r := e.start(t)
			before := write(50, "before")
			c.WaitCount(t, time.Minute, len(before))
			if tt.slotBackup {
				if err := r.stop(t); err != nil {
					t.Fatal(err)
				}
				backup()
				r = e.start(t)
			}
			lost := write(300, "lost")
			c.WaitCount(t, time.Minute, len(before)+len(lost))
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}

			if err := srv.Restore(); err != nil {
				t.Fatal(err)
			}
			err = waitFatal(t, e.launch(t, ioDiscard{}))
			var gap *checkpoint.GapError
			if !errors.As(err, &gap) || gap.Kind != tt.gap {
				t.Fatalf("after the restore: %v; want a gap of kind %d", err, tt.gap)
			}
			p, err := pipeline.New(e.cfg, hclog.NewNullLogger(), pipeline.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Ops().AcceptGap(context.Background()); err != nil {
				t.Fatal(err)
			}
			rec, _ := loadCheckpoint(t, e)
			if st := rec.Tables["public.outbox"]; len(rec.RetentionMarks) != 0 || st.Floor != checkpoint.NoFloor {
				t.Fatalf("after --accept-gap: %d retention marks, floor %d; want none, and no floor", len(rec.RetentionMarks), st.Floor)
			}
			restored := outboxRows(t, db)
			r = e.start(t)
			after := write(200, "after")
			c.WaitFor(t, time.Minute, "every transaction after the restore", func(recs []*kgo.Record) bool {
				got := ids(recs)
				for id := range after {
					if got[id] == 0 {
						return false
					}
				}
				return true
			})
			c.SettleConfirmed(t, time.Minute, db, "outbox_cdc")
			got := ids(c.Records)
			for id := range after {
				if got[id] != 1 {
					t.Errorf("event %s written after the restore arrived %d times", id, got[id])
				}
			}
			testenv.Eventually(t, time.Minute, "the rows streamed after the restore deleted", func() bool {
				left := outboxRows(t, db)
				for id := range after {
					if _, ok := left[id]; ok {
						return false
					}
				}
				return true
			})
			left := outboxRows(t, db)
			for id := range restored {
				if _, ok := left[id]; !ok {
					t.Errorf("row %s, in the restored table at the start after the gap, was deleted", id)
				}
			}
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestTwoDatabasesShareTheCheckpointTopic: two databases on two servers,
// each with the default slot name, share the checkpoint topic (as
// docs/config.md says they may). The second's first start used to be
// refused as "another system".
func TestTwoDatabasesShareTheCheckpointTopic(t *testing.T) {
	kafka := testenv.NewKafka(t)
	a := newEnv(t, kafka)
	srv, err := testenv.StartPostgres()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	dbB := srv.NewDatabase(t)
	testenv.Exec(t, dbB, schema)
	b := &env{db: dbB, kafka: kafka, cfg: newEnvConfig(dbB, kafka)}
	if a.cfg.Postgres.Slot != b.cfg.Postgres.Slot || a.cfg.Checkpoint.Topic != b.cfg.Checkpoint.Topic {
		t.Fatal("the two pipelines should share the slot name and the checkpoint topic")
	}
	ra := a.start(t)
	rb := b.start(t)
	idA := insertEvent(t, testenv.Connect(t, a.db), "agg-a", "created")
	idB := insertEvent(t, testenv.Connect(t, b.db), "agg-b", "created")
	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.WaitFor(t, time.Minute, "an event from each database", func(recs []*kgo.Record) bool {
		got := ids(recs)
		return got[idA] == 1 && got[idB] == 1
	})
	for _, r := range []*running{ra, rb} {
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
	}
	// Each restarts from its own checkpoint.
	ra, rb = a.start(t), b.start(t)
	for _, r := range []*running{ra, rb} {
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
	}
}
