package pipeline_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// newEncodedDatabase is NewDatabase with an encoding of its own.
func newEncodedDatabase(t *testing.T, enc string) string {
	p := testenv.Require(t, pg)
	name := fmt.Sprintf("enc_%s_%d", strings.ToLower(enc), time.Now().UnixNano())
	testenv.Exec(t, p.URL, fmt.Sprintf("CREATE DATABASE %s ENCODING '%s' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0", name, enc))
	t.Cleanup(func() {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, p.URL)
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		conn.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = $1 AND active_pid IS NOT NULL`, name)
		for i := 0; i < 100; i++ {
			if _, err = conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1`, name); err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		conn.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)")
	})
	u, _ := url.Parse(p.URL)
	u.Path = "/" + name
	return u.String()
}

// TestEncodingsReadAlike: in a UTF8, a LATIN1 and a SQL_ASCII database
// (a legacy one holding LATIN1's é, 0xE9, which is no UTF-8), a row
// backfilled and the same row streamed give the same topic, key and
// value, in the database's own bytes, unconverted: the key of an
// aggregate is what it was before the copy pinned an encoding, and a
// SQL_ASCII byte stops neither. Found by the attacks on the copy (a
// client_encoding of UTF8 stalled the SQL_ASCII stream, and changed the
// LATIN1 keys).
func TestEncodingsReadAlike(t *testing.T) {
	for enc, key := range map[string]string{"UTF8": "ag\xc3\xa9", "LATIN1": "ag\xe9", "SQL_ASCII": "ag\xe9"} {
		t.Run(enc, func(t *testing.T) {
			kafka := testenv.NewKafka(t)
			db := newEncodedDatabase(t, enc)
			testenv.Exec(t, db, schema)
			ins := `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'ag' || chr(233), 't' || chr(233) || 'B', jsonb_build_object('n', chr(233) || E'\\t"x'))`
			testenv.Exec(t, db, ins)
			cfg := newEnvConfig(db, kafka)
			cfg.Tables[0].Backfill = &outbox.BackfillOptions{}
			e := &env{db: db, kafka: kafka, cfg: cfg}
			e.start(t)
			testenv.Exec(t, db, ins)
			c := kafka.NewConsumer(t, kafka.AllTopics())
			c.WaitCount(t, time.Minute, 2)
			if len(c.Records) != 2 {
				t.Fatalf("%d records, want the backfilled and the streamed one", len(c.Records))
			}
			a, b := c.Records[0], c.Records[1]
			if a.Topic != b.Topic || string(a.Key) != string(b.Key) || string(a.Value) != string(b.Value) ||
				string(testenv.Header(a, "event_type")) != string(testenv.Header(b, "event_type")) {
				t.Fatalf("the backfilled and the streamed event of one row differ: %q %q %q %q, and %q %q %q %q", a.Topic, a.Key, a.Value, testenv.Header(a, "event_type"), b.Topic, b.Key, b.Value, testenv.Header(b, "event_type"))
			}
			if string(a.Key) != key {
				t.Fatalf("key %q, want the database's bytes %q", a.Key, key)
			}
		})
	}
}
