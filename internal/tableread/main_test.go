package tableread

import (
	"testing"

	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/testenv"
)

var pg *testenv.Postgres

func TestMain(m *testing.M) { testenv.Main(m, &pg) }

// testTable is public.outbox with the default columns, as configured.
func testTable() *outbox.Source {
	return &outbox.Source{Name: outbox.TableName{Schema: "public", Name: "outbox"}, Columns: outbox.DefaultColumns}
}
