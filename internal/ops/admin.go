package ops

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/redrive"
	"github.com/outboxcdc/cdc/internal/replay"
	"github.com/outboxcdc/cdc/internal/setup"
	"github.com/outboxcdc/cdc/internal/sink"
	"github.com/outboxcdc/cdc/internal/wal"
)

// The operator commands: cdc rewind, cdc skip and cdc reset --accept-gap. They
// act on a stopped pipeline's slot and record what they did in its checkpoint,
// so that the next cdc run starts from there and the history says why.

// Rewound is what Rewind did.
type Rewound struct {
	From, To pglogrepl.LSN // the slot's position before and after
	// ParkingsGivenUp counts the parkings that began at or after To: the
	// stream parks their keys again.
	ParkingsGivenUp int
}

// Rewind is the LSN reset of the pipeline itself: with the connector
// stopped, it re-creates the main slot at the start of r (a copy of the
// replay slot, advanced), and records the rewind in the checkpoint. The next
// cdc run re-delivers from there. Only r's From bound is used.
func (o *Ops) Rewind(ctx context.Context, r replay.Range) (Rewound, error) {
	if o.Config.Replay.Window == 0 {
		return Rewound{}, &errtext.Fatal{Msg: "no replay window: a rewind re-creates the slot from the replay slot; set replay.window in the config and let the connector run"}
	}
	sql, err := postgres.ConnectSQL(ctx, o.Config.Postgres)
	if err != nil {
		return Rewound{}, err
	}
	defer sql.Close(context.WithoutCancel(ctx))
	main, err := o.stoppedSlot(ctx, sql, "a rewind")
	if err != nil {
		return Rewound{}, err
	}
	replaySlot, err := setup.InspectSlot(ctx, sql, o.Config.ReplaySlot())
	if err != nil {
		return Rewound{}, err
	}
	if !replaySlot.Exists || replaySlot.WALStatus == "lost" {
		return Rewound{}, &errtext.Fatal{Msg: fmt.Sprintf("the replay slot %q is missing or lost, so there is nothing to rewind to; let the connector run with replay.window set", o.Config.ReplaySlot())}
	}
	conn, err := wal.Connect(ctx, o.Config.Postgres, o.Log.Named("wal"))
	if err != nil {
		return Rewound{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rec, store, err := o.LoadRecord(ctx, conn.System())
	if err != nil {
		return Rewound{}, err
	}
	to, err := replay.WindowStart(r, rec, replaySlot.ConfirmedFlush, o.Config.Replay.Window, o.Config.ReplaySlot())
	if err != nil {
		return Rewound{}, err
	}
	from := rec.Confirmed
	if main.Exists {
		from = main.ConfirmedFlush
	}
	if to > from {
		return Rewound{}, fmt.Errorf("%s is ahead of the slot at %s: a rewind only goes back; the connector will get there by itself", to, from)
	}

	// What stays parked, decided before the slot moves: a parking that
	// cannot be cut at to stops the rewind here.
	parked, dropped, err := o.rewindParked(ctx, rec, to)
	if err != nil {
		return Rewound{}, err
	}

	at, err := o.recreateSlot(ctx, sql, conn, main.Exists, to)
	if err != nil {
		return Rewound{}, err
	}
	if at != to {
		if parked, dropped, err = o.rewindParked(ctx, rec, at); err != nil {
			return Rewound{}, fmt.Errorf("%w; the slot is already at %s: run the rewind again", err, at)
		}
	}
	rec.Parked = parked
	rec.Confirmed = at
	if rec.CommitLSN >= at {
		rec.CommitLSN, rec.CommitTime = 0, time.Time{} // nothing after at counts as delivered now
	}
	rec.Tables = maps.Clone(rec.Tables)
	for name, st := range rec.Tables {
		// A repair's snapshot's view (checkpoint.Table.Seen) would have
		// the stream pass over events the rewind sends again.
		st.Seen = nil
		rec.Tables[name] = st
	}
	rec.UpdatedAt = time.Now()
	rec.AddJump(checkpoint.Jump{Kind: checkpoint.JumpRewind, From: from, To: at, At: rec.UpdatedAt, Reason: "cdc rewind to " + r.String()})
	if err := saveNext(ctx, store, rec); err != nil {
		return Rewound{}, fmt.Errorf("%w; the slot is already at %s: run the rewind again", err, at)
	}
	o.Log.Warn("rewound the pipeline; the next cdc run re-delivers from here", "slot", o.Config.Postgres.Slot, "from", from.String(), "to", at.String())
	return Rewound{From: from, To: at, ParkingsGivenUp: dropped}, nil
}

// recreateSlot drops the main slot (when it exists), copies the replay
// slot as the main one and advances it to to: where it is then. Should
// this stop half-way, the slot is missing while the checkpoint exists:
// cdc run refuses that, and running the rewind again finishes it.
func (o *Ops) recreateSlot(ctx context.Context, sql *pgx.Conn, conn *wal.Conn, exists bool, to pglogrepl.LSN) (pglogrepl.LSN, error) {
	if exists {
		if _, err := sql.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, o.Config.Postgres.Slot); err != nil {
			return 0, fmt.Errorf("drop replication slot %q: %w", o.Config.Postgres.Slot, err)
		}
	}
	at, err := conn.CopySlot(ctx, o.Config.ReplaySlot(), o.Config.Postgres.Slot, false)
	if err != nil || to <= at {
		return at, err
	}
	return conn.AdvanceSlot(ctx, o.Config.Postgres.Slot, to)
}

// rewindParked is what stays parked after a rewind to at: the stream
// sends every event from at again, so a parking that began at or after at
// is given up (its key parks again where its first event is met, if it is
// invalid still), and one that began before keeps only its records of
// events before at (the stream parks the key's later ones again, behind
// them). Without that, re-streamed older events would go behind newer
// parked ones, and a redrive would end the key on a stale event. Records
// of rows read from the table (a backfill's, a repair's) are kept
// whatever at is, since no stream carries them again: a parking that
// holds them is cut, never given up (redrive.Runner.Cut).
func (o *Ops) rewindParked(ctx context.Context, rec checkpoint.Record, at pglogrepl.LSN) ([]checkpoint.Parked, int, error) {
	var kept []checkpoint.Parked
	dropped := 0
	r := &redrive.Runner{Kafka: sink.ClientOpts(o.Config.Kafka, o.Log.Named("kafka")), Committed: o.Config.IsExactlyOnce(),
		Keys: o.Config.Checkpoint.SigningKeys, Key: rec.Key(), ChunkRecords: 1000, ChunkBytes: 1 << 20, Log: o.Log}
	for _, p := range rec.Parked {
		if p.FirstLSN >= at && !p.Read {
			dropped++
			o.Log.Warn("rewind: a parking that began after the rewind's position is given up; the stream parks the key again where its first event is, if it is invalid still", "key", p.Key, "first_lsn", p.FirstLSN.String(), "episode", p.Episode)
			continue
		}
		cut, err := r.Cut(ctx, &p, at)
		var refused *errtext.Fatal
		if errors.As(err, &refused) {
			return nil, 0, err
		}
		if err != nil {
			return nil, 0, fmt.Errorf("read the parked records of key %q: %w", p.Key, err)
		}
		if cut < p.Events {
			o.Log.Info("rewind: a parking keeps its events from before the rewind's position; the stream parks the key's later events again behind them", "key", p.Key, "kept", cut, "of", p.Events)
		}
		p.Events, p.Released = cut, min(p.Released, cut)
		// Runs that start past the cut own no record now; the next
		// session's run takes the numbers from cut+1 on.
		p.Runs = slices.DeleteFunc(slices.Clone(p.Runs), func(r checkpoint.Run) bool { return r.From > cut })
		kept = append(kept, p)
	}
	return kept, dropped, nil
}

// stoppedSlot is the pipeline's slot, which no connector may hold for
// what (a command that changes the checkpoint of a stopped pipeline).
func (o *Ops) stoppedSlot(ctx context.Context, sql *pgx.Conn, what string) (setup.SlotState, error) {
	slot, err := setup.InspectSlot(ctx, sql, o.Config.Postgres.Slot)
	// A connector stopped a moment ago: its walsender lets the slot go as
	// it exits, just after the connection closed. A running one still
	// holds it after this.
	for deadline := time.Now().Add(2 * time.Second); err == nil && slot.Active && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		slot, err = setup.InspectSlot(ctx, sql, o.Config.Postgres.Slot)
	}
	if err != nil {
		return slot, err
	}
	if slot.Active {
		return slot, &errtext.Fatal{Msg: fmt.Sprintf("replication slot %q is in use by process %d: stop the connector (every instance) before %s", o.Config.Postgres.Slot, slot.ActivePID, what)}
	}
	return slot, nil
}

// Accepted is the gap AcceptGap recorded; nil Gap: there was none.
type Accepted struct {
	Gap      *checkpoint.GapError
	LostSlot bool          // Postgres had invalidated the slot, and it was re-created
	From, To pglogrepl.LSN // events committed in between may be missing
}

// Rewindable reports whether cdc rewind could re-create the slot at to
// now: a replay window is configured, and its slot exists, is not lost, and
// is not past to. Any failure to find out is a no.
func (o *Ops) Rewindable(ctx context.Context, to pglogrepl.LSN) bool {
	if o.Config.Replay.Window == 0 {
		return false
	}
	sql, err := postgres.ConnectSQL(ctx, o.Config.Postgres)
	if err != nil {
		return false
	}
	defer sql.Close(context.WithoutCancel(ctx))
	rs, err := setup.InspectSlot(ctx, sql, o.Config.ReplaySlot())
	return err == nil && rs.Exists && rs.WALStatus != "lost" && rs.ConfirmedFlush <= to
}

// Skip is cdc skip: with the connector stopped on invalid event id of the
// transaction at commit lsn, it records in the checkpoint that the next
// session sends that event to its table's dead-letter topic, with why it
// is invalid, instead of stopping on it (whatever on_invalid says), and
// returns that topic. The event is written there before the stream goes
// past it: nothing is dropped. The skip is forgotten once its transaction
// is delivered.
func (o *Ops) Skip(ctx context.Context, lsn pglogrepl.LSN, id string) (string, error) {
	sql, err := postgres.ConnectSQL(ctx, o.Config.Postgres)
	if err != nil {
		return "", err
	}
	defer sql.Close(context.WithoutCancel(ctx))
	// A running session writes its own checkpoints, which would not carry
	// the skip.
	slot, err := o.stoppedSlot(ctx, sql, "cdc skip")
	if err != nil {
		return "", err
	}
	if slot.Exists && lsn < slot.ConfirmedFlush {
		return "", &errtext.Fatal{Msg: fmt.Sprintf("the transaction at %s is before the slot's position %s: the connector is past it already; check --lsn against the error", lsn, slot.ConfirmedFlush)}
	}
	conn, err := wal.Connect(ctx, o.Config.Postgres, o.Log.Named("wal"))
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rec, store, err := o.LoadRecord(ctx, conn.System())
	if err != nil {
		return "", err
	}
	skip := checkpoint.Skip{CommitLSN: lsn, ID: id}
	if !slices.Contains(rec.Skips, skip) {
		rec.Skips = append(slices.Clone(rec.Skips), skip)
	}
	rec.UpdatedAt = time.Now()
	if err := saveNext(ctx, store, rec); err != nil {
		return "", err
	}
	o.Log.Info("recorded a skip in the checkpoint", "lsn", lsn.String(), "id", id)
	topics := map[string]bool{}
	var names []string
	for _, t := range o.Config.Tables {
		if !topics[t.DeadLetterTopic] {
			topics[t.DeadLetterTopic] = true
			names = append(names, t.DeadLetterTopic)
		}
	}
	return strings.Join(names, " or "), nil
}

// AcceptGap is cdc reset --accept-gap: it records in the checkpoint (and
// the log) that events between the checkpoint and the slot may be missing,
// creating the slot when it is missing or lost, so that the next cdc run
// streams from the slot. Without a gap it changes nothing.
func (o *Ops) AcceptGap(ctx context.Context) (Accepted, error) {
	slot, _, err := setup.Prepare(ctx, o.Config.Postgres, o.Config.WALTables(), o.Log)
	var lostBy *postgres.SlotLost
	lost := errors.As(err, &lostBy)
	if err != nil && !lost {
		return Accepted{}, err
	}
	if slot.Active {
		return Accepted{}, &errtext.Fatal{Msg: fmt.Sprintf("replication slot %q is in use by process %d: stop the connector first", o.Config.Postgres.Slot, slot.ActivePID)}
	}
	conn, err := wal.Connect(ctx, o.Config.Postgres, o.Log.Named("wal"))
	if err != nil {
		return Accepted{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	sys := conn.System()
	store, err := checkpoint.OpenStore(ctx, o.Config.Checkpoint.Topic, sink.ClientOpts(o.Config.Kafka, o.Log.Named("kafka")), o.Log.Named("checkpoint"))
	if err != nil {
		return Accepted{}, err
	}
	store.SignWith(o.Config.Checkpoint.SigningKeys)
	records, err := store.Load(ctx, false)
	if err != nil {
		return Accepted{}, err
	}
	if lost {
		// The lost slot's WAL is gone: start over, as after a drop.
		if err := o.dropSlot(ctx); err != nil {
			return Accepted{}, err
		}
		slot = setup.SlotState{}
	}
	_, _, err = checkpoint.Decide(o.Config.Postgres.Slot, sys.ID, SlotInfo(conn, slot), records)
	var gap *checkpoint.GapError
	if !errors.As(err, &gap) {
		if err == nil && lost {
			o.Log.Warn("dropped the lost replication slot; cdc run creates a new one", "slot", o.Config.Postgres.Slot)
			return Accepted{LostSlot: true}, nil
		}
		return Accepted{}, err // nil: no gap, nothing to accept
	}
	rec := gap.Checkpoint
	if gap.Kind == checkpoint.GapOtherSystem {
		// This system gets its own record; the other one's stays.
		rec = checkpoint.Record{Slot: o.Config.Postgres.Slot, SystemID: sys.ID}
	}
	rec.Timeline, rec.Version, rec.Address = sys.Timeline, o.Version, conn.Address()
	at := slot.ConfirmedFlush
	if !slot.Exists {
		if at, err = conn.CreateSlot(ctx, o.Config.Postgres.Slot); err != nil {
			return Accepted{}, err
		}
	}
	from, reason := gap.Checkpoint.Confirmed, gapReason(gap, lostBy)
	rec.Confirmed, rec.UpdatedAt = at, time.Now()
	if rec.CommitLSN >= at {
		// A new WAL history starts at the slot (docs/design.md, "An LSN means
		// something only within its WAL history"): after a restore, new
		// transactions reuse the positions the old history's commits had, and
		// skipping them as delivered would drop them.
		rec.CommitLSN, rec.CommitTime = 0, time.Time{}
	}
	rec.ForgetCoverage()
	rec.AddJump(checkpoint.Jump{Kind: checkpoint.JumpAcceptedGap, From: from, To: at, At: rec.UpdatedAt, Reason: reason})
	if err := saveNext(ctx, store, rec); err != nil {
		return Accepted{}, err
	}
	o.Log.Warn("accepted a gap: events committed in this range may never be delivered", "slot", o.Config.Postgres.Slot,
		"from", from.String(), "to", at.String(), "reason", reason)
	return Accepted{Gap: gap, LostSlot: lost, From: from, To: at}, nil
}

// dropSlot drops the pipeline's slot.
func (o *Ops) dropSlot(ctx context.Context) error {
	sql, err := postgres.ConnectSQL(ctx, o.Config.Postgres)
	if err != nil {
		return err
	}
	defer sql.Close(context.WithoutCancel(ctx))
	if _, err := sql.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, o.Config.Postgres.Slot); err != nil {
		return fmt.Errorf("drop lost replication slot %q: %w", o.Config.Postgres.Slot, err)
	}
	return nil
}

// gapReason is why a gap was accepted, for the checkpoint's jump: lost,
// when Postgres had invalidated the slot, says what did it.
func gapReason(gap *checkpoint.GapError, lost *postgres.SlotLost) string {
	if lost != nil {
		if lost.Setting == "" {
			return "the slot was lost"
		}
		return fmt.Sprintf("the slot was lost (%s)", lost.Setting)
	}
	return map[checkpoint.GapKind]string{
		checkpoint.GapSlotMissing: "the slot was missing",
		checkpoint.GapSlotAhead:   "the slot was past the checkpoint",
		checkpoint.GapOtherSystem: "the checkpoint was of database system " + gap.Checkpoint.SystemID,
		checkpoint.GapHistory:     "the server's WAL ended before the checkpoint (a restored backup)",
	}[gap.Kind]
}

// saveNext writes rec as the record after the one it was read as
// (checkpoint.Record.Seq).
func saveNext(ctx context.Context, store *checkpoint.Store, rec checkpoint.Record) error {
	rec.Seq++
	return store.Save(ctx, rec)
}
