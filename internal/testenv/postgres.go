package testenv

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// Postgres is a server the tests may create databases in.
type Postgres struct {
	// URL is a superuser URL for the "postgres" database.
	URL string
	// Bin is the directory of the server binaries, "" for an external
	// server.
	Bin string

	// Via says where the server comes from.
	Via string

	stop  func()
	crash func() error
	// down and up stop the server cleanly and start it again (local
	// servers only).
	down, up func() error
	// backup and restore: localpg's Backup and Restore.
	backup, restore func() error
}

// Backup copies the data directory of a server StopKeep stopped, for
// Restore (local servers only).
func (p *Postgres) Backup() error {
	if p.backup == nil {
		return fmt.Errorf("this Postgres (%s) cannot be backed up by the tests", p.Via)
	}
	return p.backup()
}

// Restore replaces the server's data with the Backup and starts it.
func (p *Postgres) Restore() error {
	if p.restore == nil {
		return fmt.Errorf("this Postgres (%s) cannot be restored by the tests", p.Via)
	}
	return p.restore()
}

// StopKeep stops the server and keeps its data and port, for StartAgain
// (local servers only).
func (p *Postgres) StopKeep() error {
	if p.down == nil {
		return fmt.Errorf("this Postgres (%s) cannot be stopped and started by the tests", p.Via)
	}
	return p.down()
}

// StartAgain starts a server StopKeep stopped.
func (p *Postgres) StartAgain() error {
	if p.up == nil {
		return fmt.Errorf("this Postgres (%s) cannot be stopped and started by the tests", p.Via)
	}
	return p.up()
}

// Crash stops the server as a crash would and starts it again (local
// servers only: a container's cannot be crashed from here).
func (p *Postgres) Crash() error {
	if p.crash == nil {
		return fmt.Errorf("this Postgres (%s) cannot be crashed and restarted by the tests", p.Via)
	}
	return p.crash()
}

// PostgresFromEnvOrStart returns the server named by CDC_TEST_POSTGRES_URL,
// or starts one with the given extra settings (name=value).
func PostgresFromEnvOrStart(settings ...string) (*Postgres, error) {
	if u := os.Getenv("CDC_TEST_POSTGRES_URL"); u != "" && len(settings) == 0 {
		return &Postgres{URL: u, Via: "CDC_TEST_POSTGRES_URL"}, nil
	}
	return StartPostgres(settings...)
}

// StartPostgres starts a throwaway server with wal_level=logical and the
// given extra settings (name=value), on the backend Backend chooses.
func StartPostgres(settings ...string) (*Postgres, error) { return startPostgres(settings...) }

// Stop stops a server this package started.
func (p *Postgres) Stop() {
	if p.stop != nil {
		p.stop()
	}
}

var dbSeq atomic.Int64

// NewDatabase creates an empty database and returns a superuser URL for
// it. Cleanup drops its replication slots and the database.
func (p *Postgres) NewDatabase(t testing.TB) string {
	t.Helper()
	return p.NewDatabaseWith(t, "")
}

// NewDatabaseWith is NewDatabase with CREATE DATABASE's options, such as
// an encoding of its own.
func (p *Postgres) NewDatabaseWith(t testing.TB, options string) string {
	t.Helper()
	name := fmt.Sprintf("cdc_test_%d_%d", os.Getpid(), dbSeq.Add(1))
	Exec(t, p.URL, "CREATE DATABASE "+name+" "+options)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, p.URL)
		if err != nil {
			t.Errorf("drop database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		conn.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = $1 AND active_pid IS NOT NULL`, name)
		// A terminated walsender releases its slot asynchronously.
		for i := 0; i < 100; i++ {
			if _, err = conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1`, name); err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if _, err := conn.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(p.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// Exec runs SQL statements on url, failing the test on error.
func Exec(t testing.TB, dbURL string, sql ...string) {
	t.Helper()
	withConn(t, dbURL, func(ctx context.Context, conn *pgx.Conn) {
		for _, q := range sql {
			if _, err := conn.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	})
}

// withConn runs fn on a new connection to dbURL, failing the test if it
// cannot connect.
func withConn(t testing.TB, dbURL string, fn func(context.Context, *pgx.Conn)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(ctx)
	fn(ctx, conn)
}

// SlotPosition returns the slot's confirmed_flush_lsn, or 0 when the slot
// does not exist.
func SlotPosition(t testing.TB, dbURL, slot string) pglogrepl.LSN {
	t.Helper()
	var lsn *pglogrepl.LSN
	QueryRow(t, dbURL, `SELECT (SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1)`, []any{slot}, &lsn)
	if lsn == nil {
		return 0
	}
	return *lsn
}

// CurrentWAL returns pg_current_wal_insert_lsn(): with synchronous_commit
// off, pg_current_wal_lsn() (the write position) can lag behind commits.
func CurrentWAL(t testing.TB, dbURL string) pglogrepl.LSN {
	t.Helper()
	var lsn pglogrepl.LSN
	QueryRow(t, dbURL, `SELECT pg_current_wal_insert_lsn()`, nil, &lsn)
	return lsn
}

// QueryRow runs one query and scans its row into dest.
func QueryRow(t testing.TB, dbURL, sql string, args []any, dest ...any) {
	t.Helper()
	withConn(t, dbURL, func(ctx context.Context, conn *pgx.Conn) {
		if err := conn.QueryRow(ctx, sql, args...).Scan(dest...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	})
}

// WaitForLock waits until a session waits for a lock on table (as SQL
// names it): a statement a test holds up behind another's lock has reached
// it.
func WaitForLock(t testing.TB, dbURL, table string) {
	t.Helper()
	Eventually(t, 30*time.Second, "a statement to wait for its lock on "+table, func() bool {
		var n int
		QueryRow(t, dbURL, `SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = $1::regclass`, []any{table}, &n)
		return n > 0
	})
}

// Main is the body of a TestMain for packages with integration tests: it
// starts Postgres, runs the tests, and stops it. A missing Postgres fails
// the run unless -short was given.
func Main(m *testing.M, pg **Postgres) {
	code := func() int {
		// Parse flags so that testing.Short works before m.Run.
		if !flag.Parsed() {
			flag.Parse()
		}
		if testing.Short() {
			fmt.Fprintln(os.Stderr, "testenv: -short: integration tests skipped")
			return m.Run()
		}
		p, err := PostgresFromEnvOrStart()
		if err != nil {
			fmt.Fprintln(os.Stderr, "testenv: integration tests need PostgreSQL:", err)
			return 1
		}
		defer p.Stop()
		*pg = p
		fmt.Fprintf(os.Stderr, "testenv: postgres via %s; kafka via %s\n", p.Via, kafkaVia())
		defer func() {
			if containerKafka.stop != nil {
				containerKafka.stop()
			}
		}()
		return m.Run()
	}()
	os.Exit(code)
}

// Require skips the test under -short, the one explicit opt-out, and
// otherwise returns the package's server.
func Require(t testing.TB, pg *Postgres) *Postgres {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test; run without -short")
	}
	if pg == nil {
		t.Fatal("no Postgres: testenv.Main did not start one")
	}
	t.Logf("postgres via %s; kafka via %s", pg.Via, kafkaVia())
	return pg
}

// CommitLSN returns the start LSN of the commit record of transaction xid,
// read from the WAL with pg_walinspect. Postgres re-sends a transaction
// whose commit record starts at or after the slot's confirmed_flush_lsn, so
// "not confirmed" means SlotPosition <= CommitLSN.
func CommitLSN(t testing.TB, dbURL string, xid string, from pglogrepl.LSN) pglogrepl.LSN {
	t.Helper()
	Exec(t, dbURL, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`)
	var lsn *pglogrepl.LSN
	Eventually(t, 30*time.Second, "the commit record of xid "+xid+" to be flushed", func() bool {
		// With synchronous_commit off the flush position can still be
		// behind from; pg_walinspect refuses a start in the future, and
		// fails while no whole record lies between from and the flush
		// position yet ("could not find a valid record after"): both
		// mean not yet.
		var err error
		withConn(t, dbURL, func(ctx context.Context, conn *pgx.Conn) {
			err = conn.QueryRow(ctx, `SELECT CASE WHEN pg_current_wal_flush_lsn() > $1::pg_lsn THEN
			(SELECT start_lsn FROM pg_get_wal_records_info($1::pg_lsn, pg_current_wal_flush_lsn())
			 WHERE xid::text = $2 AND resource_manager = 'Transaction' AND record_type = 'COMMIT') END`, from, xid).Scan(&lsn)
		})
		if err != nil && !strings.Contains(err.Error(), "could not find a valid record") {
			t.Fatalf("read the commit record of xid %s: %v", xid, err)
		}
		return err == nil && lsn != nil
	})
	return *lsn
}

// Pending reports whether the slot still holds a change whose pgoutput
// bytes contain needle (for example an event id): Postgres will send it
// again. Peeking does not consume anything. Only an inactive slot can be
// peeked at: a connector that stopped has closed its connection, but its
// walsender may take a moment to exit, so Pending waits for that first.
func Pending(t testing.TB, dbURL, slot, publication, needle string) bool {
	t.Helper()
	Eventually(t, 30*time.Second, "slot "+slot+" to be inactive", func() bool {
		var active bool
		QueryRow(t, dbURL, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, []any{slot}, &active)
		return !active
	})
	var n int
	QueryRow(t, dbURL, `SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
		'proto_version', '1', 'publication_names', $2) WHERE position(convert_to($3, 'UTF8') in data) > 0`,
		[]any{slot, publication, needle}, &n)
	return n > 0
}

var roleSeq atomic.Int64

// LeastPrivileged makes the role docker/init.sql makes, for table in db:
// it may log in and replicate and read the table (and, with stats, see
// other sessions' replication progress: pg_read_all_stats), and nothing
// else; the publication outbox_cdc is created by the table's owner. It
// returns db's URL as that role. Roles are the cluster's: each gets a name
// of its own, dropped when the test ends.
func LeastPrivileged(t testing.TB, db, table string, stats bool) string {
	t.Helper()
	role := fmt.Sprintf("cdc_lp_%d_%d", os.Getpid(), roleSeq.Add(1))
	sql := []string{
		"CREATE ROLE " + role + " WITH LOGIN REPLICATION PASSWORD 'cdc'",
		"GRANT SELECT ON " + table + " TO " + role,
		"CREATE PUBLICATION outbox_cdc FOR TABLE " + table + " WITH (publish = 'insert')",
	}
	if stats {
		sql = append(sql, "GRANT pg_read_all_stats TO "+role)
	}
	Exec(t, db, sql...)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if conn, err := pgx.Connect(ctx, db); err == nil {
			conn.Exec(ctx, "DROP OWNED BY "+role)
			conn.Exec(ctx, "DROP ROLE "+role)
			conn.Close(ctx)
		}
	})
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, "cdc")
	return u.String()
}
