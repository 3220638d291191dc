package wal

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxcdc/cdc/internal/pgident"
)

// Table is an outbox table the slot streams: its name as the catalog stores
// it (unquoted), and the columns the decoder reads from it.
type Table struct {
	Schema, Name string
	Columns      []string
}

// String returns the name quoted for SQL, e.g. tenant."OutboxEvent".
func (t Table) String() string { return pgident.Qualified(t.Schema, t.Name) }

// SlotState is what Setup found of a slot.
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
	// with the slot.
	WALEnd pglogrepl.LSN
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

// Setup checks every precondition of streaming the tables, creates the
// publication when it is missing, and reports on cfg.Slot. It never creates
// a slot: the pipeline decides that against its checkpoint. Every failure a
// user must fix is a *SetupError that says how; a lost slot is one. Logical
// decoding message sources need no table: cfg.Messages covers them.
func Setup(ctx context.Context, cfg Config, tables []Table, log hclog.Logger) (SlotState, error) {
	conn, err := ConnectSQL(ctx, cfg)
	if err != nil {
		return SlotState{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))

	var walLevel string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return SlotState{}, fmt.Errorf("read wal_level: %w", err)
	}
	if walLevel != "logical" {
		return SlotState{}, setupErrorf("wal_level is %s; set wal_level = logical in postgresql.conf (or run ALTER SYSTEM SET wal_level = logical) and restart Postgres", walLevel)
	}

	var version int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		return SlotState{}, fmt.Errorf("read server_version_num: %w", err)
	}
	if version < 140000 {
		// pgoutput's messages option, which carries logical decoding
		// message sources and the connector's own backfill watermarks.
		return SlotState{}, setupErrorf("PostgreSQL %d is older than 14, the oldest the connector supports; upgrade", version/10000)
	}

	var user, db string
	var replication bool
	err = conn.QueryRow(ctx, `SELECT current_user, current_database(), rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&user, &db, &replication)
	if err != nil {
		return SlotState{}, fmt.Errorf("read role attributes: %w", err)
	}
	if !replication {
		return SlotState{}, setupErrorf("role %s lacks the REPLICATION attribute; as a superuser run: ALTER ROLE %s WITH REPLICATION", pgident.Quote(user), pgident.Quote(user))
	}

	for _, t := range tables {
		if err := checkTable(ctx, conn, db, t); err != nil {
			return SlotState{}, err
		}
	}
	if err := ensurePublication(ctx, conn, cfg.Publication, tables, false, false, log); err != nil {
		return SlotState{}, err
	}
	st, err := InspectSlot(ctx, conn, cfg.Slot)
	if err != nil {
		return SlotState{}, err
	}
	if st.WALStatus == "lost" {
		return SlotState{}, &SetupError{Err: ErrSlotLost, Msg: fmt.Sprintf(
			"replication slot %q is lost: Postgres removed WAL it still needed (max_slot_wal_keep_size), and events after its confirmed position %s are gone from the WAL; "+
				"recover them from the outbox table if it still holds them, then accept the gap with cdc reset --accept-gap (with your --config), which drops the slot and creates a new one at the current position", cfg.Slot, st.ConfirmedFlush)}
	}
	return st, nil
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
		return setupErrorf("outbox table %s does not exist in database %s; create it, or fix tables[].name in the config (unquoted names are lower-cased, as in SQL)", t, pgident.Quote(db))
	}
	for _, want := range t.Columns {
		found := false
		for _, c := range cols {
			if c == want {
				found = true
				break
			}
		}
		if !found {
			return setupErrorf("outbox table %s has no column %s; map an existing column in tables[].columns, additional or the templates (columns: %s)", t, pgident.Quote(want), strings.Join(cols, ", "))
		}
	}
	return nil
}

// ensurePublication creates the publication when it is missing, and checks
// that it publishes the tables' inserts. retried: a create already lost a
// race with another connector.
func ensurePublication(ctx context.Context, conn *pgx.Conn, name string, tables []Table, dryRun, retried bool, log hclog.Logger) error {
	var insert bool
	err := conn.QueryRow(ctx, `SELECT pubinsert FROM pg_publication WHERE pubname = $1`, name).Scan(&insert)
	if errors.Is(err, pgx.ErrNoRows) && dryRun {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		names := make([]string, len(tables))
		for i, t := range tables {
			names[i] = t.String()
		}
		sql := fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')", name, strings.Join(names, ", "))
		if len(names) == 0 {
			// Only logical decoding messages: they need a publication
			// to stream, but not any table in it.
			sql = fmt.Sprintf("CREATE PUBLICATION %s WITH (publish = 'insert')", name)
		}
		if _, err := conn.Exec(ctx, sql); err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && (pe.Code == "42710" || pe.Code == "23505") && !retried {
				// Another connector created it a moment ago (duplicate_object,
				// or the catalog's unique index when both inserted at once):
				// use it, if it is what this one needs (docs/design.md, rule 20).
				return ensurePublication(ctx, conn, name, tables, dryRun, true, log)
			}
			return setupErrorf("create publication %s: %v; run as the tables' owner or a superuser: %s", name, err, sql)
		}
		log.Info("created publication", "publication", name, "tables", strings.Join(names, ", "))
		return nil
	}
	if err != nil {
		return fmt.Errorf("read publication %s: %w", name, err)
	}
	if !insert {
		return setupErrorf("publication %s does not publish inserts; run: ALTER PUBLICATION %s SET (publish = 'insert')", name, name)
	}
	rows, err := conn.Query(ctx, `SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = $1`, name)
	if err != nil {
		return fmt.Errorf("read tables of publication %s: %w", name, err)
	}
	published, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Table, error) {
		var t Table
		return t, r.Scan(&t.Schema, &t.Name)
	})
	if err != nil {
		return fmt.Errorf("read tables of publication %s: %w", name, err)
	}
	for _, t := range tables {
		found := false
		for _, p := range published {
			if p.Schema == t.Schema && p.Name == t.Name {
				found = true
				break
			}
		}
		if !found {
			return setupErrorf("publication %s exists but does not include outbox table %s; run: ALTER PUBLICATION %s ADD TABLE %s", name, t, name, t)
		}
	}
	return nil
}

// InspectSlot reads slot from pg_replication_slots. A missing slot is
// Exists false, not an error; one of another kind, plugin or database is a
// *SetupError.
func InspectSlot(ctx context.Context, conn *pgx.Conn, slot string) (SlotState, error) {
	var (
		plugin, slotType, db string
		slotDB, walStatus    *string
		confirmed, restart   *pglogrepl.LSN
		pid                  *int
		st                   SlotState
	)
	err := conn.QueryRow(ctx, `
		SELECT coalesce(plugin, ''), slot_type, database, current_database(), wal_status, confirmed_flush_lsn, restart_lsn, active, active_pid,
		       safe_wal_size, CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END
		FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&plugin, &slotType, &slotDB, &db, &walStatus, &confirmed, &restart, &st.Active, &pid,
		&st.SafeWALSize, &st.WALEnd)
	if errors.Is(err, pgx.ErrNoRows) {
		return SlotState{}, nil
	}
	if err != nil {
		return SlotState{}, fmt.Errorf("read replication slot %q: %w", slot, err)
	}
	if slotType != "logical" || plugin != "pgoutput" {
		return SlotState{}, setupErrorf("replication slot %q exists as a %s slot with plugin %q, not pgoutput; choose another postgres.slot, or drop it if nothing else uses it: SELECT pg_drop_replication_slot('%s')", slot, slotType, plugin, slot)
	}
	if slotDB == nil || *slotDB != db {
		other := ""
		if slotDB != nil {
			other = *slotDB
		}
		return SlotState{}, setupErrorf("replication slot %q belongs to database %q, not %q; choose another postgres.slot", slot, other, db)
	}
	st.Exists = true
	if walStatus != nil {
		st.WALStatus = *walStatus
	}
	if pid != nil {
		st.ActivePID = *pid
	}
	if restart != nil {
		st.RestartLSN = *restart
	}
	if confirmed != nil {
		st.ConfirmedFlush = *confirmed
	} else if st.WALStatus != "lost" {
		return SlotState{}, fmt.Errorf("replication slot %q has no confirmed_flush_lsn yet", slot)
	}
	return st, nil
}
