package setup

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/outboxcdc/cdc/internal/errtext"
)

// TestStandbyOfOldPostgresIsRefused: a hot standby older than PostgreSQL 16
// cannot decode; the connector stops at once, saying what to do, before it
// asks the server anything else.
func TestStandbyOfOldPostgresIsRefused(t *testing.T) {
	for _, version := range []int{140012, 150013} {
		err := checkStandby(context.Background(), nil, version)
		var fatal *errtext.Fatal
		if !errors.As(err, &fatal) || !strings.Contains(err.Error(), "needs PostgreSQL 16 or later") || !strings.Contains(err.Error(), "point postgres.url at the primary") {
			t.Errorf("a standby of %d: %v; want a fatal error naming PostgreSQL 16 and what to do", version, err)
		}
	}
}
