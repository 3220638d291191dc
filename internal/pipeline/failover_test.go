//go:build failover

package pipeline_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/localpg"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestFailoverToPromotedStandby (issue 14, make test-failover, PostgreSQL
// 17+): a primary with a physical standby that syncs failover slots
// (sync_replication_slots, hot_standby_feedback, primary_slot_name; on the
// primary synchronized_standby_slots). The connector, given both hosts and
// target_session_attrs=read-write, creates its slot with failover. The
// primary crashes while a writer commits; the standby is promoted. The
// connector follows it to the new primary and resumes from the synced
// slot: every event the new primary holds arrives, and none it lost.
func TestFailoverToPromotedStandby(t *testing.T) {
	primary, err := localpg.Start("wal_keep_size=256MB")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(primary.Stop)
	var version int
	testenv.QueryRow(t, primary.URL, `SELECT current_setting('server_version_num')::int`, nil, &version)
	if version < 170000 {
		t.Fatalf("failover slots need PostgreSQL 17 or later, and CDC_PG_BIN names %d; make test-failover fetches one", version/10000)
	}
	testenv.Exec(t, primary.URL, `SELECT pg_create_physical_replication_slot('standby1', true)`, `CREATE DATABASE app`)
	app := strings.Replace(primary.URL, "/postgres?", "/app?", 1)
	testenv.Exec(t, app, schema)
	if err := primary.StopKeep(); err != nil {
		t.Fatal(err)
	}
	standby, err := primary.CloneStandby(
		fmt.Sprintf("primary_conninfo=host=127.0.0.1 port=%d user=postgres dbname=app", primary.Port),
		"primary_slot_name=standby1", "hot_standby_feedback=on", "sync_replication_slots=on")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(standby.Stop)
	if err := primary.StartAgain(); err != nil {
		t.Fatal(err)
	}
	testenv.Exec(t, primary.URL, `ALTER SYSTEM SET synchronized_standby_slots = 'standby1'`, `SELECT pg_reload_conf()`)

	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/app?sslmode=disable&target_session_attrs=read-write", primary.Port, standby.Port)
	kafka := testenv.NewKafka(t)
	e := &env{db: app, kafka: kafka, cfg: newEnvConfig(url, kafka)}
	r := e.start(t)
	var failover bool
	testenv.QueryRow(t, app, `SELECT failover FROM pg_replication_slots WHERE slot_name = 'outbox_cdc'`, nil, &failover)
	if !failover {
		t.Fatal("the connector created its slot without failover")
	}

	written, stopWriter := reconnectingWriter(url)
	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.WaitCount(t, time.Minute, 300)
	// A synced slot is temporary, and dropped by a promotion, until the
	// standby has caught up with it; then it persists.
	testenv.Eventually(t, 2*time.Minute, "the standby to sync the slot", func() bool {
		var synced bool
		testenv.QueryRow(t, standby.URL, `SELECT coalesce((SELECT synced AND NOT temporary FROM pg_replication_slots WHERE slot_name = 'outbox_cdc'), false)`, nil, &synced)
		return synced
	})

	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(); err != nil {
		t.Fatal(err)
	}
	at := written.Load()
	testenv.Eventually(t, 2*time.Minute, "writes on the new primary", func() bool { return written.Load() > at+300 })
	stopWriter()
	select {
	case err := <-r.done:
		close(r.done)
		t.Fatalf("the connector stopped after the failover: %v", err)
	default:
	}

	newApp := strings.Replace(standby.URL, "/postgres?", "/app?", 1)
	var all []string
	testenv.QueryRow(t, newApp, `SELECT array_agg(id::text) FROM outbox`, nil, &all)
	want := map[string]bool{}
	for _, id := range all {
		want[id] = true
	}
	c.WaitFor(t, 2*time.Minute, "every event the new primary holds", func(recs []*kgo.Record) bool {
		got := ids(recs)
		for id := range want {
			if got[id] == 0 {
				return false
			}
		}
		return true
	})
	c.Settle(t)
	got := ids(c.Records)
	phantom := 0
	for id := range got {
		if !want[id] {
			phantom++
		}
	}
	if phantom > 0 {
		t.Errorf("%d events in Kafka that the new primary does not hold: sent before the standby had them", phantom)
	}
	t.Logf("failover: %d events on the new primary, all delivered; %d records, %d duplicates", len(want), len(c.Records), len(c.Records)-len(got))
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
}
