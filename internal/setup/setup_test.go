package setup_test

import (
	"context"
	"errors"
	"fmt"
	neturl "net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/setup"
	"github.com/outboxcdc/cdc/internal/testenv"
	"github.com/outboxcdc/cdc/internal/wal"
)

var pg *testenv.Postgres

func TestMain(m *testing.M) { testenv.Main(m, &pg) }

const outboxDDL = `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
	aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`

var defaultTable = []setup.Table{{TableName: outbox.TableName{Schema: "public", Name: "outbox"}, Columns: []string{"id", "aggregatetype", "aggregateid", "type", "payload"}}}

func cfg(url string) postgres.Config {
	c := postgres.Config{URL: url}
	if err := c.Validate(); err != nil {
		panic(err)
	}
	return c
}

func prepare(t *testing.T, url string, tables []setup.Table, create bool) (setup.SlotState, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, _, err := setup.Prepare(ctx, cfg(url), tables, hclog.NewNullLogger())
	if err != nil || st.Exists || !create {
		return st, err
	}
	c, err := wal.Connect(ctx, cfg(url), hclog.NewNullLogger())
	if err != nil {
		return st, err
	}
	defer c.Close(ctx)
	lsn, err := c.CreateSlot(ctx, "outbox_cdc")
	return setup.SlotState{Exists: true, ConfirmedFlush: lsn}, err
}

func wantFatal(t *testing.T, err error, want string) {
	t.Helper()
	var se *errtext.Fatal
	if !errors.As(err, &se) || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v; want a *errtext.Fatal saying %q", err, want)
	}
}

func TestSetupCreatesThenReuses(t *testing.T) {
	db := testenv.Require(t, pg).NewDatabase(t)
	testenv.Exec(t, db, outboxDDL)
	st, err := prepare(t, db, defaultTable, true)
	if err != nil || !st.Exists || st.ConfirmedFlush == 0 {
		t.Fatalf("first Setup = %+v, %v; want a created slot", st, err)
	}
	var pubInsert, pubUpdate bool
	testenv.QueryRow(t, db, `SELECT pubinsert, pubupdate FROM pg_publication WHERE pubname = 'outbox_cdc'`, nil, &pubInsert, &pubUpdate)
	if !pubInsert || pubUpdate {
		t.Fatalf("publication publishes insert=%v update=%v; want inserts only", pubInsert, pubUpdate)
	}
	st2, err := prepare(t, db, defaultTable, false)
	if err != nil || !st2.Exists || st2.ConfirmedFlush != st.ConfirmedFlush {
		t.Fatalf("second Setup = %+v, %v; want the existing slot at %s", st2, err, st.ConfirmedFlush)
	}
}

func TestSetupPreconditions(t *testing.T) {
	p := testenv.Require(t, pg)
	tests := []struct {
		name   string
		sql    []string
		tables []setup.Table
		user   string // connect as this role instead of the superuser
		want   string
	}{
		{name: "missing table", want: "outbox table public.outbox does not exist"},
		{name: "missing mapped column", sql: []string{`CREATE TABLE outbox (id uuid, aggregatetype text, aggregateid text, type text)`},
			want: "has no column payload"},
		{name: "quoted names", sql: []string{`CREATE SCHEMA tenant`, `CREATE TABLE tenant."OutboxEvent" (id text, "aggregateType" text)`},
			tables: []setup.Table{{TableName: outbox.TableName{Schema: "tenant", Name: "OutboxEvent"}, Columns: []string{"id", "aggregateType", "aggregateId", "t", "p"}}},
			want:   `tenant."OutboxEvent" has no column "aggregateId"`},
		{name: "role without REPLICATION", sql: []string{outboxDDL, `CREATE ROLE app_user LOGIN PASSWORD 'app'`, `GRANT SELECT ON outbox TO app_user`},
			user: "app_user", want: "role app_user lacks the REPLICATION attribute; as a superuser run: ALTER ROLE app_user WITH REPLICATION"},
		{name: "partitioned table, a publication the role does not own", sql: []string{partitionedDDL, `CREATE ROLE pub_owner`,
			`CREATE PUBLICATION outbox_cdc FOR TABLE outbox WITH (publish = 'insert')`, `ALTER PUBLICATION outbox_cdc OWNER TO pub_owner`,
			`CREATE ROLE lp LOGIN REPLICATION`, `GRANT SELECT ON outbox TO lp`},
			user: "lp", want: "publication outbox_cdc publishes partitioned outbox table public.outbox under its leaf partitions' names (publish_via_partition_root is off); as the publication's owner run: ALTER PUBLICATION outbox_cdc SET (publish_via_partition_root = true)"},
		{name: "publication without inserts", sql: []string{outboxDDL, `CREATE PUBLICATION outbox_cdc FOR TABLE outbox WITH (publish = 'update')`},
			want: "does not publish inserts"},
		{name: "slot with another plugin", sql: []string{outboxDDL, `SELECT pg_create_logical_replication_slot('outbox_cdc', 'test_decoding')`},
			want: `plugin "test_decoding", not pgoutput`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db := p.NewDatabase(t)
			testenv.Exec(t, db, tt.sql...)
			url := db
			if tt.user != "" {
				u, err := neturl.Parse(db)
				if err != nil {
					t.Fatal(err)
				}
				u.User = neturl.UserPassword(tt.user, "app") // trust auth ignores it; containers check it
				url = u.String()
			}
			tables := tt.tables
			if tables == nil {
				tables = defaultTable
			}
			_, err := prepare(t, url, tables, true)
			wantFatal(t, err, tt.want)
		})
	}
}

// partitionedDDL is the outbox table partitioned by range, one partition
// of which is partitioned again.
const partitionedDDL = `CREATE TABLE outbox (id uuid NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), aggregatetype text, aggregateid text, type text, payload jsonb,
	PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at);
CREATE TABLE outbox_a PARTITION OF outbox FOR VALUES FROM ('2026-01-01') TO ('2026-02-01') PARTITION BY HASH (id);
CREATE TABLE outbox_a0 PARTITION OF outbox_a FOR VALUES WITH (MODULUS 1, REMAINDER 0);`

// TestSetupPublication: the publication Setup creates publishes inserts
// only, and a partitioned table's rows under its own name; an existing
// one the role owns is made to (publish_via_partition_root); a table
// missing from it is reported in the catalog, for the pipeline to decide
// against its checkpoint, never added or refused here.
func TestSetupPublication(t *testing.T) {
	p := testenv.Require(t, pg)
	ctx := context.Background()
	read := func(t *testing.T, db string) (viaRoot bool) {
		testenv.QueryRow(t, db, `SELECT pubviaroot FROM pg_publication WHERE pubname = 'outbox_cdc'`, nil, &viaRoot)
		return viaRoot
	}
	t.Run("created", func(t *testing.T) {
		db := p.NewDatabase(t)
		testenv.Exec(t, db, partitionedDDL)
		_, cat, err := setup.Prepare(ctx, cfg(db), defaultTable, hclog.NewNullLogger())
		if err != nil || !read(t, db) {
			t.Fatalf("Setup: %v; via root %v, want a publication with publish_via_partition_root", err, read(t, db))
		}
		if st := cat.Tables[0]; !st.Partitioned || !st.Published || !strings.HasPrefix(st.Member, "rel:") || st.OID == 0 {
			t.Fatalf("catalog %+v: want the partitioned table published", st)
		}
	})
	t.Run("owned, made to publish via the root", func(t *testing.T) {
		db := p.NewDatabase(t)
		testenv.Exec(t, db, partitionedDDL, `CREATE PUBLICATION outbox_cdc FOR TABLE outbox WITH (publish = 'insert')`)
		if _, _, err := setup.Prepare(ctx, cfg(db), defaultTable, hclog.NewNullLogger()); err != nil || !read(t, db) {
			t.Fatalf("Setup: %v; via root %v", err, read(t, db))
		}
	})
	t.Run("a table missing is reported", func(t *testing.T) {
		db := p.NewDatabase(t)
		testenv.Exec(t, db, outboxDDL, `CREATE TABLE other (id int)`, `CREATE PUBLICATION outbox_cdc FOR TABLE other`)
		_, cat, err := setup.Prepare(ctx, cfg(db), defaultTable, hclog.NewNullLogger())
		if err != nil {
			t.Fatal(err)
		}
		if st := cat.Tables[0]; st.Published || st.OID == 0 || !st.Owned || !cat.Publication.Owned {
			t.Fatalf("catalog %+v, publication %+v: want the table unpublished, both owned", st, cat.Publication)
		}
		var n int
		testenv.QueryRow(t, db, `SELECT count(*) FROM pg_publication_tables WHERE tablename = 'outbox'`, nil, &n)
		if n != 0 {
			t.Fatal("Setup added the table itself")
		}
	})
	t.Run("for all tables", func(t *testing.T) {
		db := p.NewDatabase(t)
		testenv.Exec(t, db, outboxDDL, `CREATE PUBLICATION outbox_cdc FOR ALL TABLES WITH (publish = 'insert')`)
		_, cat, err := setup.Prepare(ctx, cfg(db), defaultTable, hclog.NewNullLogger())
		if st := cat.Tables[0]; err != nil || !st.Published || !strings.HasPrefix(st.Member, "all:") {
			t.Fatalf("Setup: %v; catalog %+v: want the table published, FOR ALL TABLES", err, st)
		}
	})
}

// TestSetupNeverCreatesTheSlot: a missing slot is reported, not created;
// the pipeline decides against its checkpoint.
func TestSetupNeverCreatesTheSlot(t *testing.T) {
	db := testenv.Require(t, pg).NewDatabase(t)
	testenv.Exec(t, db, outboxDDL)
	st, err := prepare(t, db, defaultTable, false)
	if err != nil || st.Exists {
		t.Fatalf("Setup = %+v, %v; want a missing slot and no error", st, err)
	}
	var n int
	testenv.QueryRow(t, db, `SELECT count(*) FROM pg_replication_slots`, nil, &n)
	if n != 0 {
		t.Fatalf("Setup created %d slots", n)
	}
}

// TestConnSlots: IDENTIFY_SYSTEM, a temporary copy that goes with its
// connection, and advancing a copy.
func TestConnSlots(t *testing.T) {
	db := testenv.Require(t, pg).NewDatabase(t)
	testenv.Exec(t, db, outboxDDL)
	st, err := prepare(t, db, defaultTable, true)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var sysid string
	testenv.QueryRow(t, db, `SELECT system_identifier::text FROM pg_control_system()`, nil, &sysid)
	c, err := wal.Connect(ctx, cfg(db), hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	if c.System().ID != sysid || c.System().Timeline != 1 || c.System().WALEnd < st.ConfirmedFlush {
		t.Fatalf("System() = %+v; want id %s, timeline 1, WAL end past %s", c.System(), sysid, st.ConfirmedFlush)
	}
	testenv.Exec(t, db, `INSERT INTO outbox (aggregatetype, aggregateid, type) VALUES ('a', 'b', 'c')`)
	end := testenv.CurrentWAL(t, db)
	at, err := c.CopySlot(ctx, "outbox_cdc", "outbox_cdc_tmp", true)
	if err != nil || at != st.ConfirmedFlush {
		t.Fatalf("CopySlot = %s, %v; want the source's %s", at, err, st.ConfirmedFlush)
	}
	// Postgres advances up to what is flushed: with synchronous_commit
	// off the insert needs a moment to get there.
	testenv.Eventually(t, time.Minute, "the insert to be flushed", func() bool {
		var flushed pglogrepl.LSN
		testenv.QueryRow(t, db, `SELECT pg_current_wal_flush_lsn()`, nil, &flushed)
		return flushed >= end
	})
	if to, err := c.AdvanceSlot(ctx, "outbox_cdc_tmp", end); err != nil || to <= st.ConfirmedFlush || to > end {
		t.Fatalf("AdvanceSlot = %s, %v; want past %s and at most %s", to, err, st.ConfirmedFlush, end)
	}
	if got := testenv.SlotPosition(t, db, "outbox_cdc"); got != st.ConfirmedFlush {
		t.Fatalf("the source moved to %s", got)
	}
	c.Close(ctx)
	testenv.Eventually(t, time.Minute, "the temporary copy to go with its connection", func() bool {
		return testenv.SlotPosition(t, db, "outbox_cdc_tmp") == 0
	})
}

func TestWalLevelReplica(t *testing.T) {
	testenv.Require(t, pg)
	other, err := testenv.StartPostgres("wal_level=replica")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Stop) // after the database cleanup NewDatabase registers
	db := other.NewDatabase(t)
	_, err = prepare(t, db, defaultTable, true)
	wantFatal(t, err, "wal_level is replica; set wal_level = logical in postgresql.conf (or run ALTER SYSTEM SET wal_level = logical) and restart Postgres")
}

// TestSlotLost makes Postgres remove WAL a slot still needs, the way
// max_slot_wal_keep_size does in production, and expects a fatal error.
func TestSlotLost(t *testing.T) {
	testenv.Require(t, pg)
	other, err := testenv.StartPostgres("max_slot_wal_keep_size=1MB")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Stop) // after the database cleanup NewDatabase registers
	db := other.NewDatabase(t)
	testenv.Exec(t, db, outboxDDL)
	if _, err := prepare(t, db, defaultTable, true); err != nil {
		t.Fatal(err)
	}
	// Write and switch WAL segments until a checkpoint removes the one
	// the slot needs.
	testenv.Eventually(t, time.Minute, "the slot to be lost", func() bool {
		testenv.Exec(t, db, `INSERT INTO outbox (aggregatetype, aggregateid, type) VALUES ('a', 'b', 'c')`, `SELECT pg_switch_wal()`, `CHECKPOINT`)
		var status string
		testenv.QueryRow(t, db, `SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'outbox_cdc'`, nil, &status)
		return status == "lost"
	})
	_, err = prepare(t, db, defaultTable, true)
	wantFatal(t, err, "is lost")
	if !errors.Is(err, postgres.ErrSlotLost) {
		t.Fatalf("err = %v; want ErrSlotLost", err)
	}
}

// TestSlotInUse: a second stream on a held slot gets a SlotInUseError,
// which the pipeline retries.
func TestSlotInUse(t *testing.T) {
	db := testenv.Require(t, pg).NewDatabase(t)
	testenv.Exec(t, db, outboxDDL)
	st, err := prepare(t, db, defaultTable, true)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	first, err := wal.Open(ctx, cfg(db), st.ConfirmedFlush, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close(ctx, fixedAcks(st.ConfirmedFlush))
	_, err = wal.Open(ctx, cfg(db), st.ConfirmedFlush, hclog.NewNullLogger())
	var inUse *postgres.SlotInUseError
	if !errors.As(err, &inUse) || !strings.Contains(err.Error(), "is active for PID") {
		t.Fatalf("err = %v; want a SlotInUseError", err)
	}
}

type fixedAcks pglogrepl.LSN

func (a fixedAcks) Confirmed() pglogrepl.LSN         { return pglogrepl.LSN(a) }
func (fixedAcks) Owed() bool                         { return false }
func (fixedAcks) Keepalive(pglogrepl.LSN, time.Time) {}
func (fixedAcks) Saturated() bool                    { return false }
func (fixedAcks) Err() error                         { return nil }
func (fixedAcks) Changed() <-chan struct{}           { return nil }

// TestCheckListsEveryProblem: check reports everything a least-privileged
// role would trip on, each with its fix, not only the first: no
// REPLICATION, no SELECT, a publication it may not create, a missing table,
// and too few free slots for the slot and the replay window's.
func TestCheckListsEveryProblem(t *testing.T) {
	testenv.Require(t, pg)
	srv, err := testenv.StartPostgres("max_replication_slots=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	db := srv.NewDatabase(t)
	testenv.Exec(t, db, outboxDDL,
		`CREATE ROLE cdc_weak LOGIN`,
		`SELECT pg_create_logical_replication_slot('other_a', 'pgoutput')`)
	u, err := neturl.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	u.User = neturl.User("cdc_weak")
	tables := append(slices.Clone(defaultTable), setup.Table{TableName: outbox.TableName{Schema: "public", Name: "missing"}, Columns: []string{"id"}})
	_, err = setup.Check(context.Background(), cfg(u.String()), tables, "outbox_cdc_replay")
	var ce *setup.CheckError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v; want a CheckError", err)
	}
	for _, want := range []string{
		`role cdc_weak lacks the REPLICATION attribute; as a superuser run: ALTER ROLE cdc_weak WITH REPLICATION`,
		`outbox table public.missing does not exist`,
		`role cdc_weak may not SELECT from outbox table public.outbox; as its owner run: GRANT SELECT ON public.outbox TO cdc_weak`,
		`publication outbox_cdc does not exist, and role cdc_weak may not create it (it lacks CREATE on the database, it does not own public.outbox)`,
		`2 replication slot(s) to create (outbox_cdc, outbox_cdc_replay) and 1 free: raise max_replication_slots`,
	} {
		found := false
		for _, p := range ce.Problems {
			found = found || strings.Contains(p, want)
		}
		if !found {
			t.Errorf("no problem says %q; got:\n%s", want, strings.Join(ce.Problems, "\n"))
		}
	}
	if len(ce.Problems) != 5 {
		t.Errorf("%d problems, want 5:\n%s", len(ce.Problems), strings.Join(ce.Problems, "\n"))
	}

	// The same role, once granted what it lacked, passes.
	testenv.Exec(t, db, `ALTER ROLE cdc_weak REPLICATION`, `GRANT SELECT ON outbox TO cdc_weak`, `ALTER TABLE outbox OWNER TO cdc_weak`,
		`DO $$ BEGIN EXECUTE format('GRANT CREATE ON DATABASE %I TO cdc_weak', current_database()); END $$`,
		`SELECT pg_drop_replication_slot('other_a')`)
	if _, err := setup.Check(context.Background(), cfg(u.String()), defaultTable, "outbox_cdc_replay"); err != nil {
		t.Fatalf("after the grants: %v", err)
	}
}

// TestCheckPublication: check reports what would keep cdc run from
// carrying every insert, each with the statement that fixes it: a
// partitioned table published under its leaves' names and a table missing
// from a publication the role does not own. What cdc run would fix itself
// (a publication it owns) is no problem.
func TestCheckPublication(t *testing.T) {
	db := testenv.Require(t, pg).NewDatabase(t)
	testenv.Exec(t, db, partitionedDDL, `CREATE TABLE plain (id text, aggregatetype text, aggregateid text, type text, payload jsonb)`,
		`CREATE PUBLICATION outbox_cdc FOR TABLE outbox WITH (publish = 'insert')`)
	tables := append(slices.Clone(defaultTable), setup.Table{TableName: outbox.TableName{Schema: "public", Name: "plain"}, Columns: []string{"id"}})
	if _, err := setup.Check(context.Background(), cfg(db), tables); err != nil {
		t.Fatalf("a publication the role owns, which cdc run fixes: %v", err)
	}
	role := fmt.Sprintf("cdc_check_%d", time.Now().UnixNano())
	testenv.Exec(t, db, `CREATE ROLE `+role+` LOGIN REPLICATION`, `GRANT SELECT ON outbox, plain TO `+role)
	u, err := neturl.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	u.User = neturl.User(role)
	_, err = setup.Check(context.Background(), cfg(u.String()), tables)
	var ce *setup.CheckError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v; want a CheckError", err)
	}
	for _, want := range []string{
		`as the publication's owner run: ALTER PUBLICATION outbox_cdc SET (publish_via_partition_root = true)`,
		`publication outbox_cdc does not include outbox table public.plain`,
		`ALTER PUBLICATION outbox_cdc ADD TABLE ONLY public.plain; GRANT SELECT ON public.plain TO ` + role,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("no problem says %q; got:\n%s", want, strings.Join(ce.Problems, "\n"))
		}
	}
}
