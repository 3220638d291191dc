package testenv

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
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

	dir  string
	cred *syscall.SysProcAttr
}

// PostgresFromEnvOrStart returns the server named by CDC_TEST_POSTGRES_URL,
// or starts one with the given extra settings (name=value).
func PostgresFromEnvOrStart(settings ...string) (*Postgres, error) {
	if u := os.Getenv("CDC_TEST_POSTGRES_URL"); u != "" && len(settings) == 0 {
		return &Postgres{URL: u}, nil
	}
	return StartPostgres(settings...)
}

// FindBinaries returns the directory holding initdb and pg_ctl of the newest
// PostgreSQL (15 or later) on this machine.
func FindBinaries() (string, error) {
	var dirs []string
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		dirs = append(dirs, filepath.Dir(p))
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(found, func(i, j int) bool { return version(found[i]) > version(found[j]) })
	dirs = append(dirs, found...)
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err != nil {
			continue
		}
		out, err := exec.Command(filepath.Join(d, "pg_ctl"), "--version").Output()
		if err != nil {
			continue
		}
		m := regexp.MustCompile(`(\d+)\.`).FindStringSubmatch(string(out))
		if m == nil {
			continue
		}
		if v, _ := strconv.Atoi(m[1]); v >= 15 {
			return d, nil
		}
	}
	return "", fmt.Errorf("PostgreSQL 15+ server binaries (initdb, pg_ctl) not found on PATH or in /usr/lib/postgresql/*/bin; " +
		"install them (apt-get install postgresql) or point CDC_TEST_POSTGRES_URL at a server with wal_level=logical")
}

func version(dir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return v
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// StartPostgres runs initdb and pg_ctl start in a new temporary directory.
func StartPostgres(settings ...string) (*Postgres, error) {
	bin, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "cdc-pg-")
	if err != nil {
		return nil, err
	}
	p := &Postgres{Bin: bin, dir: dir}
	if os.Geteuid() == 0 {
		if p.cred, err = unprivileged(dir); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	if out, err := p.run("initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	opts := []string{
		"listen_addresses=127.0.0.1", "port=" + strconv.Itoa(port), "unix_socket_directories=" + dir,
		"wal_level=logical", "max_replication_slots=64", "max_wal_senders=64", "max_connections=200",
		"fsync=off", "synchronous_commit=off", "full_page_writes=off",
	}
	opts = append(opts, settings...)
	var conf strings.Builder
	for _, o := range opts {
		k, v, _ := strings.Cut(o, "=")
		fmt.Fprintf(&conf, "%s = '%s'\n", k, v)
	}
	if err := os.WriteFile(filepath.Join(data, "postgresql.auto.conf"), []byte(conf.String()), 0o600); err != nil {
		return nil, err
	}
	if p.cred != nil {
		uid, gid := p.cred.Credential.Uid, p.cred.Credential.Gid
		os.Chown(filepath.Join(data, "postgresql.auto.conf"), int(uid), int(gid))
	}
	logFile := filepath.Join(dir, "postgres.log")
	if out, err := p.run("pg_ctl", "start", "-w", "-t", "60", "-D", data, "-l", logFile); err != nil {
		log, _ := os.ReadFile(logFile)
		p.Stop()
		return nil, fmt.Errorf("pg_ctl start: %v\n%s\n%s", err, out, log)
	}
	p.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	return p, nil
}

// unprivileged returns process attributes for the postgres user (or
// nobody) and hands dir to it.
func unprivileged(dir string) (*syscall.SysProcAttr, error) {
	var u *user.User
	var err error
	for _, name := range []string{"postgres", "nobody"} {
		if u, err = user.Lookup(name); err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("running as root and neither a postgres nor a nobody user exists to run Postgres as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return nil, err
	}
	return &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}, nil
}

func (p *Postgres) run(name string, args ...string) ([]byte, error) {
	cmd := exec.Command(filepath.Join(p.Bin, name), args...)
	cmd.Dir = p.dir
	cmd.SysProcAttr = p.cred
	cmd.Env = append(os.Environ(), "LC_ALL=C", "HOME="+p.dir)
	return cmd.CombinedOutput()
}

// Stop stops a server this package started and removes its files.
func (p *Postgres) Stop() {
	if p.dir == "" {
		return
	}
	p.run("pg_ctl", "stop", "-m", "immediate", "-w", "-D", filepath.Join(p.dir, "data"))
	os.RemoveAll(p.dir)
}

var dbSeq atomic.Int64

// NewDatabase creates an empty database and returns a superuser URL for
// it. Cleanup drops its replication slots and the database.
func (p *Postgres) NewDatabase(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("cdc_test_%d_%d", os.Getpid(), dbSeq.Add(1))
	p.Exec(t, p.URL, "CREATE DATABASE "+name)
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
func (p *Postgres) Exec(t testing.TB, dbURL string, sql ...string) {
	t.Helper()
	Exec(t, dbURL, sql...)
}

// Exec runs SQL statements on url, failing the test on error.
func Exec(t testing.TB, dbURL string, sql ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(ctx)
	for _, s := range sql {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
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
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(ctx)
	if err := conn.QueryRow(ctx, sql, args...).Scan(dest...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// Main is the body of a TestMain for packages with integration tests: it
// starts Postgres, runs the tests, and stops it. A missing Postgres fails
// the run unless -short was given.
func Main(m *testing.M, pg **Postgres) {
	code := func() int {
		// Parse flags so that testing.Short works before m.Run.
		if !flagParsed() {
			parseFlags()
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
		// behind from; pg_walinspect refuses a start in the future.
		QueryRow(t, dbURL, `SELECT CASE WHEN pg_current_wal_flush_lsn() > $1::pg_lsn THEN
			(SELECT start_lsn FROM pg_get_wal_records_info($1::pg_lsn, pg_current_wal_flush_lsn())
			 WHERE xid::text = $2 AND resource_manager = 'Transaction' AND record_type = 'COMMIT') END`, []any{from, xid}, &lsn)
		return lsn != nil
	})
	return *lsn
}

// Pending reports whether the slot still holds a change whose pgoutput
// bytes contain needle (for example an event id): Postgres will send it
// again. The slot must be inactive; peeking does not consume anything.
func Pending(t testing.TB, dbURL, slot, publication, needle string) bool {
	t.Helper()
	var n int
	QueryRow(t, dbURL, `SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
		'proto_version', '1', 'publication_names', $2) WHERE position(convert_to($3, 'UTF8') in data) > 0`,
		[]any{slot, publication, needle}, &n)
	return n > 0
}
