package retention

import (
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/checkpoint"
)

// maxMarks bounds the marks kept. They are kept by age, not by count
// (thin): however long retention.after is, the oldest mark a table needs
// stays, and the marks between it and now are thinned to an even spacing,
// so a row goes at most one spacing (the span of the marks / maxMarks)
// after it is retention.after old.
const maxMarks = 256

// Server is what the server says now, that a mark must agree with to be
// used (docs/design.md, "Retention"): a mark is a fact of one WAL
// history, and one read back from the checkpoint topic is checked against
// the server before it can delete a row.
type Server struct {
	// Timeline is the server's WAL timeline now: a mark of another was
	// taken in a history the server may not share (a promotion, a restore).
	Timeline int32
	// NextXID is the next xid (64-bit): a mark whose xmin is above it was
	// taken in a history where xids went further (a restore from a backup
	// reuses them).
	NextXID uint64
	// WALEnd is the WAL's insert position: a mark past it was taken in a
	// history where the WAL went further.
	WALEnd pglogrepl.LSN
	// Now is the connector's clock (Cleaner.Now): a mark from the future
	// was not taken by this clock.
	Now time.Time
}

// Fits reports whether mark m can be a fact of the server's WAL history.
func (s Server) Fits(m checkpoint.RetentionMark) bool {
	return m.Timeline == s.Timeline && m.XMin <= s.NextXID && m.LSN <= s.WALEnd && !m.Time.After(s.Now)
}

// valid returns the marks that fit the server, and how many did not.
func valid(marks []checkpoint.RetentionMark, s Server) ([]checkpoint.RetentionMark, int) {
	kept := make([]checkpoint.RetentionMark, 0, len(marks))
	for _, m := range marks {
		if s.Fits(m) && (len(kept) == 0 || (m.LSN >= kept[len(kept)-1].LSN && !m.Time.Before(kept[len(kept)-1].Time))) {
			kept = append(kept, m)
		}
	}
	return kept, len(marks) - len(kept)
}

// newest returns the newest mark taken at or before notAfter whose
// position confirmed has passed.
func newest(marks []checkpoint.RetentionMark, notAfter time.Time, confirmed pglogrepl.LSN) (checkpoint.RetentionMark, bool) {
	for i := len(marks) - 1; i >= 0; i-- {
		if m := marks[i]; !m.Time.After(notAfter) && m.LSN <= confirmed {
			return m, true
		}
	}
	return checkpoint.RetentionMark{}, false
}

// prune drops the marks no table needs, those older than the oldest of
// the marks each table could use now (keepFrom, the times the tables'
// newest usable marks may be at most), then thins the rest to maxMarks.
// marks are oldest first.
func prune(marks []checkpoint.RetentionMark, confirmed pglogrepl.LSN, notAfter []time.Time) []checkpoint.RetentionMark {
	from := len(marks)
	for _, na := range notAfter {
		i := len(marks) - 1
		for ; i >= 0; i-- {
			if m := marks[i]; !m.Time.After(na) && m.LSN <= confirmed {
				break
			}
		}
		from = min(from, max(i, 0))
	}
	return thin(append([]checkpoint.RetentionMark(nil), marks[from:]...), maxMarks)
}

// thin removes marks until n are left: each time the one (never the
// oldest, never the newest) closest in time to the mark before it, so the
// spacing of those kept evens out over their span.
func thin(marks []checkpoint.RetentionMark, n int) []checkpoint.RetentionMark {
	for len(marks) > n && len(marks) > 2 {
		drop, gap := 1, time.Duration(-1)
		for i := 1; i < len(marks)-1; i++ {
			if g := marks[i].Time.Sub(marks[i-1].Time); gap < 0 || g < gap {
				drop, gap = i, g
			}
		}
		marks = append(marks[:drop], marks[drop+1:]...)
	}
	return marks
}
