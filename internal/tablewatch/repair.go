package tablewatch

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/decode"
)

// Rows hands send the rows of repair r, decoded as if committed at commit
// and at, the repair message's transaction, less those the stream sent
// itself (the fresh events the watch noted), a chunk of the snapshot at a
// time. blocking runs each read of the snapshot (it may block for
// seconds); after each chunk, chunkSent lets what it holds go and waits
// for room. It returns the rows read and sent, and closes the snapshot.
func (w *Watch) Rows(ctx context.Context, r *Repair, commit pglogrepl.LSN, at time.Time, blocking func(func() error) error,
	send func(*decode.Message) error, chunkSent func() error) (read, sent int, err error) {
	if r.Snap == nil {
		return 0, 0, nil // published since it was created: nothing to read
	}
	defer r.Snap.Close(ctx)
	dec, seen := r.Snap.Decoder(), w.Fresh(r.Table)
	for final := false; !final; {
		var rows [][][]byte
		err := blocking(func() (err error) {
			rows, final, err = r.Snap.Next(ctx)
			return err
		})
		if err != nil {
			return read, sent, fmt.Errorf("repair of %s: %w", r.Table, err)
		}
		for _, row := range rows {
			read++
			ev, err := dec.Row(row, commit, at)
			if err != nil {
				return read, sent, err
			}
			if _, ok := seen[ev.Event.ID()]; ok {
				continue // the stream sent it, in its place
			}
			if err := send(&ev); err != nil {
				return read, sent, err
			}
			sent++
		}
		if err := chunkSent(); err != nil {
			return read, sent, err
		}
	}
	return read, sent, nil
}
