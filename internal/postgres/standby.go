package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/outboxcdc/cdc/internal/errtext"
)

// A hot standby of PostgreSQL 16 or later can hold a logical slot and
// decode the WAL it replays, which keeps the decoding work off the primary
// (docs/operations.md, "Streaming from a replica"). It cannot write: what
// the connector writes to Postgres (a publication, the logical decoding
// messages of backfill watermarks, requests and repairs, retention's
// deletes) goes to postgres.primary_url, looked up each time, so that after
// a promotion the promoted server is written to itself.

// MinStandbyMajor is the oldest PostgreSQL whose standbys decode.
const MinStandbyMajor = 16

// StandbyError is a step a hot standby cannot take, asked of a connector
// that has no postgres.primary_url.
type StandbyError struct {
	What      string // "create the publication", ...
	Statement string // what to run on the primary instead, if any
}

func (e *StandbyError) Error() string {
	s := fmt.Sprintf("postgres.url is a hot standby, which cannot %s: set postgres.primary_url to its primary, so that the connector does it there", e.What)
	if e.Statement != "" {
		s += ", or run on the primary: " + e.Statement
	}
	return s
}

// NewStandbyError is a *errtext.Fatal (the connector stops: only the operator
// can set primary_url or run the statement) that wraps the StandbyError.
func NewStandbyError(what, statement string) error {
	e := &StandbyError{What: what, Statement: statement}
	return &errtext.Fatal{Msg: e.Error(), Err: e}
}

// InRecovery reports whether conn's server is a hot standby.
func InRecovery(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var standby bool
	if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&standby); err != nil {
		return false, fmt.Errorf("read pg_is_in_recovery: %w", err)
	}
	return standby, nil
}

// ConnectPrimary opens a SQL connection to postgres.primary_url, with
// postgres.url's password file, and makes sure it is not in recovery too.
// what says what it is for, in the error when there is no primary_url.
func ConnectPrimary(ctx context.Context, cfg Config, what, statement string) (*pgx.Conn, error) {
	if cfg.PrimaryURL == "" {
		return nil, NewStandbyError(what, statement)
	}
	pc := cfg
	pc.URL = cfg.PrimaryURL
	conn, err := ConnectSQL(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("postgres.primary_url: %w", err)
	}
	standby, err := InRecovery(ctx, conn)
	if err == nil && standby {
		err = errtext.Fatalf("postgres.primary_url reaches a server in recovery too, which cannot %s either; point it at the primary", what)
	}
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return conn, nil
}

// ConnectWritable opens a SQL connection to a server that can write: the
// one postgres.url reaches, or, while that is a standby, postgres.primary_url's.
// Without a primary_url it returns the standby's, and standby true.
func ConnectWritable(ctx context.Context, cfg Config) (conn *pgx.Conn, standby bool, err error) {
	conn, err = ConnectSQL(ctx, cfg)
	if err != nil {
		return nil, false, err
	}
	standby, err = InRecovery(ctx, conn)
	if err != nil || !standby || cfg.PrimaryURL == "" {
		if err != nil {
			conn.Close(context.WithoutCancel(ctx))
			return nil, false, err
		}
		return conn, standby, nil
	}
	conn.Close(context.WithoutCancel(ctx))
	conn, err = ConnectPrimary(ctx, cfg, "write", "")
	return conn, false, err
}

// Writer writes logical decoding messages where they can be written: on
// local's server while it is a primary, on postgres.primary_url's while it
// is a standby (one connection, kept). It looks each time, so that after a
// promotion it writes locally.
type Writer struct {
	cfg     Config
	primary *pgx.Conn
}

// NewWriter returns a Writer for cfg.
func NewWriter(cfg Config) *Writer { return &Writer{cfg: cfg} }

// Emit writes a transactional logical decoding message (prefix, content)
// in a transaction of its own. local is a connection to postgres.url, not
// in a transaction; what names the message, for errors.
func (w *Writer) Emit(ctx context.Context, local *pgx.Conn, prefix, content, what string) error {
	standby, err := InRecovery(ctx, local)
	if err != nil {
		return err
	}
	target := local
	if standby {
		if w.primary == nil || w.primary.IsClosed() {
			w.primary, err = ConnectPrimary(ctx, w.cfg, "write "+what+" (a logical decoding message)", "")
			if err != nil {
				return err
			}
		}
		target = w.primary
	}
	if _, err := target.Exec(ctx, "SELECT pg_logical_emit_message(true, $1, $2::text)", prefix, content); err != nil {
		if standby {
			w.Close(ctx)
		}
		return fmt.Errorf("write %s: %w", what, err)
	}
	return nil
}

// Close closes the primary's connection, if one is open.
func (w *Writer) Close(ctx context.Context) {
	if w.primary != nil {
		w.primary.Close(context.WithoutCancel(ctx))
		w.primary = nil
	}
}

// EmitMessage is Emit for a single message: a connection to the primary,
// when one is needed, is opened and closed for it.
func EmitMessage(ctx context.Context, cfg Config, local *pgx.Conn, prefix, content, what string) error {
	w := NewWriter(cfg)
	defer w.Close(ctx)
	return w.Emit(ctx, local, prefix, content, what)
}

// LogStandbySnapshot asks the primary to log a running-transactions
// record (pg_log_standby_snapshot), which a slot being created on a
// standby waits for: without it, the primary logs one about every 15
// seconds while it is busy. Best effort: the role may lack the right.
func LogStandbySnapshot(ctx context.Context, cfg Config) error {
	if cfg.PrimaryURL == "" {
		return nil
	}
	conn, err := ConnectPrimary(ctx, cfg, "log a standby snapshot", "")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, "SELECT pg_log_standby_snapshot()")
	return err
}

// CatchUp waits, when conn's server is a hot standby, until it has
// replayed what postgres.primary_url had written when CatchUp was called:
// what the connector just did on the primary (added a table to the
// publication) is then visible on the standby, with every row committed
// before it. On a primary it returns at once.
func CatchUp(ctx context.Context, cfg Config, conn *pgx.Conn) error {
	standby, err := InRecovery(ctx, conn)
	if err != nil || !standby {
		return err
	}
	primary, err := ConnectPrimary(ctx, cfg, "tell how far the primary has written", "")
	if err != nil {
		return err
	}
	var end string
	err = primary.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&end)
	primary.Close(context.WithoutCancel(ctx))
	if err != nil {
		return fmt.Errorf("read the primary's WAL position: %w", err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		var caught bool
		if err := conn.QueryRow(ctx, "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)", end).Scan(&caught); err != nil {
			return fmt.Errorf("read the standby's replay position: %w", err)
		}
		if caught {
			return nil
		}
		if time.Now().After(deadline) {
			return errtext.Fatalf("the standby has not replayed the primary's WAL up to %s after a minute: is it replicating from postgres.primary_url?", end)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
