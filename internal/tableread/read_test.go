package tableread

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestChunkAfterARewrite: a chunk read in a read-only transaction of its
// own, as beside the stream, that waits behind a rewrite reads the
// rewritten table, also where the database's
// default_transaction_isolation is repeatable read: its snapshot would
// otherwise be from before the rewrite, read the table as empty, and end
// the job with none of its rows sent.
func TestChunkAfterARewrite(t *testing.T) {
	for _, iso := range []string{"read committed", "repeatable read", "serializable"} {
		t.Run(iso, func(t *testing.T) {
			db := pg.NewDatabase(t)
			testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
				aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`,
				`INSERT INTO outbox (aggregatetype, aggregateid, type, payload) SELECT 'order', 'a' || i, 'E', '{}' FROM generate_series(1, 20) i`)
			var name string
			testenv.QueryRow(t, db, `SELECT current_database()`, nil, &name)
			testenv.Exec(t, db, `ALTER DATABASE `+pgx.Identifier{name}.Sanitize()+` SET default_transaction_isolation = '`+iso+`'`)
			ctx := context.Background()
			conn, err := postgres.ConnectRows(ctx, postgres.Config{URL: db}, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			plan, err := NewPlan(ctx, conn, testTable(), "", nil, OrderColumns, 1000)
			if err != nil {
				t.Fatal(err)
			}
			last, err := plan.Last(ctx, conn)
			if err != nil {
				t.Fatal(err)
			}
			alter := testenv.Connect(t, db)
			if _, err := alter.Exec(ctx, "BEGIN"); err != nil {
				t.Fatal(err)
			}
			if _, err := alter.Exec(ctx, "ALTER TABLE outbox ALTER COLUMN payload TYPE text"); err != nil {
				t.Fatal(err)
			}
			type read struct {
				c   Chunk
				err error
			}
			done := make(chan read, 1)
			go func() {
				c, err := plan.Read(ctx, conn, nil, last)
				done <- read{c, err}
			}()
			testenv.WaitForLock(t, db, "public.outbox")
			if _, err := alter.Exec(ctx, "COMMIT"); err != nil {
				t.Fatal(err)
			}
			got := <-done
			if got.err != nil || len(got.c.Rows) != 20 || !got.c.Final {
				t.Fatalf("a chunk that waited for a rewrite read %d rows (final %v), error %v; want all 20", len(got.c.Rows), got.c.Final, got.err)
			}
		})
	}
}
