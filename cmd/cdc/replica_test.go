//go:build replica

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestReplicaCLI (issue 42, make test-replica, PostgreSQL 16+): the
// commands against a hot standby with postgres.primary_url. cdc check
// passes, and without primary_url warns; cdc run streams from the
// standby; cdc status says it is one; cdc backfill sends the rows
// committed before the slot, its announcement and watermarks written on
// the primary; and every example layout streams from the standby with
// the records expected.yaml lists.
func TestReplicaCLI(t *testing.T) {
	pair := testenv.StartReplicaPair(t)

	t.Run("commands", func(t *testing.T) {
		primary, standby := pair.NewDatabase(t)
		testenv.Exec(t, primary, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
			aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`,
			`INSERT INTO outbox (aggregatetype, aggregateid, type, payload) SELECT 'order', 'before-' || (i % 5), 'Created', '{}' FROM generate_series(1, 100) i`)
		pair.CaughtUp(t)
		kafka := testenv.NewKafka(t)
		dir := t.TempDir()
		keyFile := filepath.Join(dir, "signing.key")
		if err := os.WriteFile(keyFile, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		write := func(name, primaryURL string) string {
			config := filepath.Join(dir, name)
			err := os.WriteFile(config, []byte(fmt.Sprintf(`
postgres:
  url: %q
  primary_url: %q
  status_interval: 50ms
kafka:
  brokers: [%s]
tables:
  - name: outbox
    topic: %s
checkpoint:
  topic: %s
  signing_key_file: %s
http:
  listen: ""
`, standby, primaryURL, strings.Join(kafka.Brokers, ", "), kafka.Prefix+"outbox.event.{aggregate_type}", kafka.CheckpointTopic(), keyFile)), 0o600)
			if err != nil {
				t.Fatal(err)
			}
			return config
		}
		config, alone := write("cdc.yaml", primary), write("alone.yaml", "")

		check := startCmd(t, "check", "--config", config)
		if err := check.cmd.Wait(); err != nil || strings.Contains(check.out.String(), "primary_url") {
			t.Fatalf("cdc check with primary_url: %v\n%s", err, check.out)
		}
		check = startCmd(t, "check", "--config", alone)
		check.cmd.Wait()
		if !strings.Contains(check.out.String(), "postgres.url is a hot standby and postgres.primary_url is not set") {
			t.Errorf("cdc check without primary_url does not warn about it:\n%s", check.out)
		}

		run := startProc(t, config)
		testenv.Eventually(t, time.Minute, "the connector to stream", func() bool {
			return strings.Contains(run.out.String(), "streaming from replication slot")
		})
		if !strings.Contains(run.out.String(), "postgres.url is a hot standby") {
			t.Errorf("cdc run does not say it streams from a standby:\n%s", run.out)
		}
		status := startCmd(t, "status", "--config", config)
		if err := status.cmd.Wait(); err != nil || !strings.Contains(status.out.String(), "hot standby, PostgreSQL") {
			t.Errorf("cdc status: %v; it does not say the server is a hot standby:\n%s", err, status.out)
		}

		c := kafka.NewConsumer(t, kafka.AllTopics())
		testenv.Exec(t, primary, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) SELECT 'order', 'after-' || (i % 5), 'Created', '{}' FROM generate_series(1, 50) i`)
		bf := startCmd(t, "backfill", "--config", config, "--table", "outbox", "--where", "aggregateid LIKE 'before-%'")
		if err := bf.cmd.Wait(); err != nil || !strings.Contains(bf.out.String(), "backfilled 100 rows") {
			t.Fatalf("cdc backfill: %v\n%s", err, bf.out)
		}
		var all []string
		testenv.QueryRow(t, primary, `SELECT array_agg(id::text) FROM outbox`, nil, &all)
		c.WaitFor(t, time.Minute, "every row of the table", func(recs []*kgo.Record) bool {
			got := map[string]bool{}
			for _, r := range recs {
				got[testenv.Header(r, route.HeaderID)] = true
			}
			for _, id := range all {
				if !got[id] {
					return false
				}
			}
			return true
		})
		c.Settle(t)
		if len(c.Records) != len(all) {
			t.Errorf("%d records for %d rows: the stream and the backfill each send their own", len(c.Records), len(all))
		}
		run.cmd.Process.Signal(syscall.SIGTERM)
		if err := run.cmd.Wait(); err != nil {
			t.Errorf("cdc run: %v\n%s", err, run.out)
		}
		dropStandbySlots(t, standby)
	})

	t.Run("examples", func(t *testing.T) {
		forEachExample(t, func(t *testing.T, dir string) {
			primary, standby := pair.NewDatabase(t)
			checkExample(t, dir, primary, standby, primary, func() { pair.CaughtUp(t) })
			dropStandbySlots(t, standby)
		})
	})
}

// dropStandbySlots drops the slots of db's database: slot names are the
// cluster's, and every test here uses outbox_cdc.
func dropStandbySlots(t *testing.T, db string) {
	t.Helper()
	testenv.Exec(t, db, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = current_database() AND active_pid IS NOT NULL`)
	testenv.Eventually(t, 30*time.Second, "the slots to be dropped", func() bool {
		conn, err := pgx.Connect(context.Background(), db)
		if err != nil {
			return false
		}
		defer conn.Close(context.Background())
		conn.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active`)
		var left int
		conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots WHERE database = current_database()`).Scan(&left)
		return left == 0
	})
}
