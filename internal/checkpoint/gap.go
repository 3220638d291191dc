package checkpoint

import (
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
)

// Start says how a pipeline may start, from what it found: its slot, and
// the checkpoint records in the topic.
type Start int

const (
	// StartResume: the checkpoint and the slot agree; stream from the slot.
	StartResume Start = iota
	// StartCreate: a first start; create the slot, then write the first
	// checkpoint.
	StartCreate
	// StartAdopt: the slot exists and has no checkpoint yet (it predates
	// the checkpoint store); write one at its position.
	StartAdopt
)

// SlotInfo is what Postgres says about the pipeline's slot, and about the
// server.
type SlotInfo struct {
	Exists    bool
	Confirmed pglogrepl.LSN // confirmed_flush_lsn, when it exists
	// Timeline and WALEnd are the server's (IDENTIFY_SYSTEM): its timeline
	// and flushed WAL. 0: unknown, not checked.
	Timeline int32
	WALEnd   pglogrepl.LSN
	// Address is where the server was reached (Record.Address).
	Address string
}

// Decide compares the slot with the checkpoint records (Store.Load) and tells a
// first start from a gap (docs/design.md, "The slot is not the connector's
// memory"). The slot alone cannot: a slot dropped while the connector was
// stopped, re-created by someone, or a URL now naming another database all look
// like "no slot yet" from inside Postgres. A gap is a *GapError, refused until
// a person accepts it (cdc reset --accept-gap).
func Decide(slot, systemID string, s SlotInfo, records map[string]Record) (Start, *Record, error) {
	rec, ok := records[Key(slot, systemID)]
	if !ok {
		for _, other := range records {
			// Another system's record for the same slot name is this
			// pipeline's own only if it reached that system where this
			// one reaches its own: the address now serves another system
			// (a pg_upgrade, a dump restored, a URL now naming another
			// database). From another address it is another deployment
			// sharing the topic and the default slot name.
			if other.Slot == slot && other.SystemID != systemID && (other.Address == "" || s.Address == "" || other.Address == s.Address) {
				return 0, nil, &GapError{Kind: GapOtherSystem, Slot: slot, SystemID: systemID, Checkpoint: other}
			}
		}
		if s.Exists {
			return StartAdopt, nil, nil
		}
		return StartCreate, nil, nil
	}
	switch {
	case !s.Exists:
		return 0, nil, &GapError{Kind: GapSlotMissing, Slot: slot, SystemID: systemID, Checkpoint: rec}
	case s.Confirmed > rec.Confirmed:
		return 0, nil, &GapError{Kind: GapSlotAhead, Slot: slot, SystemID: systemID, Checkpoint: rec, SlotLSN: s.Confirmed}
	case s.WALEnd != 0 && s.Timeline == rec.Timeline && s.WALEnd < rec.Confirmed:
		// Everything confirmed was flushed WAL, and a crash replays all of
		// that: a server whose WAL ends before the checkpoint on the same
		// timeline was restored from a backup taken before it (docs/design.md,
		// "An LSN means something only within its WAL history"). Its new
		// transactions reuse the positions the checkpoint covers, so comparing
		// them with it means nothing.
		return 0, nil, &GapError{Kind: GapHistory, Slot: slot, SystemID: systemID, Checkpoint: rec, SlotLSN: s.WALEnd}
	}
	return StartResume, &rec, nil
}

// GapKind is why events may be missing.
type GapKind int

const (
	GapSlotMissing GapKind = iota + 1
	GapSlotAhead
	GapOtherSystem
	// GapHistory: the server's WAL ends before the checkpoint: it was
	// restored from a backup (same system, an older WAL history).
	GapHistory
)

// GapError means events may be missing between the checkpoint and the
// slot: the connector refuses to stream over it.
type GapError struct {
	Kind       GapKind
	Slot       string
	SystemID   string        // this server's
	Checkpoint Record        // the checkpoint found (another system's for GapOtherSystem)
	SlotLSN    pglogrepl.LSN // the slot's position, for GapSlotAhead
	// ConfigFile names the config in the command the message gives.
	ConfigFile string
	// Rewindable: the replay window still holds the WAL from the
	// checkpoint's position, so cdc rewind to it loses nothing, and the
	// message offers that first.
	Rewindable bool
}

func (e *GapError) Error() string {
	c := e.Checkpoint
	last := "no transaction delivered yet"
	if !c.CommitTime.IsZero() {
		last = "last delivered commit at " + c.CommitTime.UTC().Format(time.RFC3339)
	}
	config := e.ConfigFile
	if config == "" {
		config = "<config file>"
	}
	fix := fmt.Sprintf("recover those events (the outbox table may still hold them, or cdc replay if a replay window covers them), then accept the gap explicitly: cdc reset --config %s --accept-gap", config)
	if e.Rewindable && (e.Kind == GapSlotMissing || e.Kind == GapSlotAhead) {
		fix = fmt.Sprintf("the replay window still holds the WAL from %s, so nothing need be lost: cdc rewind --config %s --to-lsn %s re-creates the slot there from the replay slot, and the next start delivers what followed; "+
			"only if that fails, recover the events another way and accept the gap: cdc reset --config %s --accept-gap", c.Confirmed, config, c.Confirmed, config)
	}
	switch e.Kind {
	case GapSlotMissing:
		return fmt.Sprintf("replication slot %q is missing, but the checkpoint shows the connector confirmed it up to %s (%s): the slot was dropped, or Postgres failed over without failover slots, and events committed after %s may never be delivered; %s",
			e.Slot, c.Confirmed, last, c.Confirmed, fix)
	case GapSlotAhead:
		return fmt.Sprintf("replication slot %q is at %s, past the checkpoint's %s (%s): something other than this connector advanced or re-created it, and events committed between %s and %s may never have been delivered; %s",
			e.Slot, e.SlotLSN, c.Confirmed, last, c.Confirmed, e.SlotLSN, fix)
	case GapHistory:
		return fmt.Sprintf("the server's WAL ends at %s, before the checkpoint of slot %q at %s (%s): the server was restored from a backup taken before it, or lost WAL, and events committed after %s may never be delivered; %s",
			e.SlotLSN, e.Slot, c.Confirmed, last, e.SlotLSN, fix)
	default:
		return fmt.Sprintf("the checkpoint of slot %q belongs to database system %s (confirmed up to %s, %s), but this server is system %s: postgres.url now names another database, or a restored backup, and events committed there after %s may be missing here; %s",
			e.Slot, c.SystemID, c.Confirmed, last, e.SystemID, c.Confirmed, fix)
	}
}
