package retention

import (
	"fmt"
	"testing"
	"time"

	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestRetentionHeldByNoInheritingTable (found by an attack): a table
// that inherits from the outbox is no outbox. Retention deletes the
// outbox's old rows, never a child's (its rows were never sent), and is
// not held by a child it never deletes from: its DELETE named the table
// without ONLY, so a foreign archive that cannot be scanned failed every
// sweep, and a child locked by a migration held it past its lock
// timeout, the outbox never cleaned.
func TestRetentionHeldByNoInheritingTable(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup []string
	}{
		{"plain child", []string{`CREATE TABLE kid () INHERITS (outbox)`}},
		{"locked child", []string{`CREATE TABLE kid () INHERITS (outbox)`}},
		{"foreign child", []string{`CREATE FOREIGN DATA WRAPPER unreachable`, `CREATE SERVER archive_server FOREIGN DATA WRAPPER unreachable`,
			`CREATE FOREIGN TABLE archive () INHERITS (outbox) SERVER archive_server`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := newTable(t, time.Hour, outbox.RetentionDelete)
			testenv.Exec(t, tb.db, tc.setup...)
			old := tb.now.Add(-2 * time.Hour).Format(time.RFC3339)
			testenv.Exec(t, tb.db, fmt.Sprintf(`INSERT INTO outbox (created_at, aggregatetype, aggregateid, type) VALUES ('%s', 'order', 'a', 'E')`, old))
			if tc.name == "plain child" {
				testenv.Exec(t, tb.db, fmt.Sprintf(`INSERT INTO kid (created_at, aggregatetype, aggregateid, type) VALUES ('%s', 'order', 'a', 'K')`, old))
			}
			tb.ack(t)
			if tc.name == "locked child" {
				other := testenv.Connect(t, tb.db)
				if _, err := other.Exec(t.Context(), "BEGIN; LOCK TABLE ONLY kid IN ACCESS EXCLUSIVE MODE"); err != nil {
					t.Fatal(err)
				}
				tb.ack(t) // the lock's WAL record
			}
			for i := 0; i < 16; i++ {
				if err := tb.clean.Sweep(t.Context()); err != nil {
					t.Fatalf("sweep %d: %v", i, err)
				}
				tb.now = tb.now.Add(5 * time.Minute)
			}
			if n := tb.count(t, "ONLY outbox", "true"); n != 0 {
				t.Errorf("%d outbox rows left, want 0", n)
			}
			if tc.name == "plain child" {
				if n := tb.count(t, "kid", "true"); n != 1 {
					t.Errorf("%d child rows left, want 1 (never sent)", n)
				}
			}
		})
	}
}
