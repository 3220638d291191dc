package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/backfill"
	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/delivery"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/ops"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/replay"
	"github.com/outboxcdc/cdc/internal/session"
	"github.com/outboxcdc/cdc/internal/setup"
	"github.com/outboxcdc/cdc/internal/sink"
	"github.com/outboxcdc/cdc/internal/tablewatch"
	"github.com/outboxcdc/cdc/internal/wal"
)

// start checks Postgres, opens the replication connection, and works out where
// the session streams from. Every session compares the slot with the checkpoint
// (docs/design.md, "The slot is not the connector's memory"): it creates the
// slot on a first start and refuses a gap. A first start is a state, not a
// session (docs/design.md, "A first start is a state, not a session"): until
// the slot and its checkpoint exist, every session is one, whatever ended the
// sessions before it (Kafka or Postgres not up yet, a fence, a topic); once
// this process has streamed, a missing slot is a gap.
//
// opening, when not nil, is the checkpoint store the session started
// opening (runSession); connected, when set, runs once the database system
// is known (exactly once: the fence).
func (p *Pipeline) start(ctx context.Context, opening *checkpoint.Opening, connected func(wal.System) error) (session.Start, error) {
	slot, cat, err := setup.Prepare(ctx, p.cfg.Postgres, p.cfg.WALTables(), p.log)
	if err != nil {
		return session.Start{}, err
	}
	conn, err := wal.Connect(ctx, p.cfg.Postgres, p.log.Named("wal"))
	if err != nil {
		return session.Start{}, err
	}
	p.log.Debug("postgres: replication connection open", "slot_exists", slot.Exists)
	if conn.Standby() != p.onStandby {
		// Said at the first session, and again after a promotion.
		p.onStandby = conn.Standby()
		if p.onStandby {
			p.log.Info("postgres.url is a hot standby: the slot is the standby's and decoding runs there; what it cannot write goes to postgres.primary_url",
				"primary_url_set", p.cfg.Postgres.PrimaryURL != "")
		} else if p.progress != nil {
			p.log.Info("postgres.url is a primary now (the standby was promoted): the connector writes to it directly")
		}
	}
	if slot.Active {
		// Another instance streams (or a walsender of this one that
		// Postgres has not ended yet): wait as a standby, without
		// touching the checkpoint or, in exactly-once mode, fencing it.
		conn.Close(context.WithoutCancel(ctx))
		return session.Start{}, &postgres.SlotInUseError{Slot: p.cfg.Postgres.Slot, Err: fmt.Errorf("replication slot %q is active for PID %d", p.cfg.Postgres.Slot, slot.ActivePID)}
	}
	if connected != nil {
		if err := connected(conn.System()); err != nil {
			conn.Close(context.WithoutCancel(ctx))
			return session.Start{}, err
		}
	}
	from, snapshot, err := p.position(ctx, conn, slot, cat, opening)
	if err != nil {
		conn.Close(context.WithoutCancel(ctx)) // the snapshot ends with it
		return session.Start{}, err
	}
	return session.Start{Conn: conn, From: from, Catalog: cat, Snapshot: snapshot}, nil
}

// position reads the checkpoint, compares it with the slot, and returns
// where the session streams from, creating the slot on a first start
// (with a snapshot for the tables' backfill when they have one).
func (p *Pipeline) position(ctx context.Context, conn *wal.Conn, slot setup.SlotState, cat setup.Catalog, opening *checkpoint.Opening) (from pglogrepl.LSN, snapshot string, err error) {
	sys := conn.System()
	if p.progress != nil && !slot.Exists {
		saved := p.progress.Saved()
		return 0, "", &errtext.Fatal{Err: postgres.ErrSlotVanished, Msg: fmt.Sprintf(
			"replication slot %q vanished while the connector was running (dropped, or Postgres failed over without failover slots); events committed after %s may never be delivered; "+
				"recover them (the outbox table may still hold them), then accept the gap: cdc reset --config %s --accept-gap", p.cfg.Postgres.Slot, saved.Confirmed, p.configFile())}
	}
	// Every session reads the checkpoint: another replica may have
	// streamed, and moved the slot and the checkpoint, since this one
	// last did (docs/operations.md, "Active and standby").
	if err := p.openStore(ctx, opening); err != nil {
		return 0, "", err
	}
	records, err := p.store.Load(ctx, p.cfg.IsExactlyOnce())
	if err != nil {
		return 0, "", err
	}
	p.log.Debug("checkpoint read", "records", len(records))
	start, rec, err := checkpoint.Decide(p.cfg.Postgres.Slot, sys.ID, ops.SlotInfo(conn, slot), records)
	if err != nil {
		var gap *checkpoint.GapError
		if errors.As(err, &gap) {
			gap.ConfigFile = p.opts.ConfigFile
			gap.Rewindable = p.ops.Rewindable(ctx, gap.Checkpoint.Confirmed)
		}
		return 0, "", err
	}
	from = slot.ConfirmedFlush
	switch start {
	case checkpoint.StartCreate:
		if rec, from, snapshot, err = p.firstStart(ctx, conn, cat, records); err != nil {
			return 0, "", err
		}
	case checkpoint.StartAdopt:
		if rec, err = p.adopt(ctx, conn, cat, from); err != nil {
			return 0, "", err
		}
	case checkpoint.StartResume:
		if err := p.carryOver(ctx, rec); err != nil {
			return 0, "", err
		}
		if err := conn.SameHistory(ctx, rec, p.log); err != nil {
			return 0, "", err
		}
		if err := tablewatch.Baseline(ctx, p.tableDeps(), rec, cat, false); err != nil {
			return 0, "", err
		}
		rec.Address = conn.Address()
	}
	// The jobs a checkpoint read back carries run only when they are the
	// configuration's or a signed request's: anyone who may produce to
	// the topic could have written them.
	kept, refused := backfill.Trusted(rec.Backfills, p.cfg.Checkpoint.SigningKeys, rec.Key(), p.cfg.Tables)
	for _, j := range refused {
		p.m.ForgedRequests.Inc()
		p.log.Warn("ignored a backfill job in the checkpoint that no signed request started (written to the checkpoint topic by someone else, or before the connector kept requests' signatures); run cdc backfill again if it is yours",
			"job", j.ID, "table", j.Table)
	}
	rec.Backfills = kept
	if start != checkpoint.StartResume {
		// Saved before streaming: from now on a missing slot is a gap.
		rec.Seq++
		if err := p.store.Save(ctx, *rec); err != nil {
			return 0, "", err
		}
	}
	p.progress = delivery.NewProgress(*rec, p.cfg.Replay.Window)
	if err := p.window().Prepare(ctx, from); err != nil {
		p.progress = nil
		return 0, "", err
	}
	return from, snapshot, nil
}

// adopt starts a checkpoint record at from, the position of a slot that
// has none: one made by someone else, or by a first start that stopped
// before its checkpoint. The rows before it are backfilled before the
// stream, in a snapshot of now (backfill.Runner.Continue): that snapshot
// shows some rows the stream sends too, which arrive twice.
func (p *Pipeline) adopt(ctx context.Context, conn *wal.Conn, cat setup.Catalog, from pglogrepl.LSN) (*checkpoint.Record, error) {
	p.log.Info("the replication slot has no checkpoint yet; starting one at its position", "slot", p.cfg.Postgres.Slot, "lsn", from.String(), "topic", p.cfg.Checkpoint.Topic)
	rec := p.newRecord(conn, from)
	if err := tablewatch.Baseline(ctx, p.tableDeps(), rec, cat, true); err != nil {
		return nil, err
	}
	if rec.Backfills = backfill.InitialJobs(p.cfg.Tables, false, rec.Tables); len(rec.Backfills) > 0 {
		p.log.Info("the configured backfills run before the stream, in a snapshot of now; the rows committed since the slot's position that match arrive twice", "tables", len(rec.Backfills))
	}
	return rec, tablewatch.Floors(ctx, p.tableDeps(), rec)
}

// firstStart creates the slot of a first start and the checkpoint record
// that starts at it, with the tables' baseline and their initial backfill
// jobs; with jobs, the slot comes with an exported snapshot of its
// consistent point, in which they read the rows committed before it
// (docs/design.md, "Backfill consistency").
func (p *Pipeline) firstStart(ctx context.Context, conn *wal.Conn, cat setup.Catalog, records map[string]checkpoint.Record) (rec *checkpoint.Record, from pglogrepl.LSN, snapshot string, err error) {
	sys := conn.System()
	for _, other := range records {
		if other.Slot == p.cfg.Postgres.Slot && other.SystemID != sys.ID {
			p.log.Warn("another database system's checkpoint uses this slot name, written from another address: starting as a separate pipeline; if this connector moved to a new server, events committed there before now are not streamed (backfill them)",
				"slot", other.Slot, "other_system", other.SystemID, "other_address", other.Address, "address", conn.Address())
		}
	}
	rec = p.newRecord(conn, 0)
	// Every table in the publication before the slot exists: its
	// consistent point is where the stream starts.
	if err := tablewatch.Baseline(ctx, p.tableDeps(), rec, cat, true); err != nil {
		return nil, 0, "", err
	}
	if rec.Backfills = backfill.InitialJobs(p.cfg.Tables, true, rec.Tables); len(rec.Backfills) > 0 {
		// A condition or order that does not work stops the first
		// start before anything exists.
		if err := p.backfills().Check(ctx, rec.Backfills); err != nil {
			return nil, 0, "", err
		}
		// The backfill reads the rows committed before the slot in the snapshot
		// of its consistent point (docs/design.md, "Backfill consistency").
		err := p.whileCreatingSlot(ctx, conn.Standby(), func() (err error) {
			from, snapshot, err = conn.CreateSlotWithSnapshot(ctx, p.cfg.Postgres.Slot)
			return err
		})
		if err != nil {
			return nil, 0, "", err
		}
		p.log.Info("first start: created the replication slot; rows committed before this position are sent by the tables' backfill, the rest by the stream", "slot", p.cfg.Postgres.Slot, "lsn", from.String())
	} else {
		err := p.whileCreatingSlot(ctx, conn.Standby(), func() (err error) {
			from, err = conn.CreateSlot(ctx, p.cfg.Postgres.Slot)
			return err
		})
		if err != nil {
			return nil, 0, "", err
		}
		p.log.Warn("first start: created the replication slot; events committed before this position are not streamed (set backfill on a table to send them)", "slot", p.cfg.Postgres.Slot, "lsn", from.String())
	}
	rec.Confirmed = from
	// What the stream covers of each table (retention deletes on it).
	if err := tablewatch.Floors(ctx, p.tableDeps(), rec); err != nil {
		return nil, 0, "", err
	}
	return rec, from, snapshot, nil
}

// whileCreatingSlot runs create, which creates the slot, and says in the
// log and in /readyz what the creation waits for
// (setup.WhileCreatingSlot).
func (p *Pipeline) whileCreatingSlot(ctx context.Context, standby bool, create func() error) error {
	return setup.WhileCreatingSlot(ctx, p.cfg.Postgres, standby, p.log, func(detail string) { p.setState(false, detail) }, create)
}

// openStore opens the checkpoint store, creating its topic when missing,
// or takes the one the session started opening (opening, when not nil).
func (p *Pipeline) openStore(ctx context.Context, opening *checkpoint.Opening) error {
	if p.store != nil {
		return nil
	}
	if opening == nil {
		opening = checkpoint.StartOpen(ctx, p.cfg.Checkpoint.Topic, sink.ClientOpts(p.cfg.Kafka, p.log.Named("kafka")), p.log.Named("checkpoint"))
	}
	store, err := opening.Wait()
	if err != nil {
		return err
	}
	p.log.Debug("checkpoint topic ready", "topic", p.cfg.Checkpoint.Topic)
	store.OnForeign = p.m.ForeignRecords.Inc
	store.SignWith(p.cfg.Checkpoint.SigningKeys)
	p.store = store
	return nil
}

func (p *Pipeline) newRecord(conn *wal.Conn, at pglogrepl.LSN) *checkpoint.Record {
	sys := conn.System()
	return &checkpoint.Record{Slot: p.cfg.Postgres.Slot, SystemID: sys.ID, Timeline: sys.Timeline, Address: conn.Address(),
		Confirmed: at, Version: p.opts.Version, UpdatedAt: time.Now()}
}

// carryOver checkpoints what the last session had Kafka acknowledge after
// its last checkpoint (carry), if the checkpoint is still the one this
// process saved last: under the start lock, with the slot free, nobody else
// wrote it since, so moving it on cannot overwrite another replica's
// progress.
func (p *Pipeline) carryOver(ctx context.Context, rec *checkpoint.Record) error {
	c := p.carry
	p.carry = nil
	if c == nil || p.progress == nil {
		return nil
	}
	saved := p.progress.Saved()
	if rec.Confirmed != saved.Confirmed || !rec.UpdatedAt.Equal(saved.UpdatedAt) {
		return nil // another replica streamed since: its checkpoint stands
	}
	next := p.progress.Next(*c, time.Now())
	if err := p.store.Save(ctx, next); err != nil {
		return err
	}
	p.log.Info("checkpointed what Kafka acknowledged before the last session ended; the transactions it covers are skipped if Postgres sends them again",
		"commit_lsn", next.CommitLSN.String(), "confirmed_lsn", next.Confirmed.String())
	*rec = next
	return nil
}

func (p *Pipeline) configFile() string {
	if p.opts.ConfigFile == "" {
		return "<config file>"
	}
	return p.opts.ConfigFile
}

// window is the replay window's keeper, for this session's progress.
func (p *Pipeline) window() *replay.Window {
	return &replay.Window{Postgres: p.cfg.Postgres, Slot: p.cfg.Postgres.Slot, ReplaySlot: p.cfg.ReplaySlot(), Length: p.cfg.Replay.Window,
		Progress: p.progress, Log: p.log, Metrics: p.m}
}
