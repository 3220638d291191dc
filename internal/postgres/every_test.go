package postgres_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestEveryReconnectsAfterAnError: the side loops' connection is opened
// again after fn fails, and every failure is reported; nothing once ctx
// ended.
func TestEveryReconnectsAfterAnError(t *testing.T) {
	db := testenv.Require(t, pg).NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var mu sync.Mutex
	var pids []uint32
	var failures []error
	boom := errors.New("boom")
	done := make(chan struct{})
	go func() {
		defer close(done)
		postgres.Every(ctx, cfg(db), 10*time.Millisecond, true, func(ctx context.Context, conn *pgx.Conn) error {
			mu.Lock()
			defer mu.Unlock()
			pids = append(pids, conn.PgConn().PID())
			switch len(pids) {
			case 1:
				return boom // the connection is dropped
			case 3:
				cancel()
				return errors.New("after the end") // not reported
			}
			return nil
		}, func(err error) {
			mu.Lock()
			failures = append(failures, err)
			mu.Unlock()
		})
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Every did not return once ctx ended")
	}
	if len(pids) != 3 || pids[0] == pids[1] || pids[1] != pids[2] {
		t.Errorf("backend pids %v: want a new connection after the failure, then the same one", pids)
	}
	if len(failures) != 1 || !errors.Is(failures[0], boom) {
		t.Errorf("failures %v: want boom alone", failures)
	}
}
