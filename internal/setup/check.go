package setup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/pgident"
	"github.com/outboxcdc/cdc/internal/postgres"
)

// CheckError lists everything Check found that would stop cdc run, each
// with its fix. Warnings lists what would weaken it without stopping it.
type CheckError struct{ Problems, Warnings []string }

func (e *CheckError) Error() string {
	if len(e.Problems) == 1 {
		return e.Problems[0]
	}
	return fmt.Sprintf("%d problems: %s", len(e.Problems), strings.Join(e.Problems, "; "))
}

// Check tests, without creating anything, what Prepare and streaming will
// need, and reports every problem rather than the first: wal_level, the
// role's REPLICATION, each table, its columns and SELECT on it, the
// publication (that it fits, or that the role may create it), the slot
// (that it fits, or that a free slot and WAL sender are there for it), and
// the free slots the others need (the replay window's). Only a connection
// that fails stops it early. warnings are what would weaken cdc run
// without stopping it: an unlimited max_slot_wal_keep_size.
func Check(ctx context.Context, cfg postgres.Config, tables []Table, otherSlots ...string) (warnings []string, err error) {
	conn, err := postgres.ConnectSQL(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	c := &checker{cfg: cfg, conn: conn}
	err = c.run(ctx, tables, otherSlots)
	if c.primary != nil {
		c.primary.Close(context.WithoutCancel(ctx))
	}
	if err == nil && len(c.probs) > 0 {
		err = &CheckError{Problems: c.probs}
	}
	return c.warnings, err
}

// checker gathers Check's problems and warnings; its methods return an
// error only when the check cannot go on.
type checker struct {
	cfg             postgres.Config
	conn            *pgx.Conn
	primary         *pgx.Conn // a standby's primary, when reached
	standby         bool
	user, db        string
	super           bool
	probs, warnings []string
}

func (c *checker) add(err error) {
	if err != nil {
		c.probs = append(c.probs, err.Error())
	}
}

func (c *checker) run(ctx context.Context, tables []Table, otherSlots []string) error {
	version, err := c.server(ctx)
	if err != nil {
		return err
	}
	if err := c.standbyOf(ctx, version); err != nil {
		return err
	}
	if err := c.role(ctx); err != nil {
		return err
	}
	present, err := c.tables(ctx, tables)
	if err != nil {
		return err
	}
	if err := c.publication(ctx, tables, present); err != nil {
		return err
	}
	return c.slots(ctx, otherSlots)
}

// server checks wal_level, the version and max_slot_wal_keep_size.
func (c *checker) server(ctx context.Context) (version int, err error) {
	var walLevel, keep string
	if err := c.conn.QueryRow(ctx, "SELECT current_setting('wal_level'), current_setting('server_version_num')::int, current_setting('max_slot_wal_keep_size')").Scan(&walLevel, &version, &keep); err != nil {
		return 0, fmt.Errorf("read wal_level: %w", err)
	}
	if keep == "-1" {
		c.warnings = append(c.warnings, "max_slot_wal_keep_size is unlimited (-1): a connector stopped for long keeps every byte of WAL since until the disk is full; as a superuser run: ALTER SYSTEM SET max_slot_wal_keep_size = '50GB'; SELECT pg_reload_conf(); (size it to hours of your WAL; docs/operations.md, \"Lost slot\")")
	}
	if walLevel != "logical" {
		c.add(errtext.Fatalf("wal_level is %s; set wal_level = logical in postgresql.conf (or run ALTER SYSTEM SET wal_level = logical) and restart Postgres", walLevel))
	}
	if version < 140000 {
		c.add(errtext.Fatalf("PostgreSQL %d is older than 14, the oldest the connector is tested on; upgrade", version/10000))
	}
	return version, nil
}

// standbyOf checks a hot standby (docs/operations.md, "Streaming from a
// replica"): what it needs, and its primary for what it cannot write.
func (c *checker) standbyOf(ctx context.Context, version int) error {
	standby, err := postgres.InRecovery(ctx, c.conn)
	if err != nil {
		return err
	}
	c.standby = standby
	if !standby {
		return nil
	}
	c.add(checkStandby(ctx, c.conn, version))
	if c.cfg.PrimaryURL == "" {
		c.warnings = append(c.warnings, "postgres.url is a hot standby and postgres.primary_url is not set: cdc run streams, but cannot create or change the publication, run cdc backfill or a table's repair, or delete rows for retention, all of which write on the primary; set postgres.primary_url")
		return nil
	}
	primary, err := postgres.ConnectPrimary(ctx, c.cfg, "write", "")
	if err != nil {
		c.add(err)
		return nil
	}
	c.primary = primary
	var primaryLevel string
	if err := primary.QueryRow(ctx, "SHOW wal_level").Scan(&primaryLevel); err != nil {
		return fmt.Errorf("read the primary's wal_level: %w", err)
	}
	if primaryLevel != "logical" {
		c.add(errtext.Fatalf("the primary (postgres.primary_url) has wal_level %s; a standby decodes only WAL written at wal_level = logical: on the primary run ALTER SYSTEM SET wal_level = logical and restart it", primaryLevel))
	}
	return nil
}

// role checks the role's REPLICATION.
func (c *checker) role(ctx context.Context) error {
	var replication bool
	if err := c.conn.QueryRow(ctx, `SELECT current_user, current_database(), rolreplication, rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&c.user, &c.db, &replication, &c.super); err != nil {
		return fmt.Errorf("read role attributes: %w", err)
	}
	if !replication && !c.super {
		c.add(errtext.Fatalf("role %s lacks the REPLICATION attribute; as a superuser run: ALTER ROLE %s WITH REPLICATION", pgident.Quote(c.user), pgident.Quote(c.user)))
	}
	return nil
}

// tables checks each table, its columns and SELECT on it, and returns
// those that exist.
func (c *checker) tables(ctx context.Context, tables []Table) (present []Table, err error) {
	for _, t := range tables {
		if err := checkTable(ctx, c.conn, c.db, t); err != nil {
			c.add(err)
			continue
		}
		present = append(present, t)
		var sel bool
		if err := c.conn.QueryRow(ctx, `SELECT has_table_privilege($1, 'SELECT')`, t.String()).Scan(&sel); err != nil {
			return present, fmt.Errorf("read privileges on %s: %w", t, err)
		}
		if !sel {
			c.add(errtext.Fatalf("role %s may not SELECT from outbox table %s; as its owner run: GRANT SELECT ON %s TO %s", pgident.Quote(c.user), t, t, pgident.Quote(c.user)))
		}
	}
	return present, nil
}

// publication checks the publication where it is made: on the primary,
// whose publication a standby replicates, or here.
func (c *checker) publication(ctx context.Context, tables, present []Table) error {
	name := c.cfg.Publication
	switch {
	case c.primary != nil:
		var pUser string
		var pSuper bool
		if err := c.primary.QueryRow(ctx, `SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&pUser, &pSuper); err != nil {
			return fmt.Errorf("read role attributes on the primary: %w", err)
		}
		c.add(checkPublication(ctx, c.primary, name, tables, present, pUser, pSuper))
	case c.standby:
		var exists bool
		if err := c.conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, name).Scan(&exists); err != nil {
			return fmt.Errorf("read publication %s: %w", name, err)
		}
		if !exists {
			c.add(postgres.NewStandbyError("create publication "+name, createStatement(name, tables)))
		} else {
			c.add(checkPublication(ctx, c.conn, name, tables, present, c.user, c.super))
		}
	default:
		c.add(checkPublication(ctx, c.conn, name, tables, present, c.user, c.super))
	}
	return nil
}

// slots checks the slot's state and that there is room for it and the
// others.
func (c *checker) slots(ctx context.Context, otherSlots []string) error {
	slot := c.cfg.Slot
	st, err := InspectSlot(ctx, c.conn, slot)
	if err != nil {
		var se *errtext.Fatal
		if !errors.As(err, &se) {
			return err
		}
		c.add(err)
	} else if lost := st.Lost(); lost != nil {
		c.add(errtext.Fatalf("replication slot %q is lost (%s): %s; %s, and see \"Lost slot\" in docs/operations.md (cdc reset --accept-gap)", slot, lost.Reason, lost.Cause, lost.Fix))
	}
	c.add(checkCapacity(ctx, c.conn, append([]string{slot}, otherSlots...)))
	return nil
}

// checkPublication checks an existing publication as Prepare does, or that
// the role may create a missing one: CREATE on the database and ownership
// of every table in it.
func checkPublication(ctx context.Context, conn *pgx.Conn, name string, tables, present []Table, user string, super bool) error {
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, name).Scan(&exists); err != nil {
		return fmt.Errorf("read publication %s: %w", name, err)
	}
	if exists {
		// What cdc run would change itself (it owns the publication, and
		// the table it adds) is no problem.
		cat, err := ReadCatalog(ctx, conn, name, present)
		if err != nil {
			return err
		}
		pub := cat.Publication
		var probs []string
		if !pub.Inserts {
			probs = append(probs, fmt.Sprintf("publication %s does not publish inserts; run: ALTER PUBLICATION %s SET (publish = 'insert')", name, name))
		}
		if p := viaRootProblem(cat); p != "" && !pub.Owned {
			probs = append(probs, p)
		}
		for _, t := range cat.Tables {
			if t.Unlogged {
				probs = append(probs, UnloggedTable(t.Table, "<config file>").Error())
				continue
			}
			if t.OID != 0 && !t.Published && !(pub.Owned && t.Owned) {
				why := "it does not own the table"
				if !pub.Owned {
					why = "it does not own the publication"
				}
				probs = append(probs, NotPublished(name, t.Table, why, cat.Role).Error())
			}
		}
		if len(probs) == 0 {
			return nil
		}
		return errtext.Fatalf("%s", strings.Join(probs, "; "))
	}
	if super {
		return nil
	}
	names := make([]string, len(tables))
	for i, t := range tables {
		names[i] = t.String()
	}
	create := createStatement(name, tables)
	var why []string
	var createDB bool
	if err := conn.QueryRow(ctx, `SELECT has_database_privilege(current_database(), 'CREATE')`).Scan(&createDB); err != nil {
		return fmt.Errorf("read privileges on the database: %w", err)
	}
	if !createDB {
		why = append(why, "it lacks CREATE on the database")
	}
	for _, t := range present {
		var owns bool
		err := conn.QueryRow(ctx, `SELECT pg_has_role(current_user, c.relowner, 'USAGE') FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND c.relname = $2`, t.Schema, t.Name).Scan(&owns)
		if err != nil {
			return fmt.Errorf("read the owner of %s: %w", t, err)
		}
		if !owns {
			why = append(why, "it does not own "+t.String())
		}
	}
	if len(why) == 0 {
		return nil
	}
	return errtext.Fatalf("publication %s does not exist, and role %s may not create it (%s); as the tables' owner or a superuser run: %s", name, pgident.Quote(user), strings.Join(why, ", "), create)
}

// checkCapacity checks that the slots among slots that do not exist yet
// can be created (max_replication_slots), and that a WAL sender is free to
// stream (max_wal_senders).
func checkCapacity(ctx context.Context, conn *pgx.Conn, slots []string) error {
	var freeSlots, freeSenders, missing int
	var active bool
	err := conn.QueryRow(ctx, `SELECT current_setting('max_replication_slots')::int - (SELECT count(*) FROM pg_replication_slots),
		current_setting('max_wal_senders')::int - (SELECT count(*) FROM pg_stat_replication),
		(SELECT count(*) FROM unnest($1::text[]) s WHERE s NOT IN (SELECT slot_name FROM pg_replication_slots)),
		coalesce((SELECT active FROM pg_replication_slots WHERE slot_name = $2), false)`, slots, slots[0]).Scan(&freeSlots, &freeSenders, &missing, &active)
	if err != nil {
		return fmt.Errorf("read max_replication_slots and max_wal_senders: %w", err)
	}
	var why []string
	if missing > freeSlots {
		why = append(why, fmt.Sprintf("%d replication slot(s) to create (%s) and %d free: raise max_replication_slots (restart), or drop unused slots", missing, strings.Join(slots, ", "), max(freeSlots, 0)))
	}
	if !active && freeSenders < 1 {
		why = append(why, "no free WAL sender: raise max_wal_senders (restart)")
	}
	if len(why) == 0 {
		return nil
	}
	return errtext.Fatalf("%s", strings.Join(why, "; "))
}

// LongestStop is the longest stop of the connector a deployment should
// survive without losing its slot: a day, so that an outage that starts
// at night is found and fixed the next working day with nothing lost.
// cdc check warns about settings that invalidate a slot sooner
// (IdleTimeoutWarning).
const LongestStop = 24 * time.Hour

// CheckIdleTimeout is cdc check's warning about the server's
// idle_replication_slot_timeout (IdleTimeoutWarning), "" when there is
// none; window is replay.window (0: off). Before PostgreSQL 18 there is no
// such setting, and no warning.
func CheckIdleTimeout(ctx context.Context, cfg postgres.Config, window time.Duration) (string, error) {
	conn, err := postgres.ConnectSQL(ctx, cfg)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var setting int64
	var unit string
	err = conn.QueryRow(ctx, `SELECT setting::bigint, coalesce(unit, '') FROM pg_settings WHERE name = 'idle_replication_slot_timeout'`).Scan(&setting, &unit)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read idle_replication_slot_timeout: %w", err)
	}
	per := map[string]time.Duration{"s": time.Second, "min": time.Minute}[unit]
	if per == 0 {
		return "", fmt.Errorf("idle_replication_slot_timeout is in unit %q, which this version does not know", unit)
	}
	return IdleTimeoutWarning(time.Duration(setting)*per, window), nil
}

// IdleTimeoutWarning is the warning, "" when none, about an
// idle_replication_slot_timeout (PostgreSQL 18) of timeout (0: off):
// Postgres invalidates a slot nothing streamed from for that long. The
// main slot is idle while the connector is stopped, so the timeout must
// outlast LongestStop. The replay slot of a replay window (window > 0) is
// idle by design: it moves only to a position older than the window, so
// after it is made it sits still for the window, and a stop in that time
// adds to it: the timeout must outlast the window and LongestStop
// together.
func IdleTimeoutWarning(timeout, window time.Duration) string {
	if timeout <= 0 {
		return ""
	}
	var need time.Duration
	var why []string
	if timeout < LongestStop {
		need = LongestStop
		why = append(why, fmt.Sprintf("the connector's slot is idle while it is stopped, so a stop longer than %s loses the slot and its events (a deployment should survive a stop of %s)",
			pgDuration(timeout), pgDuration(LongestStop)))
	}
	if window > 0 && timeout < window+LongestStop {
		need = window + LongestStop
		why = append(why, fmt.Sprintf("the replay slot is idle by design for replay.window (%s) after it is made, and a stop in that time (up to %s) adds to it, so Postgres would invalidate it and the replay window would be lost",
			pgDuration(window), pgDuration(LongestStop)))
	}
	if len(why) == 0 {
		return ""
	}
	return fmt.Sprintf("idle_replication_slot_timeout is %s, and Postgres invalidates a slot nothing streamed from for that long: %s; as a superuser run: ALTER SYSTEM SET idle_replication_slot_timeout = 0; SELECT pg_reload_conf(); (or set it to at least '%s'; docs/operations.md, \"Lost slot\")",
		pgDuration(timeout), strings.Join(why, "; "), pgDuration(need))
}

// pgDuration writes d as a Postgres time setting takes it: whole days,
// hours, minutes or seconds.
func pgDuration(d time.Duration) string {
	for _, u := range []struct {
		name string
		d    time.Duration
	}{{"d", 24 * time.Hour}, {"h", time.Hour}, {"min", time.Minute}} {
		if d%u.d == 0 {
			return fmt.Sprintf("%d%s", d/u.d, u.name)
		}
	}
	return fmt.Sprintf("%ds", (d+time.Second-1)/time.Second)
}
