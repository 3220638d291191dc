package checkpoint

import "slices"

// Seen is what a repair's snapshot showed of the transactions that had
// committed (pg_current_snapshot's xmin, xmax and running xids, 64-bit),
// and of the rows it sent: the stream passes over an event of such a
// transaction only when the repair sent its row (docs/design.md, "Table
// changes"). A transaction the snapshot shows may have had its row
// deleted before the snapshot (an INSERT and DELETE in one transaction, a
// clean-up): its event is in no snapshot, and the stream sends it.
type Seen struct {
	Xmin, Xmax uint64
	Xip        []uint64
	// IDs are the ids of the rows the repair sent, when there were at
	// most MaxSeenIDs (All); otherwise none are kept, and the stream
	// passes over nothing: a row may then be sent twice, never lost.
	IDs []string
	All bool
}

// MaxSeenIDs bounds the ids a checkpoint keeps of the rows a repair sent.
const MaxSeenIDs = 512

// Sent reports whether the repair sent the row of event id, as far as
// Seen knows: only with All.
func (s *Seen) Sent(id string) bool {
	_, ok := slices.BinarySearch(s.IDs, id)
	return s.All && ok
}

// full is xid, a 32-bit xid as pgoutput's Begin names it, in the epoch
// nearest the snapshot's xmax: any transaction the stream meets while
// the snapshot matters is within 2^31 of it.
func (s *Seen) full(xid uint32) uint64 {
	full := s.Xmax&^0xFFFFFFFF | uint64(xid)
	switch {
	case full > s.Xmax+1<<31 && full >= 1<<32:
		full -= 1 << 32 // the epoch before
	case full+1<<31 < s.Xmax:
		full += 1 << 32 // the epoch after
	}
	return full
}

// Sees reports whether the snapshot shows the changes of xid, a
// committed top-level transaction: it ended before the snapshot was
// taken.
func (s *Seen) Sees(xid uint32) bool {
	full := s.full(xid)
	if full < s.Xmin {
		return true
	}
	return full < s.Xmax && !slices.Contains(s.Xip, full)
}

// Past reports whether xid took its id after the snapshot was taken (at
// or past its xmax): it commits after every transaction the snapshot
// shows, so once the stream met its commit, none of them is left.
func (s *Seen) Past(xid uint32) bool { return s.full(xid) >= s.Xmax }

// valid reports whether s can be a snapshot's: xmin at or below xmax,
// and the running xids between them.
func (s *Seen) valid() bool {
	if s.Xmin > s.Xmax {
		return false
	}
	for _, x := range s.Xip {
		if x < s.Xmin || x >= s.Xmax {
			return false
		}
	}
	return len(s.IDs) <= MaxSeenIDs && slices.IsSorted(s.IDs)
}
