package wal

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

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

// SlotState is what Setup found or created.
type SlotState struct {
	// ConfirmedFlush is the slot's confirmed_flush_lsn: where streaming
	// resumes.
	ConfirmedFlush pglogrepl.LSN
	Created        bool
}

// Setup checks every precondition of streaming the tables, creates the
// publication when it is missing, and creates the slot when it is missing
// and createSlot is set. Every failure a user must fix is a *SetupError that
// says how. Logical decoding message sources need no table: cfg.Messages
// covers them.
func Setup(ctx context.Context, cfg Config, tables []Table, createSlot bool, log hclog.Logger) (SlotState, error) {
	return prepare(ctx, cfg, tables, createSlot, false, log)
}

// Check runs Setup's checks without creating anything: a missing
// publication or slot is fine, one that exists must fit.
func Check(ctx context.Context, cfg Config, tables []Table) error {
	_, err := prepare(ctx, cfg, tables, false, true, hclog.NewNullLogger())
	return err
}

func prepare(ctx context.Context, cfg Config, tables []Table, createSlot, dryRun bool, log hclog.Logger) (SlotState, error) {
	conn, err := pgx.Connect(ctx, cfg.URL)
	if err != nil {
		return SlotState{}, fmt.Errorf("connect to postgres: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))

	var walLevel string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return SlotState{}, fmt.Errorf("read wal_level: %w", err)
	}
	if walLevel != "logical" {
		return SlotState{}, setupErrorf("wal_level is %s; set wal_level = logical in postgresql.conf (or run ALTER SYSTEM SET wal_level = logical) and restart Postgres", walLevel)
	}

	if cfg.Messages {
		var version int
		if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
			return SlotState{}, fmt.Errorf("read server_version_num: %w", err)
		}
		if version < 140000 {
			return SlotState{}, setupErrorf("logical decoding messages as an outbox need PostgreSQL 14 or later (pgoutput's messages option); this server is %d", version)
		}
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
	if err := ensurePublication(ctx, conn, cfg.Publication, tables, dryRun, log); err != nil {
		return SlotState{}, err
	}
	return ensureSlot(ctx, conn, cfg.Slot, db, createSlot, dryRun, log)
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

func ensurePublication(ctx context.Context, conn *pgx.Conn, name string, tables []Table, dryRun bool, log hclog.Logger) error {
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

func ensureSlot(ctx context.Context, conn *pgx.Conn, slot, db string, create, dryRun bool, log hclog.Logger) (SlotState, error) {
	var (
		plugin, slotType  string
		slotDB, walStatus *string
		confirmed         *pglogrepl.LSN
	)
	err := conn.QueryRow(ctx, `
		SELECT coalesce(plugin, ''), slot_type, database, wal_status, confirmed_flush_lsn
		FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&plugin, &slotType, &slotDB, &walStatus, &confirmed)
	if errors.Is(err, pgx.ErrNoRows) && dryRun {
		return SlotState{}, nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		if !create {
			return SlotState{}, &SetupError{Err: ErrSlotVanished, Msg: fmt.Sprintf(
				"replication slot %q vanished while the connector was running (dropped, or Postgres failed over without failover slots); "+
					"events committed since the last confirmed position may not be recoverable from the slot; "+
					"investigate, then restart the connector to create a new slot from the current WAL position", slot)}
		}
		var lsn pglogrepl.LSN
		if err := conn.QueryRow(ctx, `SELECT lsn FROM pg_create_logical_replication_slot($1, 'pgoutput')`, slot).Scan(&lsn); err != nil {
			return SlotState{}, fmt.Errorf("create replication slot %q: %w", slot, err)
		}
		log.Warn("created replication slot; events committed before this position are not streamed", "slot", slot, "lsn", lsn.String())
		return SlotState{ConfirmedFlush: lsn, Created: true}, nil
	}
	if err != nil {
		return SlotState{}, fmt.Errorf("read replication slot %q: %w", slot, err)
	}
	drop := fmt.Sprintf("SELECT pg_drop_replication_slot('%s')", slot)
	if slotType != "logical" || plugin != "pgoutput" {
		return SlotState{}, setupErrorf("replication slot %q exists as a %s slot with plugin %q, not pgoutput; choose another postgres.slot, or drop it if nothing else uses it: %s", slot, slotType, plugin, drop)
	}
	if slotDB == nil || *slotDB != db {
		other := ""
		if slotDB != nil {
			other = *slotDB
		}
		return SlotState{}, setupErrorf("replication slot %q belongs to database %q, not %q; choose another postgres.slot", slot, other, db)
	}
	if walStatus != nil && *walStatus == "lost" {
		return SlotState{}, &SetupError{Err: ErrSlotLost, Msg: fmt.Sprintf(
			"replication slot %q is lost: Postgres removed WAL it still needed (max_slot_wal_keep_size); events after its confirmed position are gone from the WAL. "+
				"Recover them from the outbox table if it still holds them, then drop the slot (%s) and restart to stream from now on", slot, drop)}
	}
	if confirmed == nil {
		return SlotState{}, fmt.Errorf("replication slot %q has no confirmed_flush_lsn yet", slot)
	}
	return SlotState{ConfirmedFlush: *confirmed}, nil
}
