package tablewatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxcdc/cdc/internal/backfill"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/setup"
)

// lockWait bounds how long lockedRepair waits for the table's writers to
// end; new writers wait behind it as long.
const lockWait = time.Second

// lockedRepair opens the repair of st, another relation under table t's
// name, in one transaction that holds the table's writers off (LOCK ...
// IN SHARE MODE, granted once every transaction that wrote to it has
// ended, and holding off new ones until it commits), adding it to the
// publication first when add is set. The repair's snapshot is that
// transaction's, exported into the snapshot's own (tableread.NewSnapshot), and
// its message is written in it. So the snapshot holds every row the table
// received before the message and no other, and every row after the
// message is in the stream after it:
//
//   - added here, the table joins the publication at the message, and the
//     rows go there, before every event of any table committed after it.
//     A snapshot taken after the ALTER committed (startRepair) held rows
//     committed after it too, and the other tables' events committed
//     between went ahead of the older rows;
//   - published already, the snapshot's rows go where the stream meets the
//     relation's first event (Before), or at the message. A relation the
//     stream passed over as unmapped until the message (one a schema's
//     rename put under the name, which pgoutput names anew only then) had
//     rows between a later snapshot and its message in neither.
//
// It returns false, having changed nothing, when the lock is not granted
// within lockWait (a long transaction writes to the table, and the writers
// are not held off behind it any longer), or may not be taken (the role
// may only read the table); then the caller repairs as before
// (startRepair), and an added table's order across tables is not kept.
// A hot standby takes no such lock: its caller does not ask.
func (w *Watch) lockedRepair(ctx context.Context, conn *pgx.Conn, t *outbox.Source, st setup.TableState, old uint32, role string, add bool) (bool, error) {
	pub := w.deps.Postgres.Publication
	// Connected before the lock: the writers wait for none of it.
	snap, err := w.deps.NewSnapshot(ctx, t)
	if err != nil {
		return false, err
	}
	registered := false
	defer func() {
		if !registered {
			snap.Close(context.WithoutCancel(ctx))
		}
	}()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) // nothing once committed
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", lockWait.Milliseconds())); err != nil {
		return false, err
	}
	var pe *pgconn.PgError
	if err := lockWriters(ctx, tx, st); errors.As(err, &pe) && (pe.Code == "55P03" || pe.Code == "42501") {
		// lock_not_available, insufficient_privilege
		why := "a transaction writing to it held it past " + lockWait.String()
		if pe.Code == "42501" {
			why = "the connector's role may not lock it (LOCK ... IN SHARE MODE needs UPDATE, DELETE or TRUNCATE on it)"
		}
		w.log.Warn("outbox table was dropped and created again (or another table took its name), and "+why+": repaired without holding its writers off; its rows are sent once every older transaction has ended, in the order they were committed, but after the events of other tables committed meanwhile",
			"table", t.String())
		return false, nil
	} else if err != nil {
		return false, err
	}
	member := st.Member
	if add {
		if _, err := tx.Exec(ctx, setup.AddStatement(pub, st.Table)); err != nil {
			return false, errtext.Fatalf("add outbox table %s to publication %s: %v; as the owner of both run: %s", t, pub, err, setup.AddStatement(pub, st.Table))
		}
		rs, err := setup.ReadRelation(ctx, tx.Conn(), pub, st.OID)
		if err != nil {
			return false, err
		}
		member = rs.Member
	}
	var exported string
	if err := tx.QueryRow(ctx, "SELECT pg_export_snapshot()").Scan(&exported); err != nil {
		return false, fmt.Errorf("export the snapshot of outbox table %s's repair: %w", t, err)
	}
	if err := snap.Begin(ctx, exported); err != nil {
		return false, readError(t, role, err)
	}
	r := &Repair{ID: backfill.NewID(), Table: t, Rel: st.OID, Member: member, Old: old, Snap: snap}
	registered = true // w.drop closes it from here on
	w.mu.Lock()
	w.pending[r.ID] = r
	w.repairing[t] = true
	w.changedLocked() // a stream waiting in Before takes it now, and waits for finish
	w.mu.Unlock()
	b, _ := json.Marshal(decode.Control{Type: ControlRepair, ID: r.ID})
	if _, err := tx.Exec(ctx, "SELECT pg_logical_emit_message(true, $1, $2)", decode.ControlPrefix, string(b)); err != nil {
		w.drop(ctx, r)
		return false, fmt.Errorf("write a table repair's message: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		w.drop(ctx, r)
		return false, err
	}
	// Committed: a failure from here on drops the repair (a stream that
	// took it ends its session), and the next look repairs the table
	// anew; the stream passes over a message no repair is pending for.
	if err := snap.Finish(ctx); err != nil {
		w.drop(ctx, r)
		return true, readError(t, role, err)
	}
	w.log.Warn("outbox table was dropped and created again (or another table took its name); sending the rows it received before it was published, where the stream reaches this point",
		"table", t.String(), "publication", pub, "added", add, "rows", snap.Total)
	return true, nil
}

// readError is err, from opening the snapshot of recreated table t's
// rows; a missing grant to role gets the statement that makes it.
func readError(t *outbox.Source, role string, err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42501" { // insufficient_privilege: a new table has no grants
		return &errtext.Fatal{Msg: fmt.Sprintf("outbox table %s was dropped and created again, and the connector's role may not read the new one to send the rows it received before it was published; as its owner run: %s; then start the connector again",
			t, setup.GrantStatement(setup.Table{TableName: t.Name}, role))}
	}
	return err
}

// onPrimary reports whether conn's server is a primary, where
// lockedRepair may lock.
func onPrimary(ctx context.Context, conn *pgx.Conn) (bool, error) {
	standby, err := postgres.InRecovery(ctx, conn)
	return !standby, err
}

// lockWriters holds off the writers of the table st names, in tx: ONLY
// a table that is not partitioned, so that a writer to a table that
// inherits from it (no outbox) does not keep the repair from holding the
// outbox's writers off; a partitioned table's leaves take inserts of
// their own, and are locked with it.
func lockWriters(ctx context.Context, tx pgx.Tx, st setup.TableState) error {
	var part bool
	if err := tx.QueryRow(ctx, `SELECT coalesce(bool_or(relkind = 'p'), false) FROM pg_class WHERE oid = $1::oid`, st.OID).Scan(&part); err != nil {
		return err
	}
	only := "ONLY "
	if part {
		only = ""
	}
	_, err := tx.Exec(ctx, "LOCK TABLE "+only+st.Table.String()+" IN SHARE MODE")
	return err
}
