package setup

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pgident"
	"github.com/outboxcdc/cdc/internal/postgres"
)

// Table is an outbox table the slot streams: its name as the catalog stores
// it (unquoted; String quotes it for SQL), and the columns the decoder
// reads from it.
type Table struct {
	outbox.TableName
	Columns []string
	// Fields names, for each of Columns, the config's field it maps
	// (aggregate_type, ...), or "" for another column the config reads:
	// for the columns: block a missing column's error suggests.
	Fields []string
}

// SlotState is what Prepare found of a slot.
type SlotState struct {
	Exists bool
	// ConfirmedFlush is the slot's confirmed_flush_lsn: where streaming
	// resumes. RestartLSN is the oldest WAL it retains.
	ConfirmedFlush pglogrepl.LSN
	RestartLSN     pglogrepl.LSN
	// Active is true while a walsender streams it, ActivePID that process.
	Active    bool
	ActivePID int
	// WALStatus is pg_replication_slots.wal_status: reserved, extended,
	// unreserved or lost.
	WALStatus string
	// SafeWALSize is how much more WAL can be written before the slot is
	// lost (max_slot_wal_keep_size); nil when unlimited.
	SafeWALSize *int64
	// WALEnd is the server's current WAL position (pg_current_wal_lsn), read
	// with the slot; on a hot standby, what it has replayed
	// (pg_last_wal_replay_lsn).
	WALEnd pglogrepl.LSN
	// Standby is true when the slot is on a hot standby (PostgreSQL 16+).
	Standby bool
	// Conflicting is true when Postgres invalidated the slot on a standby
	// because the primary removed rows it needed (PostgreSQL 16+).
	Conflicting bool
	// Invalidated is why Postgres invalidated the slot
	// (postgres.InvalidationReason: invalidation_reason on PostgreSQL
	// 17+, what older servers show before), "" while it has not.
	Invalidated string
}

// Lost is why Postgres invalidated the slot, nil while it has not.
func (s SlotState) Lost() *postgres.SlotLost {
	if s.Invalidated == "" {
		return nil
	}
	return postgres.LostBecause(s.Invalidated)
}

// Lag is how far the confirmed position is behind the server's WAL.
func (s SlotState) Lag() int64 { return int64(s.WALEnd) - int64(s.ConfirmedFlush) }

// Retained is the WAL the slot keeps on the server's disk.
func (s SlotState) Retained() int64 {
	if s.RestartLSN == 0 {
		return 0
	}
	return int64(s.WALEnd) - int64(s.RestartLSN)
}

// Prepare checks every precondition of streaming the tables, creates the
// publication when it is missing (or makes it fit, where the role owns it:
// ensurePublication), and reports on cfg.Slot and on the catalog. It never
// creates a slot: the pipeline decides that against its checkpoint. Every
// failure a user must fix is a *errtext.Fatal that says how; a lost slot is
// one. Logical decoding message sources need no table: cfg.Messages covers
// them.
func Prepare(ctx context.Context, cfg postgres.Config, tables []Table, log hclog.Logger) (SlotState, Catalog, error) {
	conn, err := postgres.ConnectSQL(ctx, cfg)
	if err != nil {
		return SlotState{}, Catalog{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))

	var walLevel string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return SlotState{}, Catalog{}, fmt.Errorf("read wal_level: %w", err)
	}
	if walLevel != "logical" {
		return SlotState{}, Catalog{}, errtext.Fatalf("wal_level is %s; set wal_level = logical in postgresql.conf (or run ALTER SYSTEM SET wal_level = logical) and restart Postgres", walLevel)
	}

	var version int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		return SlotState{}, Catalog{}, fmt.Errorf("read server_version_num: %w", err)
	}
	if version < 140000 {
		// pgoutput's messages option, which carries logical decoding
		// message sources and the connector's own backfill watermarks.
		return SlotState{}, Catalog{}, errtext.Fatalf("PostgreSQL %d is older than 14, the oldest the connector supports; upgrade", version/10000)
	}

	var user, db string
	var replication bool
	err = conn.QueryRow(ctx, `SELECT current_user, current_database(), rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&user, &db, &replication)
	if err != nil {
		return SlotState{}, Catalog{}, fmt.Errorf("read role attributes: %w", err)
	}
	if !replication {
		return SlotState{}, Catalog{}, errtext.Fatalf("role %s lacks the REPLICATION attribute; as a superuser run: ALTER ROLE %s WITH REPLICATION", pgident.Quote(user), pgident.Quote(user))
	}

	standby, err := postgres.InRecovery(ctx, conn)
	if err != nil {
		return SlotState{}, Catalog{}, err
	}
	if standby {
		if err := checkStandby(ctx, conn, version); err != nil {
			return SlotState{}, Catalog{}, err
		}
	}
	var published bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, cfg.Publication).Scan(&published); err != nil {
		return SlotState{}, Catalog{}, fmt.Errorf("read publication %s: %w", cfg.Publication, err)
	}
	for _, t := range tables {
		if err := checkTable(ctx, conn, db, t); err != nil {
			// Under an existing publication, a table missing under its
			// name may have been renamed: the checkpoint knows its
			// relation, and tablewatch.Baseline follows it or stops.
			if !published || !errors.Is(err, ErrTableMissing) {
				return SlotState{}, Catalog{}, err
			}
		}
	}
	var cat Catalog
	if standby {
		cat, err = standbyPublication(ctx, conn, cfg, tables, log)
	} else {
		cat, err = ensurePublication(ctx, conn, cfg.Publication, tables, false, log)
	}
	if err != nil {
		return SlotState{}, Catalog{}, err
	}
	st, err := InspectSlot(ctx, conn, cfg.Slot)
	if err != nil {
		return SlotState{}, Catalog{}, err
	}
	if lost := st.Lost(); lost != nil {
		return SlotState{}, Catalog{}, postgres.LostSlotError(cfg.Slot, st.ConfirmedFlush, lost)
	}
	return st, cat, nil
}

// checkStandby checks what a hot standby needs to decode: PostgreSQL 16
// or later, and hot_standby_feedback, without which the primary's vacuum
// removes catalog rows the slot needs and Postgres invalidates it.
func checkStandby(ctx context.Context, conn *pgx.Conn, version int) error {
	if version/10000 < postgres.MinStandbyMajor {
		return errtext.Fatalf("postgres.url is a hot standby of PostgreSQL %d, and logical decoding on a standby needs PostgreSQL %d or later: point postgres.url at the primary, or upgrade", version/10000, postgres.MinStandbyMajor)
	}
	var feedback string
	if err := conn.QueryRow(ctx, "SHOW hot_standby_feedback").Scan(&feedback); err != nil {
		return fmt.Errorf("read hot_standby_feedback: %w", err)
	}
	if feedback != "on" {
		return errtext.Fatalf("postgres.url is a hot standby with hot_standby_feedback off: the primary's vacuum would remove catalog rows the slot needs, and Postgres would invalidate it; on the standby run ALTER SYSTEM SET hot_standby_feedback = on and SELECT pg_reload_conf()")
	}
	return nil
}

// standbyPublication is ensurePublication on a hot standby, which cannot
// write: what the publication needs is done on postgres.primary_url, and
// the standby waited for until it has replayed it; without a primary_url
// it is a *postgres.StandbyError with the statement to run there.
func standbyPublication(ctx context.Context, conn *pgx.Conn, cfg postgres.Config, tables []Table, log hclog.Logger) (Catalog, error) {
	needs := func() (string, error) {
		cat, err := ReadCatalog(ctx, conn, cfg.Publication, tables)
		if err != nil {
			return "", err
		}
		switch {
		case !cat.Publication.Exists:
			return createStatement(cfg.Publication, tables), nil
		case cat.Publication.Owned && viaRootProblem(cat) != "":
			return ViaRootStatement(cfg.Publication), nil
		}
		return "", nil
	}
	stmt, err := needs()
	if err != nil || stmt == "" {
		if err != nil {
			return Catalog{}, err
		}
		return ensurePublication(ctx, conn, cfg.Publication, tables, false, log)
	}
	primary, err := postgres.ConnectPrimary(ctx, cfg, "create or change publication "+cfg.Publication, stmt)
	if err != nil {
		return Catalog{}, err
	}
	_, err = ensurePublication(ctx, primary, cfg.Publication, tables, false, log)
	primary.Close(context.WithoutCancel(ctx))
	if err != nil {
		return Catalog{}, err
	}
	// The standby has it once it has replayed that far.
	deadline := time.Now().Add(time.Minute)
	for {
		if stmt, err = needs(); err != nil || stmt == "" {
			break
		}
		if time.Now().After(deadline) {
			return Catalog{}, errtext.Fatalf("publication %s was made on the primary (postgres.primary_url), and the standby has not replayed it after a minute: is the standby replicating from that primary?", cfg.Publication)
		}
		select {
		case <-ctx.Done():
			return Catalog{}, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	if err != nil {
		return Catalog{}, err
	}
	return ensurePublication(ctx, conn, cfg.Publication, tables, false, log)
}

func checkTable(ctx context.Context, conn *pgx.Conn, db string, t Table) error {
	var cols []string
	rows, err := conn.Query(ctx, `
		SELECT a.attname FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace
		JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
		WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')`, t.Schema, t.Name)
	if err != nil {
		return fmt.Errorf("read columns of %s: %w", t, err)
	}
	cols, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("read columns of %s: %w", t, err)
	}
	if len(cols) == 0 {
		return TableMissing(t, db)
	}
	return missingColumns(t, cols)
}

// ErrTableMissing is a configured table that does not exist under its
// name (TableMissing).
var ErrTableMissing = errors.New("outbox table does not exist")

// TableMissing is the error for table t, which does not exist in database
// db under its name, and whose relation the checkpoint does not know
// under another.
func TableMissing(t Table, db string) error {
	return &errtext.Fatal{Err: ErrTableMissing, Msg: fmt.Sprintf("outbox table %s does not exist in database %s; create it, or fix tables[].name in the config (unquoted names are lower-cased, as in SQL)", t, pgident.Quote(db))}
}

// missingColumns is the error for every column of t that cols, the table's
// columns, lacks: all of them at once, and for the config's fields a
// ready-to-paste columns: block of the table's columns that fit them (the
// same name but for case and underscores: aggregate_type, aggregateType
// for aggregatetype; event_type for the event type's type).
func missingColumns(t Table, cols []string) error {
	var missing, fits []string
	norm := func(s string) string { return strings.ToLower(strings.ReplaceAll(s, "_", "")) }
	for i, want := range t.Columns {
		if slices.Contains(cols, want) {
			continue
		}
		missing = append(missing, pgident.Quote(want))
		field := ""
		if i < len(t.Fields) {
			field = t.Fields[i]
		}
		if field == "" {
			continue
		}
		for _, c := range cols {
			if norm(c) == norm(want) || norm(c) == norm(field) {
				// As the config file reads it: a SQL identifier, so a
				// name with capitals is quoted inside the YAML string.
				v := c
				if pgident.Quote(c) != c {
					v = `'` + pgident.Quote(c) + `'`
				}
				fits = append(fits, field+": "+v)
				break
			}
		}
	}
	if len(missing) == 0 {
		return nil
	}
	msg := fmt.Sprintf("outbox table %s has no column %s; map existing columns in tables[].columns, additional or the templates (the table's columns: %s; names are SQL identifiers, lower-cased unless quoted)",
		t, strings.Join(missing, ", "), strings.Join(cols, ", "))
	if len(fits) > 0 {
		msg += fmt.Sprintf("; these columns fit, to paste under the table in the config: columns: {%s}", strings.Join(fits, ", "))
	}
	return errtext.Fatalf("%s", msg)
}

// ensurePublication creates the publication when it is missing, with
// publish_via_partition_root so that a partitioned table's rows arrive
// under its own name, and makes an existing one fit where the connector's
// role owns it: it must publish inserts, and partitioned tables via their
// root. What it may not change is a *errtext.Fatal with the statement to run.
// A table missing from an existing publication is left to the caller,
// which knows from its checkpoint whether the table is new, recreated or
// removed (TableState.Published; AddToPublication). retried: a create
// already lost a race with another connector. It returns the catalog as it
// left it.
func ensurePublication(ctx context.Context, conn *pgx.Conn, name string, tables []Table, retried bool, log hclog.Logger) (Catalog, error) {
	cat, err := ReadCatalog(ctx, conn, name, tables)
	if err != nil {
		return Catalog{}, err
	}
	pub := cat.Publication
	if !pub.Exists {
		sql := createStatement(name, tables)
		if _, err := conn.Exec(ctx, sql); err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && (pe.Code == "42710" || pe.Code == "23505") && !retried {
				// Another connector created it a moment ago (duplicate_object,
				// or the catalog's unique index when both inserted at once):
				// use it, if it is what this one needs (docs/design.md, "A
				// first start is a state, not a session").
				return ensurePublication(ctx, conn, name, tables, true, log)
			}
			return Catalog{}, errtext.Fatalf("create publication %s: %v; run as the tables' owner or a superuser: %s", name, err, sql)
		}
		log.Info("created publication", "publication", name, "tables", strings.Join(tableNames(tables), ", "))
		return ReadCatalog(ctx, conn, name, tables)
	}
	if !pub.Inserts {
		return Catalog{}, errtext.Fatalf("publication %s does not publish inserts; run: ALTER PUBLICATION %s SET (publish = 'insert')", name, name)
	}
	if p := viaRootProblem(cat); p != "" {
		if !pub.Owned {
			return Catalog{}, errtext.Fatalf("%s", p)
		}
		// The role owns the publication: the connector made it, or was
		// given it to manage. Rows of leaf partitions already in the WAL
		// still arrive under the leaves' names; Decoder.Partition maps
		// them.
		if _, err := conn.Exec(ctx, ViaRootStatement(name)); err != nil {
			return Catalog{}, errtext.Fatalf("set publish_via_partition_root on publication %s: %v; run: %s", name, err, ViaRootStatement(name))
		}
		log.Info("set publish_via_partition_root on the publication, so that partitioned tables' rows arrive under their own name", "publication", name)
		return ReadCatalog(ctx, conn, name, tables)
	}
	return cat, nil
}

// viaRootProblem is the problem of a publication that names a partitioned
// table's leaf partitions, or "".
func viaRootProblem(cat Catalog) string {
	pub := cat.Publication
	if pub.ViaRoot || !partitioned(cat) {
		return ""
	}
	var names []string
	for _, t := range cat.Tables {
		if t.Partitioned {
			names = append(names, t.String())
		}
	}
	return fmt.Sprintf("publication %s publishes partitioned outbox table %s under its leaf partitions' names (publish_via_partition_root is off); as the publication's owner run: %s",
		pub.Name, strings.Join(names, ", "), ViaRootStatement(pub.Name))
}

// UnloggedTable is the error for table t, made unlogged (ALTER TABLE ...
// SET UNLOGGED, which a FOR ALL TABLES or schema publication allows): its
// inserts are not written to the WAL, so none reaches the connector
// whatever the publication says. configFile is for the backfill's command.
func UnloggedTable(t fmt.Stringer, configFile string) error {
	return errtext.Fatalf("outbox table %s, or a partition of it, is unlogged (ALTER TABLE ... SET UNLOGGED, or CREATE UNLOGGED TABLE ... PARTITION OF), so its inserts are not written to the WAL and never reach the connector; as its owner run ALTER TABLE ... SET LOGGED on it (SELECT relname FROM pg_partition_tree('%s') JOIN pg_class ON oid = relid WHERE relpersistence = 'u' names them); then send the rows it received while unlogged with cdc backfill --config %s --table %s --where '<those rows>', and start the connector again",
		t, t, configFile, t)
}

// LeftPublication is the error for table t, streamed before and no longer
// in the publication.
func LeftPublication(pub, configFile string, t fmt.Stringer) error {
	return &errtext.Fatal{Msg: fmt.Sprintf("outbox table %s left publication %s (someone removed it), so its inserts since do not reach the connector; "+
		"as the publication's owner run: %s; then send the rows it received while it was out with cdc backfill --config %s --table %s --where '<those rows>', and start the connector again",
		t, pub, AddStatement(pub, Table{TableName: outboxName(t)}), configFile, t)}
}

// LeftAndBack is the error for table t, streamed before, found removed
// from the publication and added back since the last look: the inserts of
// the time between never reached the slot.
func LeftAndBack(pub, configFile string, t fmt.Stringer) error {
	return &errtext.Fatal{Msg: fmt.Sprintf("outbox table %s left publication %s and was added back (its membership changed), so the inserts it received in between never reached the connector; "+
		"send them with cdc backfill --config %s --table %s --where '<those rows>', and start the connector again (retention keeps the table's rows from before this start)",
		t, pub, configFile, t)}
}

// Filtered is the error for table t, which the publication publishes
// through a row filter.
func Filtered(pub string, t fmt.Stringer) error {
	return &errtext.Fatal{Msg: fmt.Sprintf("publication %s has a row filter (WHERE) for outbox table %s, so the inserts it filters out never reach the connector; "+
		"as the publication's owner set the table again without one (ALTER PUBLICATION %s SET TABLE ..., every table listed) and start the connector again",
		pub, t, pub)}
}

// outboxName is t's name as a TableName, for the statements errors name.
func outboxName(t fmt.Stringer) outbox.TableName {
	switch v := t.(type) {
	case Table:
		return v.TableName
	case *outbox.Source:
		return v.Name
	}
	return outbox.TableName{Name: t.String()}
}

// NotPublished is the error for table t, whose inserts do not reach the
// publication; why, when set, says why the connector's role does not add
// it, role is that role.
func NotPublished(publication string, t Table, why, role string) error {
	if why != "" {
		why = " (the connector's role may not add it: " + why + ")"
	}
	return errtext.Fatalf("publication %s does not include outbox table %s, so its inserts do not reach the connector%s; as the owner of the publication and the table run: %s; %s; "+
		"then start the connector again: if the table was dropped and created again after the connector streamed it, it sends the rows the new table holds that were not streamed",
		publication, t, why, AddStatement(publication, t), GrantStatement(t, role))
}

func partitioned(cat Catalog) bool {
	return slices.ContainsFunc(cat.Tables, func(t TableState) bool { return t.Partitioned })
}

// createStatement creates the publication for tables: inserts only, and
// partitioned tables' rows under their own name.
func createStatement(name string, tables []Table) string {
	if len(tables) == 0 {
		// Only logical decoding messages: they need a publication to
		// stream, but not any table in it.
		return fmt.Sprintf("CREATE PUBLICATION %s WITH (publish = 'insert')", name)
	}
	return fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert', publish_via_partition_root = true)", name, tableList(tables))
}

// tableList names tables for a publication, each ONLY: a table that
// inherits from an outbox is no outbox (docs/design.md, "A table that
// inherits from the outbox"), and a foreign one cannot be published at
// all. ONLY leaves a partitioned table's partitions in.
func tableList(tables []Table) string {
	names := tableNames(tables)
	for i, n := range names {
		names[i] = "ONLY " + n
	}
	return strings.Join(names, ", ")
}

// tableNames are tables' names, quoted as SQL needs.
func tableNames(tables []Table) []string {
	names := make([]string, len(tables))
	for i, t := range tables {
		names[i] = t.String()
	}
	return names
}

// InspectSlot reads slot from pg_replication_slots. A missing slot is
// Exists false, not an error; one of another kind, plugin or database is a
// *errtext.Fatal.
func InspectSlot(ctx context.Context, conn *pgx.Conn, slot string) (SlotState, error) {
	var (
		plugin, slotType, db string
		slotDB, walStatus    *string
		confirmed, restart   *pglogrepl.LSN
		pid                  *int
		st                   SlotState
	)
	// conflicting is PostgreSQL 16's, invalidation_reason 17's; before,
	// no slot could conflict, and wal_status 'lost' is all there is.
	conflicting, reason := "false", "''"
	var version int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		return SlotState{}, fmt.Errorf("read server_version_num: %w", err)
	}
	if version >= 160000 {
		conflicting = "coalesce(conflicting, false)"
	}
	if version >= 170000 {
		reason = "coalesce(invalidation_reason, '')"
	}
	err := conn.QueryRow(ctx, `
		SELECT coalesce(plugin, ''), slot_type, database, current_database(), wal_status, confirmed_flush_lsn, restart_lsn, active, active_pid,
		       safe_wal_size, CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END,
		       pg_is_in_recovery(), `+conflicting+`, `+reason+`
		FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&plugin, &slotType, &slotDB, &db, &walStatus, &confirmed, &restart, &st.Active, &pid,
		&st.SafeWALSize, &st.WALEnd, &st.Standby, &st.Conflicting, &st.Invalidated)
	if errors.Is(err, pgx.ErrNoRows) {
		return SlotState{}, nil
	}
	if err != nil {
		return SlotState{}, fmt.Errorf("read replication slot %q: %w", slot, err)
	}
	if slotType != "logical" || plugin != "pgoutput" {
		return SlotState{}, errtext.Fatalf("replication slot %q exists as a %s slot with plugin %q, not pgoutput; choose another postgres.slot, or drop it if nothing else uses it: SELECT pg_drop_replication_slot('%s')", slot, slotType, plugin, slot)
	}
	if slotDB == nil || *slotDB != db {
		other := ""
		if slotDB != nil {
			other = *slotDB
		}
		return SlotState{}, errtext.Fatalf("replication slot %q belongs to database %q, not %q; choose another postgres.slot", slot, other, db)
	}
	st.Exists = true
	if walStatus != nil {
		st.WALStatus = *walStatus
	}
	st.Invalidated = postgres.InvalidationReason(st.Invalidated, st.WALStatus, st.Conflicting)
	if pid != nil {
		st.ActivePID = *pid
	}
	if restart != nil {
		st.RestartLSN = *restart
	}
	if confirmed != nil {
		st.ConfirmedFlush = *confirmed
	} else if st.Invalidated == "" {
		return SlotState{}, fmt.Errorf("replication slot %q has no confirmed_flush_lsn yet", slot)
	}
	return st, nil
}

// HeldByOther reports whether a walsender other than pid streams slot:
// after a fence, that another instance took over. When Postgres cannot
// say, it is taken as no, and the next session finds out.
func HeldByOther(ctx context.Context, cfg postgres.Config, slot string, pid uint32) bool {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := postgres.ConnectSQL(qctx, cfg)
	if err != nil {
		return false
	}
	defer conn.Close(context.WithoutCancel(ctx))
	st, err := InspectSlot(qctx, conn, slot)
	return err == nil && st.Active && uint32(st.ActivePID) != pid
}
