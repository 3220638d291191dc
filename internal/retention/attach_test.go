package retention

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestAttachedRowsNeverDeleted is a generator of the partition's life
// around retention: random sequences of tables attached with rows (plain,
// or partitioned themselves), partitions created in the table, streamed
// inserts, partitions detached, written to and attached again, and the
// migrations that rewrite leaves (ALTER TABLE ... TYPE, a volatile
// default, VACUUM FULL; ALTER TABLE ... TYPE in a savepoint followed by
// a column) or only touch the catalog (a plain column), with sweeps after
// marks Kafka acknowledged. No row that was never streamed is ever
// deleted; and the streamed rows of a partition created in the table and
// never out of it do go, or the test would prove nothing.
// CDC_RETENTION_SEED replays one sequence.
func TestAttachedRowsNeverDeleted(t *testing.T) {
	seeds := []uint64{uint64(time.Now().UnixNano()), 1, 2}
	if s, err := strconv.ParseUint(os.Getenv("CDC_RETENTION_SEED"), 10, 64); err == nil {
		seeds = []uint64{s}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { attachedLife(t, seed, 40) })
	}
}

func attachedLife(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, seed))
	tb := newTable(t, time.Minute, outbox.RetentionDelete, `CREATE TABLE outbox (id uuid NOT NULL DEFAULT gen_random_uuid(), created_at timestamptz NOT NULL,
		aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb, PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)`)
	type part struct {
		name string
		year int
		// clean: created in the table and never out of it, so every row
		// was streamed, and retention must delete them, rewrites or not.
		clean bool
	}
	var parts []*part // the table's partitions, each a year's range
	insert := func(into string, year, n int, kind string) {
		testenv.Exec(t, tb.db, fmt.Sprintf(`INSERT INTO %s (created_at, aggregatetype, aggregateid, type) SELECT '%d-03-01', 'order', '%s', 'E' FROM generate_series(1, %d)`, into, year, kind, n))
	}
	attach := func(p *part) {
		testenv.Exec(t, tb.db, fmt.Sprintf(`ALTER TABLE outbox ATTACH PARTITION %s FOR VALUES FROM ('%d-01-01') TO ('%d-01-01')`, p.name, p.year, p.year+1))
	}
	unsent, rewrites := 0, 0
	for step := 0; step < steps; step++ {
		var did string
		switch k := rng.IntN(10); {
		case k == 0 || len(parts) == 0: // a table with rows attached
			p := &part{name: fmt.Sprintf("outbox_%d", step), year: 2000 + step}
			if rng.IntN(2) == 0 {
				testenv.Exec(t, tb.db, fmt.Sprintf(`CREATE TABLE %s (LIKE outbox INCLUDING DEFAULTS)`, p.name))
			} else {
				testenv.Exec(t, tb.db, fmt.Sprintf(`CREATE TABLE %s (LIKE outbox INCLUDING DEFAULTS) PARTITION BY RANGE (created_at)`, p.name),
					fmt.Sprintf(`CREATE TABLE %s_a PARTITION OF %s FOR VALUES FROM ('%d-01-01') TO ('%d-01-01')`, p.name, p.name, p.year, p.year+1))
			}
			insert(p.name, p.year, 5, "unsent")
			unsent += 5
			attach(p)
			parts = append(parts, p)
			did = "attached with rows " + p.name
		case k == 1: // a partition created in the table
			p := &part{name: fmt.Sprintf("outbox_%d", step), year: 2000 + step, clean: true}
			testenv.Exec(t, tb.db, fmt.Sprintf(`CREATE TABLE %s PARTITION OF outbox FOR VALUES FROM ('%d-01-01') TO ('%d-01-01')`, p.name, p.year, p.year+1))
			parts = append(parts, p)
			did = "created " + p.name
		case k == 8: // created and filled in one transaction: every row streamed
			p := &part{name: fmt.Sprintf("outbox_%d", step), year: 2000 + step, clean: true}
			into := []string{"outbox", p.name}[rng.IntN(2)]
			testenv.Exec(t, tb.db, fmt.Sprintf(`BEGIN; CREATE TABLE %s PARTITION OF outbox FOR VALUES FROM ('%d-01-01') TO ('%d-01-01');
				INSERT INTO %s (created_at, aggregatetype, aggregateid, type) SELECT '%d-03-01', 'order', 'streamed', 'E' FROM generate_series(1, 4); COMMIT`,
				p.name, p.year, p.year+1, into, p.year))
			parts = append(parts, p)
			did = "created and filled in one transaction " + p.name + " (through " + into + ")"
		case k == 9: // created, filled and attached in one transaction: none streamed
			p := &part{name: fmt.Sprintf("outbox_%d", step), year: 2000 + step}
			fill := fmt.Sprintf(`INSERT INTO %s (created_at, aggregatetype, aggregateid, type) SELECT '%d-03-01', 'order', 'unsent', 'E' FROM generate_series(1, 5)`, p.name, p.year)
			did = "created, filled and attached in one transaction " + p.name
			if rng.IntN(2) == 0 { // the rows get a savepoint's xid, above the attach's
				fill = "SAVEPOINT s; " + fill + "; RELEASE s"
				did += ", filled in a savepoint"
			}
			testenv.Exec(t, tb.db, fmt.Sprintf(`BEGIN; CREATE TABLE %s (LIKE outbox INCLUDING DEFAULTS); %s;
				ALTER TABLE outbox ATTACH PARTITION %s FOR VALUES FROM ('%d-01-01') TO ('%d-01-01'); COMMIT`, p.name, fill, p.name, p.year, p.year+1))
			unsent += 5
			parts = append(parts, p)
		case k == 2:
			to := []string{"varchar(200)", "text"}[rewrites%2]
			rewrites++
			alter := fmt.Sprintf(`ALTER TABLE outbox ALTER COLUMN type TYPE %s USING type::%s`, to, to)
			did = "alter type " + to
			if rng.IntN(2) == 0 { // in a subtransaction: pg_class ends with its parent's older xid
				alter = fmt.Sprintf(`BEGIN; SAVEPOINT s; %s; RELEASE s; ALTER TABLE outbox ADD COLUMN c%d text; COMMIT`, alter, step)
				did += " in a savepoint, then a column"
			}
			testenv.Exec(t, tb.db, alter)
		case k == 3:
			testenv.Exec(t, tb.db, fmt.Sprintf(`ALTER TABLE outbox ADD COLUMN c%d timestamptz DEFAULT clock_timestamp()`, step))
			did = "volatile default"
		case k == 4:
			testenv.Exec(t, tb.db, fmt.Sprintf(`ALTER TABLE outbox ADD COLUMN c%d text`, step))
			did = "plain column"
		case k == 5:
			var leaf string
			testenv.QueryRow(t, tb.db, `SELECT relid::regclass::text FROM pg_partition_tree('outbox') WHERE isleaf ORDER BY random() LIMIT 1`, nil, &leaf)
			testenv.Exec(t, tb.db, `VACUUM FULL `+leaf)
			did = "vacuum full " + leaf
		case k == 6: // out of the table, written to, and back
			p := parts[rng.IntN(len(parts))]
			testenv.Exec(t, tb.db, `ALTER TABLE outbox DETACH PARTITION `+p.name)
			p.clean = false
			insert(p.name, p.year, 3, "unsent")
			unsent += 3
			attach(p)
			did = "detached, written to and attached again " + p.name
		default:
			p := parts[rng.IntN(len(parts))]
			insert("outbox", p.year, 4, "streamed")
			did = "streamed into " + p.name
		}
		t.Logf("step %d: %s", step, did)
		if k := rng.IntN(3); k == 0 {
			tb.sweep(t)
			tb.ack(t)
			tb.now = tb.now.Add(2 * time.Minute)
			tb.sweep(t)
		}
		if n := tb.count(t, "outbox", "aggregateid = 'unsent'"); n != unsent {
			t.Fatalf("seed %d, step %d (%s): %d of the %d rows never streamed left", seed, step, did, n, unsent)
		}
	}
	tb.sweep(t)
	tb.ack(t)
	tb.now = tb.now.Add(2 * time.Minute)
	tb.sweep(t)
	if n := tb.count(t, "outbox", "aggregateid = 'unsent'"); n != unsent {
		t.Fatalf("seed %d, at the end: %d of the %d rows never streamed left", seed, n, unsent)
	}
	for _, p := range parts {
		if n := tb.count(t, p.name, "aggregateid = 'streamed'"); p.clean && n > 0 {
			t.Errorf("seed %d: %d streamed rows left in %s, a partition created in the table and never out of it", seed, n, p.name)
		}
	}
}

// TestPartitionCreatedAndFilledInOneTransaction (issue 55): the rows a
// partition's creating transaction wrote into it were streamed, and go;
// those a transaction wrote into a table before attaching it were not,
// in a savepoint too (its xid is above the attach's), and stay; those it
// wrote after the ATTACH were, and go.
func TestPartitionCreatedAndFilledInOneTransaction(t *testing.T) {
	tb := newTable(t, time.Minute, outbox.RetentionDelete, `CREATE TABLE outbox (id uuid NOT NULL DEFAULT gen_random_uuid(), created_at timestamptz NOT NULL,
		aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb, PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)`)
	insert := func(into, year string, n int, kind string) string {
		return fmt.Sprintf(`INSERT INTO %s (created_at, aggregatetype, aggregateid, type) SELECT '%s-03-01', 'order', '%s', 'E' FROM generate_series(1, %d)`, into, year, kind, n)
	}
	testenv.Exec(t, tb.db, `BEGIN; CREATE TABLE outbox_2001 PARTITION OF outbox FOR VALUES FROM ('2001-01-01') TO ('2002-01-01'); `+
		insert("outbox", "2001", 3, "streamed")+`; `+insert("outbox_2001", "2001", 2, "streamed")+`; COMMIT`)
	testenv.Exec(t, tb.db, `BEGIN; CREATE TABLE outbox_2002 (LIKE outbox INCLUDING DEFAULTS); `+insert("outbox_2002", "2002", 2, "unsent")+`;
		SAVEPOINT s; `+insert("outbox_2002", "2002", 3, "unsent")+`; RELEASE s;
		ALTER TABLE outbox ATTACH PARTITION outbox_2002 FOR VALUES FROM ('2002-01-01') TO ('2003-01-01'); `+insert("outbox_2002", "2002", 2, "streamed")+`; COMMIT`)
	tb.sweep(t) // sees the attach: every xid of its transaction is below what it reads next
	testenv.Exec(t, tb.db, insert("outbox", "2002", 4, "streamed"))
	for range 2 { // a mark above the last rows, then a sweep with it
		tb.ack(t)
		tb.now = tb.now.Add(2 * time.Minute)
		tb.sweep(t)
	}
	if n := tb.count(t, "outbox", "aggregateid = 'unsent'"); n != 5 {
		t.Errorf("%d of the 5 rows written before the attach left; want all", n)
	}
	for _, p := range []string{"outbox_2001", "outbox_2002"} {
		if n := tb.count(t, p, "aggregateid = 'streamed'"); n != 0 {
			t.Errorf("%d streamed rows left in %s; want none", n, p)
		}
	}
}
