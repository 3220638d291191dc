package wal

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/pgident"
	"github.com/outboxcdc/cdc/internal/postgres"
)

// System is what IDENTIFY_SYSTEM says about the server.
type System struct {
	// ID is the database system identifier: a restored pg_dump or another
	// cluster has another one; a physical standby shares its primary's.
	ID       string
	Timeline int32
	// WALEnd is the server's flush position when the connection opened.
	WALEnd pglogrepl.LSN
}

// Conn is a replication connection before it streams. Slots it creates or
// copies as temporary belong to it and vanish when it closes, which is why
// replay copies its slot here and not on a SQL connection.
type Conn struct {
	cfg    postgres.Config
	conn   *pgconn.PgConn
	log    hclog.Logger
	system System
	host   string
	db     string
	// address: see Address.
	address string
	standby bool
}

// Connect opens a replication connection (replication=database) and
// identifies the system.
func Connect(ctx context.Context, cfg postgres.Config, log hclog.Logger) (*Conn, error) {
	pcfg, err := cfg.ConnConfig()
	if err != nil {
		return nil, err
	}
	pcfg.RuntimeParams["replication"] = "database"
	postgres.PinFormats(pcfg.RuntimeParams)
	if pcfg.RuntimeParams["application_name"] == "" {
		pcfg.RuntimeParams["application_name"] = "outbox-cdc"
	}
	if cfg.ReadBatchDelay() > 0 {
		coalesce(pcfg)
	}
	conn, err := pgconn.ConnectConfig(ctx, pcfg)
	if err == nil && postgres.PinEncoding(conn, pcfg.RuntimeParams) {
		conn.Close(context.WithoutCancel(ctx))
		conn, err = pgconn.ConnectConfig(ctx, pcfg)
	}
	if err != nil {
		return nil, postgres.ConnectError(err, pcfg, "replication connection")
	}
	id, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("identify system: %w", err)
	}
	// A walsender in database mode takes plain SQL too.
	res, err := conn.Exec(ctx, "SELECT pg_is_in_recovery()").ReadAll()
	if err == nil && (len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 1) {
		err = fmt.Errorf("no answer")
	}
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("read pg_is_in_recovery on the replication connection: %w", err)
	}
	return &Conn{cfg: cfg, conn: conn, log: log, host: pcfg.Host, db: pcfg.Database, address: address(pcfg),
		standby: string(res[0].Rows[0][0]) == "t",
		system:  System{ID: id.SystemID, Timeline: id.Timeline, WALEnd: id.XLogPos}}, nil
}

// Standby reports whether the server was a hot standby when the
// connection opened.
func (c *Conn) Standby() bool { return c.standby }

// address is where postgres.url points: every host:port it lists (a
// multi-host URL is one address, whichever host answers), then the
// database. No user, no password.
func address(pc *pgconn.Config) string {
	hosts := []string{fmt.Sprintf("%s:%d", pc.Host, pc.Port)}
	for _, f := range pc.Fallbacks {
		if h := fmt.Sprintf("%s:%d", f.Host, f.Port); !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	return strings.Join(hosts, ",") + "/" + pc.Database
}

// Address is where postgres.url points, for checkpoint.Record.Address.
func (c *Conn) Address() string { return c.address }

// PID is the walsender's process id on the server.
func (c *Conn) PID() uint32 { return c.conn.PID() }

// System returns what IDENTIFY_SYSTEM said.
func (c *Conn) System() System { return c.system }

// Close closes the connection; its temporary slots go with it.
func (c *Conn) Close(ctx context.Context) { c.conn.Close(ctx) }

// CreateSlot creates the permanent logical slot name with pgoutput and
// returns its consistent point, where streaming it starts.
func (c *Conn) CreateSlot(ctx context.Context, name string) (pglogrepl.LSN, error) {
	lsn, _, err := c.createSlot(ctx, name, false)
	return lsn, err
}

// CreateSlotWithSnapshot creates the slot as CreateSlot does, and exports the
// snapshot of its consistent point: a transaction that imports it (SET
// TRANSACTION SNAPSHOT) sees exactly the rows committed before the first
// transaction the slot streams (docs/design.md, "Backfill consistency"). The
// snapshot lives until the next command on this connection, so import it before
// calling Start.
func (c *Conn) CreateSlotWithSnapshot(ctx context.Context, name string) (pglogrepl.LSN, string, error) {
	lsn, snap, err := c.createSlot(ctx, name, true)
	if err == nil && snap == "" {
		err = fmt.Errorf("create replication slot %q: the server exported no snapshot", name)
	}
	return lsn, snap, err
}

// createSlot creates the slot, as a failover slot on PostgreSQL 17 and
// later: a standby with sync_replication_slots keeps a copy, so that the
// slot survives a promotion (docs/operations.md, "Failover"). On a hot
// standby (16+) the slot is its own, and its creation waits for the
// primary's next running-transactions record (postgres.LogStandbySnapshot).
func (c *Conn) createSlot(ctx context.Context, name string, export bool) (pglogrepl.LSN, string, error) {
	snapshot := "nothing"
	if export {
		snapshot = "export"
	}
	var sql string
	switch major := c.Major(); {
	case major >= 17 && !c.standby: // a standby's slot cannot be a failover slot
		sql = fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL pgoutput (SNAPSHOT '%s', FAILOVER true)", pgident.Quote(name), snapshot)
	case major >= 15:
		sql = fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL pgoutput (SNAPSHOT '%s')", pgident.Quote(name), snapshot)
	default: // 14: the options in their old form
		sql = fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL pgoutput %s", pgident.Quote(name), map[bool]string{true: "EXPORT_SNAPSHOT", false: "NOEXPORT_SNAPSHOT"}[export])
	}
	res, err := pglogrepl.ParseCreateReplicationSlot(c.conn.Exec(ctx, sql))
	if err != nil {
		return 0, "", fmt.Errorf("create replication slot %q: %w", name, err)
	}
	lsn, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return 0, "", fmt.Errorf("create replication slot %q: consistent point %q: %w", name, res.ConsistentPoint, err)
	}
	return lsn, res.SnapshotName, nil
}

// Major is the server's major version (14, 15, ...), from what it reported
// at connect; 0 when unknown.
func (c *Conn) Major() int {
	v := c.conn.ParameterStatus("server_version")
	n := 0
	for _, r := range v {
		if r < '0' || r > '9' {
			break
		}
		n = n*10 + int(r-'0')
	}
	return n
}

// CopySlot copies the logical slot src to dst at src's position
// (pg_copy_logical_replication_slot) and returns that position. A temporary
// copy belongs to this connection.
func (c *Conn) CopySlot(ctx context.Context, src, dst string, temporary bool) (pglogrepl.LSN, error) {
	sql := fmt.Sprintf("SELECT lsn FROM pg_copy_logical_replication_slot(%s, %s, %s)",
		quoteLiteral(src), quoteLiteral(dst), strconv.FormatBool(temporary))
	if _, err := c.conn.Exec(ctx, sql).ReadAll(); err != nil {
		return 0, fmt.Errorf("copy replication slot %q to %q: %w", src, dst, err)
	}
	// The function returns the copy's restart point; streaming starts at its
	// confirmed position.
	return c.slotPosition(ctx, dst)
}

// AdvanceSlot moves the inactive slot name forward to to (never back),
// decoding the WAL in between on the server, and returns where it stands.
func (c *Conn) AdvanceSlot(ctx context.Context, name string, to pglogrepl.LSN) (pglogrepl.LSN, error) {
	sql := fmt.Sprintf("SELECT end_lsn FROM pg_replication_slot_advance(%s, '%s')", quoteLiteral(name), to)
	lsn, err := c.queryLSN(ctx, sql)
	if err != nil {
		return 0, fmt.Errorf("advance replication slot %q to %s: %w", name, to, err)
	}
	return lsn, nil
}

// CurrentWAL is pg_current_wal_insert_lsn(): past every transaction that
// has committed, even with synchronous_commit off, whose commit records the
// server may not have flushed (nor will stream) yet. On a hot standby,
// which has no WAL of its own to insert into, it is what the standby has
// replayed: all it can decode.
func (c *Conn) CurrentWAL(ctx context.Context) (pglogrepl.LSN, error) {
	lsn, err := c.queryLSN(ctx, "SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_insert_lsn() END")
	if err != nil {
		return 0, fmt.Errorf("read the current WAL position: %w", err)
	}
	return lsn, nil
}

func (c *Conn) slotPosition(ctx context.Context, name string) (pglogrepl.LSN, error) {
	return c.queryLSN(ctx, "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = "+quoteLiteral(name))
}

// queryLSN runs a one-value query with the simple protocol, the only one a
// walsender speaks.
func (c *Conn) queryLSN(ctx context.Context, sql string) (pglogrepl.LSN, error) {
	res, err := c.conn.Exec(ctx, sql).ReadAll()
	if err != nil {
		return 0, err
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 1 || res[0].Rows[0][0] == nil {
		return 0, fmt.Errorf("no position returned")
	}
	return pglogrepl.ParseLSN(string(res[0].Rows[0][0]))
}

// Start starts streaming slot and returns the Stream, which then owns the
// connection. Postgres starts at the slot's confirmed_flush_lsn (LSN 0 in
// START_REPLICATION; docs/design.md, "Start at the slot"); from is only logged
// and seeds the position reported before the first ack.
func (c *Conn) Start(ctx context.Context, slot string, from pglogrepl.LSN) (*Stream, error) {
	// Messages always: the connector's own (decode.ControlPrefix) carry
	// backfill requests and watermarks, besides any message source.
	args := []string{"proto_version '1'", fmt.Sprintf("publication_names '%s'", c.cfg.Publication), "messages 'true'"}
	err := pglogrepl.StartReplication(ctx, c.conn, pgident.Quote(slot), 0, pglogrepl.StartReplicationOptions{PluginArgs: args})
	if err != nil {
		return nil, startError(slot, from, err)
	}
	c.log.Info("streaming from replication slot", "slot", slot, "publication", c.cfg.Publication, "lsn", from.String(), "host", c.host, "database", c.db)
	return &Stream{cfg: c.cfg, slot: slot, conn: c.conn, log: c.log, sent: from, ending: make(chan struct{})}, nil
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string {
	b := []byte{'\''}
	for i := 0; i < len(s); i++ {
		if s[i] == '\'' {
			b = append(b, '\'')
		}
		b = append(b, s[i])
	}
	return string(append(b, '\''))
}

// TimelineEnd is the position where timeline tli ended in the history of
// the server's current timeline (its switch point, from TIMELINE_HISTORY):
// WAL before it is shared by both, WAL at or after it on tli is not in
// this server's history. ok is false when tli is not an ancestor of the
// current timeline (another history altogether).
func (c *Conn) TimelineEnd(ctx context.Context, tli int32) (end pglogrepl.LSN, ok bool, err error) {
	if c.system.Timeline <= 1 || tli >= c.system.Timeline {
		return 0, false, nil
	}
	res, err := pglogrepl.TimelineHistory(ctx, c.conn, c.system.Timeline)
	if err != nil {
		return 0, false, fmt.Errorf("read the history of timeline %d: %w", c.system.Timeline, err)
	}
	end, ok = timelineEnd(string(res.Content), tli)
	return end, ok, nil
}

// timelineEnd finds tli's switch point in a timeline history file: lines of
// "parentTLI <tab> switchpoint <tab> reason", oldest first.
func timelineEnd(history string, tli int32) (pglogrepl.LSN, bool) {
	for _, line := range strings.Split(history, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || strings.HasPrefix(f[0], "#") {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 32)
		if err != nil || int32(n) != tli {
			continue
		}
		lsn, err := pglogrepl.ParseLSN(f[1])
		if err != nil {
			return 0, false
		}
		return lsn, true
	}
	return 0, false
}

// SameHistory brings a resumed checkpoint onto the server's timeline. Its
// CommitLSN is what a session skips up to (the transactions Kafka already
// holds, sent again after a Postgres restart moved the slot back), and an LSN
// means something only within its WAL history (docs/design.md, "An LSN means
// something only within its WAL history"): after a promotion, the commits up to
// where the checkpoint's timeline ended are shared, those after it are not in
// this server's history, so nothing is skipped. Decide already refused a WAL
// that ends before the checkpoint on the same timeline (a restore).
func (c *Conn) SameHistory(ctx context.Context, rec *checkpoint.Record, log hclog.Logger) error {
	sys := c.System()
	if rec.Timeline == sys.Timeline {
		return nil
	}
	end, ok, err := c.TimelineEnd(ctx, rec.Timeline)
	if err != nil {
		return err
	}
	log.Info("the server's timeline changed since the last checkpoint (a promoted standby)", "from", rec.Timeline, "to", sys.Timeline, "switch_lsn", end.String())
	if !ok || rec.CommitLSN >= end {
		log.Warn("the checkpoint's last delivered commit is not in the new timeline's history; nothing is skipped as already delivered (events may arrive twice, none is lost)",
			"commit_lsn", rec.CommitLSN.String(), "timeline", rec.Timeline, "switch_lsn", end.String())
		rec.CommitLSN = 0
	}
	rec.Timeline = sys.Timeline
	return nil
}
