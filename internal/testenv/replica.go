//go:build replica

package testenv

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/localpg"
)

// ReplicaPair is a primary and a hot standby streaming from it through a
// physical slot, with hot_standby_feedback on: what a connector that
// streams from a read replica needs (docs/operations.md, "Streaming from a
// replica"). make test-replica starts them from CDC_PG_BIN's binaries.
type ReplicaPair struct {
	Primary, Standby *localpg.Server
	dbs              atomic.Int64
}

// StartReplicaPair starts a primary and its standby (PostgreSQL 16 or
// later: older standbys do not decode), with extra settings for the
// standby; both are stopped when the test ends.
func StartReplicaPair(t testing.TB, standbySettings ...string) *ReplicaPair {
	t.Helper()
	primary, err := localpg.Start("wal_keep_size=256MB")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(primary.Stop)
	var version int
	QueryRow(t, primary.URL, `SELECT current_setting('server_version_num')::int`, nil, &version)
	if version < 160000 {
		t.Fatalf("logical decoding on a standby needs PostgreSQL 16 or later, and CDC_PG_BIN names %d; make test-replica fetches one", version/10000)
	}
	Exec(t, primary.URL, `SELECT pg_create_physical_replication_slot('standby1', true)`)
	if err := primary.StopKeep(); err != nil {
		t.Fatal(err)
	}
	settings := append([]string{
		fmt.Sprintf("primary_conninfo=host=127.0.0.1 port=%d user=postgres", primary.Port),
		"primary_slot_name=standby1", "hot_standby_feedback=on",
	}, standbySettings...)
	standby, err := primary.CloneStandby(settings...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(standby.Stop)
	if err := primary.StartAgain(); err != nil {
		t.Fatal(err)
	}
	return &ReplicaPair{Primary: primary, Standby: standby}
}

// NewDatabase creates a database on the primary and returns its URL there
// and on the standby, once the standby has it.
func (r *ReplicaPair) NewDatabase(t testing.TB) (primary, standby string) {
	t.Helper()
	name := fmt.Sprintf("replica_%d", r.dbs.Add(1))
	Exec(t, r.Primary.URL, "CREATE DATABASE "+name)
	primary = strings.Replace(r.Primary.URL, "/postgres?", "/"+name+"?", 1)
	standby = strings.Replace(r.Standby.URL, "/postgres?", "/"+name+"?", 1)
	Eventually(t, time.Minute, "the standby to have database "+name, func() bool {
		conn, err := pgx.Connect(context.Background(), standby)
		if err != nil {
			return false
		}
		conn.Close(context.Background())
		return true
	})
	return primary, standby
}

// CaughtUp waits until the standby has replayed what the primary has
// written so far: up to its insert position, since with asynchronous
// commits a commit may still be in the primary's WAL buffers.
func (r *ReplicaPair) CaughtUp(t testing.TB) {
	t.Helper()
	var end string
	QueryRow(t, r.Primary.URL, `SELECT pg_current_wal_insert_lsn()::text`, nil, &end)
	Eventually(t, time.Minute, "the standby to replay up to "+end, func() bool {
		var ok bool
		QueryRow(t, r.Standby.URL, `SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)`, []any{end}, &ok)
		return ok
	})
}
