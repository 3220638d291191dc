package pipeline_test

import (
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/outboxcdc/cdc/internal/fault"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/testenv"
	"github.com/outboxcdc/cdc/internal/wal"
)

// TestLostSlotNamesItsCause: Postgres invalidates the slot of a stopped
// connector, and the next start stops on one line that names the
// setting that did it, and only that one; cdc status shows the reason,
// cdc reset --accept-gap records it, and the replay window's keeper says
// why its slot went. On PostgreSQL 18 the setting is
// idle_replication_slot_timeout (1 s here; it is in seconds): it
// invalidates the replay slot, idle by design, even while the connector
// runs, and the stopped connector's slot once it has been idle that long
// at a checkpoint. Before 18, there is no such setting, and the slot is
// lost to max_slot_wal_keep_size (1MB) once WAL is written past it.
func TestLostSlotNamesItsCause(t *testing.T) {
	testenv.Require(t, pg)
	srv, err := testenv.StartPostgres() // its own: the settings below would invalidate other tests' slots
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop) // after the database cleanup NewDatabase registers
	db := srv.NewDatabase(t)
	testenv.Exec(t, db, schema)
	var version int
	testenv.QueryRow(t, db, `SELECT current_setting('server_version_num')::int`, nil, &version)
	idle := version >= 180000
	reason, setting, other := postgres.ReasonWALRemoved, "max_slot_wal_keep_size", "idle_replication_slot_timeout"
	if idle {
		reason, setting, other = postgres.ReasonIdleTimeout, other, setting
	}
	slotState := func(slot string) (walStatus, invalidated string) {
		// invalidation_reason is PostgreSQL 17's; before, wal_status.
		q := `SELECT wal_status, '' FROM pg_replication_slots WHERE slot_name = $1`
		if version >= 170000 {
			q = `SELECT wal_status, coalesce(invalidation_reason, '') FROM pg_replication_slots WHERE slot_name = $1`
		}
		testenv.QueryRow(t, db, q, []any{slot}, &walStatus, &invalidated)
		return walStatus, invalidated
	}
	invalidated := func(slot string) bool {
		walStatus, why := slotState(slot)
		return walStatus == "lost" && (version < 170000 || why == reason)
	}

	kafka := testenv.NewKafka(t)
	log := &testenv.Buffer{}
	e := &env{db: db, kafka: kafka, cfg: newEnvConfig(db, kafka), logOut: io.MultiWriter(log, os.Stderr)}
	e.cfg.Replay.Window = 64 * time.Second // the keeper looks every second (a 64th of it)
	r := e.start(t)
	insertEvent(t, testenv.Connect(t, db), "lost-1", "Before")
	kafka.NewConsumer(t, kafka.AllTopics()).WaitCount(t, time.Minute, 1)
	if idle {
		testenv.Exec(t, srv.URL, `ALTER SYSTEM SET idle_replication_slot_timeout = '1s'`, `SELECT pg_reload_conf()`)
		// The replay slot goes while the connector runs; its keeper
		// says why, and the streaming slot stays.
		testenv.Eventually(t, time.Minute, "the keeper to report the replay slot invalidated", func() bool {
			testenv.Exec(t, db, `CHECKPOINT`)
			return strings.Contains(log.String(), "replay window lost: Postgres invalidated it because nothing streamed from it for longer than idle_replication_slot_timeout")
		})
		if walStatus, why := slotState("outbox_cdc"); walStatus == "lost" || why != "" {
			t.Fatalf("the slot the connector streams from was invalidated (%s, %s)", walStatus, why)
		}
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	confirmed := testenv.SlotPosition(t, db, "outbox_cdc")
	if idle {
		testenv.Eventually(t, time.Minute, "Postgres to invalidate the stopped connector's slot", func() bool {
			testenv.Exec(t, db, `CHECKPOINT`)
			return invalidated("outbox_cdc")
		})
	} else {
		testenv.Exec(t, srv.URL, `ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'`, `SELECT pg_reload_conf()`)
		testenv.Eventually(t, time.Minute, "Postgres to remove WAL the stopped connector's slot needs", func() bool {
			testenv.Exec(t, db, `INSERT INTO other (note) VALUES ('wal')`, `SELECT pg_switch_wal()`, `CHECKPOINT`)
			return invalidated("outbox_cdc")
		})
	}

	// START_REPLICATION's refusal, should the slot go between the start's
	// look at it and streaming, names it too (from the error's detail).
	ctx := context.Background()
	pc := e.cfg.Postgres
	pc.Slot, pc.Publication = "outbox_cdc", "outbox_cdc"
	if _, err := wal.Open(ctx, pc, confirmed, hclog.NewNullLogger()); !errors.Is(err, postgres.ErrSlotLost) ||
		!strings.Contains(err.Error(), "is lost ("+reason+")") || !strings.Contains(err.Error(), setting) || strings.Contains(err.Error(), other) {
		t.Fatalf("START_REPLICATION on the invalidated slot: %v; want it lost to %s", err, setting)
	}

	err = waitFatal(t, e.launch(t, os.Stderr))
	msg := err.Error()
	if !errors.Is(err, postgres.ErrSlotLost) || !fault.Permanent(err) || strings.Contains(msg, "\n") ||
		!strings.Contains(msg, `replication slot "outbox_cdc" is lost (`+reason+`)`) || !strings.Contains(msg, setting) || strings.Contains(msg, other) ||
		!strings.Contains(msg, "events after its confirmed position "+confirmed.String()) || !strings.Contains(msg, "cdc reset --accept-gap") {
		t.Fatalf("Run returned %v; want one line: the slot is lost to %s (not %s), from %s, and how to recover", err, setting, other, confirmed)
	}
	st, err := e.newPipeline(t).Ops().Status(ctx)
	if err != nil || st.Slot.InvalidationReason != reason || !strings.Contains(st.Slot.LostCause, setting) {
		t.Fatalf("cdc status: slot %+v, %v; want invalidation reason %s, a cause naming %s", st.Slot, err, reason, setting)
	}

	// The setting back to its default; the gap accepted says why.
	testenv.Exec(t, srv.URL, `ALTER SYSTEM RESET `+setting, `SELECT pg_reload_conf()`)
	a, err := e.newPipeline(t).Ops().AcceptGap(ctx)
	if err != nil || !a.LostSlot {
		t.Fatalf("AcceptGap = %+v, %v; want the lost slot re-created", a, err)
	}
	rec, _ := loadCheckpoint(t, e)
	if h := rec.History; len(h) == 0 || h[len(h)-1].Reason != "the slot was lost ("+setting+")" {
		t.Fatalf("the checkpoint's history %+v; want the gap's reason to name %s", rec.History, setting)
	}
	// The replay slot went too: the next start says why, and makes a new one.
	before := len(log.String())
	e.start(t)
	testenv.Eventually(t, 30*time.Second, "the replay window's loss reported at start", func() bool {
		for _, line := range strings.Split(log.String()[before:], "\n") {
			if strings.Contains(line, "replay window lost") && strings.Contains(line, "invalidation_reason="+reason) && strings.Contains(line, setting) && !strings.Contains(line, other) {
				return true
			}
		}
		return false
	})
}
