package postgres_test

import (
	"context"
	"errors"
	"testing"

	"github.com/outboxcdc/cdc/internal/postgres"
)

// TestReleaseFreesTheLockAtOnce: once Release returns, the start lock is
// free, for this replica's own next try too. Closing the connection alone
// freed it only once the server noticed: a standby that had just ended a
// frozen holder's walsender tried again at once, found its own lock still
// held ("another replica is starting"), and waited a whole retry backoff
// (21 s in CI) before it took over. A second replica's LockStart fails
// while the lock is held.
func TestReleaseFreesTheLockAtOnce(t *testing.T) {
	c := cfg(pg.NewDatabase(t))
	c.Slot = "outbox_cdc"
	ctx := context.Background()
	for i := 0; i < 200; i++ {
		l, err := postgres.LockStart(ctx, c, c.Slot)
		if err != nil {
			t.Fatalf("try %d: the lock released before was not free: %v", i, err)
		}
		if i == 0 {
			var inUse *postgres.SlotInUseError
			if _, err := postgres.LockStart(ctx, c, c.Slot); !errors.As(err, &inUse) || !errors.Is(err, postgres.ErrStarting) {
				t.Fatalf("a second LockStart while the lock is held: %v; want ErrStarting", err)
			}
		}
		l.Release(ctx)
	}
}
