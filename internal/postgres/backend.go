package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// A statement that runs for long is not stuck for that: a backfill's chunk
// of a selective condition on a large table can take minutes, and the
// server works on it all along. One that waits on a lock nobody releases
// is stuck, and looks no different from the client, which only waits for
// rows. The server tells the two apart in pg_stat_activity, which shows a
// role its own backends' state and wait_event_type without any grant.

const (
	// backendLook is how often WatchBackend looks: once a second at most,
	// one small query, so a long statement costs the server next to
	// nothing more, and a fast one (done within the second) no look nor
	// connection at all.
	backendLook = time.Second
	// backendLookTimeout bounds one look: a server too busy to answer it
	// within that says nothing about the statement, which is no progress.
	backendLookTimeout = 2 * time.Second
)

// BackendWorking reports whether the server works on the statement backend
// pid runs, as conn (another connection: the backend's own is busy with
// the statement) sees it in pg_stat_activity: active, and not waiting on a
// heavyweight lock (wait_event_type 'Lock': a table, a row, a transaction,
// an advisory lock), which may never be released, nor on the client
// ('Client': a backfill's copy held back while Kafka takes the rows sent,
// whose progress is the session's to show). Waiting on I/O or a
// lightweight lock is the work itself. A backend that is idle, gone, or
// not visible to conn's role (NULL state) is not working.
func BackendWorking(ctx context.Context, conn *pgx.Conn, pid uint32) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, backendLookTimeout)
	defer cancel()
	var working bool
	err := conn.QueryRow(ctx, `
		SELECT coalesce(state = 'active' AND wait_event_type IS DISTINCT FROM 'Lock' AND wait_event_type IS DISTINCT FROM 'Client', false)
		FROM pg_stat_activity WHERE pid = $1`, int64(pid)).Scan(&working)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil // the backend is gone
	}
	return working, err
}

// WatchBackend calls working after each look, about once a second, that
// finds the server working on backend pid's statement (BackendWorking),
// until stop, which ends the looks and waits for them. The looks run on a
// connection of cfg's own, opened at the first, a second in, and closed by
// stop or by a look that fails, which is no progress either: the next
// opens it again. Cancelling ctx ends the looks too.
func WatchBackend(ctx context.Context, cfg Config, pid uint32, working func()) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		Every(ctx, cfg, backendLook, false, func(ctx context.Context, conn *pgx.Conn) error {
			ok, err := BackendWorking(ctx, conn, pid)
			if ok {
				working()
			}
			return err
		}, func(error) {
			// Not progress, and nothing to say: the statement's own
			// error, if the server is gone, says it.
		})
	}()
	return func() { cancel(); <-done }
}
