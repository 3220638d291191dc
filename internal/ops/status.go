package ops

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pgident"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/setup"
	"github.com/outboxcdc/cdc/internal/sink"
)

// Status is what cdc status reports: the slot, the publication, the
// checkpoint and the replay window, read from Postgres and Kafka without
// changing anything. Its JSON is cdc status --json.
type Status struct {
	Server      ServerStatus      `json:"server"`
	Slot        SlotStatus        `json:"slot"`
	Publication PublicationStatus `json:"publication"`
	Checkpoint  *CheckpointStatus `json:"checkpoint,omitempty"`
	// CheckpointError says why the checkpoint could not be read.
	CheckpointError string        `json:"checkpoint_error,omitempty"`
	ReplayWindow    *WindowStatus `json:"replay_window,omitempty"`
	// Retention is each table with retention: what it keeps.
	Retention []RetentionStatus `json:"retention,omitempty"`
}

// RetentionStatus is what a table with retention holds: its rows, and the
// oldest one's timestamp field when the table maps one.
type RetentionStatus struct {
	Table  string     `json:"table"`
	After  string     `json:"after"`
	Mode   string     `json:"mode"`
	Rows   int64      `json:"rows"`
	Oldest *time.Time `json:"oldest_row,omitempty"`
	Error  string     `json:"error,omitempty"`
}

// ServerStatus is the server postgres.url reaches: a primary, or a hot
// standby (PostgreSQL 16+) with how far its replay is behind.
type ServerStatus struct {
	Role    string `json:"role"` // "primary" or "standby"
	Version int    `json:"version"`
	// ReplayDelaySeconds is, on a standby, how long ago the last
	// transaction it replayed committed on the primary.
	ReplayDelaySeconds *float64 `json:"replay_delay_seconds,omitempty"`
}

// SlotStatus is a slot's row of pg_replication_slots, with lag and
// retained WAL worked out.
type SlotStatus struct {
	Name          string `json:"name"`
	Exists        bool   `json:"exists"`
	Active        bool   `json:"active"`
	ActivePID     int    `json:"active_pid,omitempty"`
	ConfirmedLSN  string `json:"confirmed_lsn,omitempty"`
	RestartLSN    string `json:"restart_lsn,omitempty"`
	WALStatus     string `json:"wal_status,omitempty"`
	SafeWALBytes  *int64 `json:"safe_wal_size_bytes,omitempty"`
	WALEnd        string `json:"wal_end,omitempty"`
	LagBytes      int64  `json:"lag_bytes"`
	RetainedBytes int64  `json:"retained_wal_bytes"`
	// Conflicting: Postgres invalidated the slot on a standby.
	Conflicting bool `json:"conflicting,omitempty"`
	// InvalidationReason is why Postgres invalidated the slot
	// (postgres.InvalidationReason), and LostCause that in words, naming
	// the setting that did it.
	InvalidationReason string `json:"invalidation_reason,omitempty"`
	LostCause          string `json:"lost_cause,omitempty"`
}

// PublicationStatus is the publication and the tables in it.
type PublicationStatus struct {
	Name    string   `json:"name"`
	Exists  bool     `json:"exists"`
	Inserts bool     `json:"publishes_inserts"`
	Tables  []string `json:"tables"`
}

// CheckpointStatus is the pipeline's checkpoint record.
type CheckpointStatus struct {
	Topic        string            `json:"topic"`
	ConfirmedLSN string            `json:"confirmed_lsn"`
	CommitLSN    string            `json:"commit_lsn"`
	CommitTime   *time.Time        `json:"commit_time,omitempty"`
	UpdatedAt    time.Time         `json:"updated_at"`
	Version      string            `json:"connector_version"`
	History      []checkpoint.Jump `json:"history,omitempty"`
	// Backfills are the running and the last finished backfills.
	Backfills []checkpoint.Job `json:"backfills,omitempty"`
	// Parked are the keys on_invalid: park holds back (cdc parked).
	Parked []checkpoint.Parked `json:"parked,omitempty"`
}

// WindowStatus is the replay window.
type WindowStatus struct {
	Window string     `json:"window"`
	Slot   SlotStatus `json:"slot"`
	// FromLSN and FromTime: replays and rewinds can start there.
	FromLSN  string     `json:"from_lsn,omitempty"`
	FromTime *time.Time `json:"from_time,omitempty"`
}

// Status reads the pipeline's state. A Postgres it cannot reach is an
// error; a Kafka it cannot reach leaves CheckpointError set.
func (o *Ops) Status(ctx context.Context) (Status, error) {
	conn, err := postgres.ConnectSQL(ctx, o.Config.Postgres)
	if err != nil {
		return Status{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var st Status
	var standby bool
	var delay *float64
	err = conn.QueryRow(ctx, `SELECT pg_is_in_recovery(), current_setting('server_version_num')::int / 10000,
		CASE WHEN pg_is_in_recovery() THEN extract(epoch FROM now() - pg_last_xact_replay_timestamp())::float8 END`).Scan(&standby, &st.Server.Version, &delay)
	if err != nil {
		return Status{}, fmt.Errorf("read the server's role: %w", err)
	}
	st.Server.Role, st.Server.ReplayDelaySeconds = "primary", delay
	if standby {
		st.Server.Role = "standby"
	}
	if st.Slot, err = slotStatus(ctx, conn, o.Config.Postgres.Slot); err != nil {
		return Status{}, err
	}
	if st.Publication, err = publicationStatus(ctx, conn, o.Config.Postgres.Publication); err != nil {
		return Status{}, err
	}
	var sysid string
	if err := conn.QueryRow(ctx, `SELECT system_identifier::text FROM pg_control_system()`).Scan(&sysid); err != nil {
		return Status{}, err
	}
	rec, found, err := o.readCheckpoint(ctx, sysid)
	switch {
	case err != nil:
		st.CheckpointError = err.Error()
	case !found:
		st.CheckpointError = "no checkpoint yet for this slot and database (the connector has not run, or runs a version without one)"
	default:
		c := &CheckpointStatus{Topic: o.Config.Checkpoint.Topic, ConfirmedLSN: rec.Confirmed.String(), CommitLSN: rec.CommitLSN.String(),
			UpdatedAt: rec.UpdatedAt, Version: rec.Version, History: rec.History, Backfills: rec.Backfills, Parked: rec.Parked}
		if !rec.CommitTime.IsZero() {
			c.CommitTime = &rec.CommitTime
		}
		st.Checkpoint = c
	}
	for _, t := range o.Config.Tables {
		if t.Retention != nil {
			st.Retention = append(st.Retention, retentionStatus(ctx, conn, t))
		}
	}
	if o.Config.Replay.Window > 0 {
		w := &WindowStatus{Window: o.Config.Replay.Window.String()}
		if w.Slot, err = slotStatus(ctx, conn, o.Config.ReplaySlot()); err != nil {
			return Status{}, err
		}
		if w.Slot.Exists && w.Slot.WALStatus != "lost" {
			w.FromLSN = w.Slot.ConfirmedLSN
			if found && !rec.Window.Time.IsZero() {
				w.FromTime = &rec.Window.Time
			}
		}
		st.ReplayWindow = w
	}
	return st, nil
}

// publicationStatus is what the publication holds, if it exists.
func publicationStatus(ctx context.Context, conn *pgx.Conn, name string) (PublicationStatus, error) {
	ps := PublicationStatus{Name: name, Tables: []string{}}
	err := conn.QueryRow(ctx, `SELECT pubinsert FROM pg_publication WHERE pubname = $1`, name).Scan(&ps.Inserts)
	switch {
	case err == pgx.ErrNoRows:
		return ps, nil
	case err != nil:
		return ps, err
	}
	ps.Exists = true
	rows, _ := conn.Query(ctx, `SELECT format('%I.%I', schemaname, tablename) FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1`, name)
	ps.Tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
	return ps, err
}

// retentionStatus is what t holds, for its retention.
func retentionStatus(ctx context.Context, conn *pgx.Conn, t *outbox.Source) RetentionStatus {
	rs := RetentionStatus{Table: t.String(), After: t.Retention.After.String(), Mode: t.Retention.Mode}
	// ONLY a table that is not partitioned, as retention deletes: a table
	// that inherits from it is no outbox.
	from := pgident.QualifiedIdent(t.Name.Schema, t.Name.Name)
	var part bool
	if err := conn.QueryRow(ctx, `SELECT coalesce(bool_or(relkind = 'p'), false) FROM pg_class WHERE oid = to_regclass($1)`, from).Scan(&part); err == nil && !part {
		from = "ONLY " + from
	}
	q := fmt.Sprintf("SELECT count(*), NULL::timestamptz FROM %s", from)
	if col := t.Columns[outbox.FieldTimestamp]; col != "" {
		q = fmt.Sprintf("SELECT count(*), min(%s)::timestamptz FROM %s", pgident.Ident(col), from)
	}
	if err := conn.QueryRow(ctx, q).Scan(&rs.Rows, &rs.Oldest); err != nil {
		rs.Error = errtext.OneLine(err)
	}
	return rs
}

func slotStatus(ctx context.Context, conn *pgx.Conn, name string) (SlotStatus, error) {
	s, err := setup.InspectSlot(ctx, conn, name)
	if err != nil {
		return SlotStatus{}, err
	}
	out := SlotStatus{Name: name, Exists: s.Exists}
	if !s.Exists {
		return out, nil
	}
	out.Active, out.ActivePID, out.WALStatus, out.SafeWALBytes = s.Active, s.ActivePID, s.WALStatus, s.SafeWALSize
	out.ConfirmedLSN, out.WALEnd = s.ConfirmedFlush.String(), s.WALEnd.String()
	if s.RestartLSN != 0 {
		out.RestartLSN = s.RestartLSN.String()
	}
	out.LagBytes, out.RetainedBytes = s.Lag(), s.Retained()
	out.Conflicting = s.Conflicting
	if lost := s.Lost(); lost != nil {
		out.InvalidationReason, out.LostCause = lost.Reason, lost.Cause
	}
	return out, nil
}

// readCheckpoint reads the checkpoint of this slot and system, if any.
func (o *Ops) readCheckpoint(ctx context.Context, sysid string) (checkpoint.Record, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	store := checkpoint.Reader(o.Config.Checkpoint.Topic, sink.ClientOpts(o.Config.Kafka, o.Log.Named("kafka")), o.Log.Named("checkpoint"))
	store.SignWith(o.Config.Checkpoint.SigningKeys)
	recs, err := store.Load(ctx, false)
	if err != nil {
		return checkpoint.Record{}, false, err
	}
	rec, ok := recs[checkpoint.Key(o.Config.Postgres.Slot, sysid)]
	return rec, ok, nil
}
