package pipeline_test

import (
	"net/url"
	"testing"
	"time"

	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestEncodingsReadAlike: in a UTF8, a LATIN1 and a SQL_ASCII database
// (a legacy one holding LATIN1's é, 0xE9, which is no UTF-8), a row
// backfilled and the same row streamed give the same topic, key and
// value, in the database's own bytes, unconverted: the key of an
// aggregate is what it was before the copy pinned an encoding, and a
// SQL_ASCII byte stops neither; a client_encoding the operator asks
// for in postgres.url (UTF8 of a LATIN1 database) is kept. Found by the
// attacks on the copy (a client_encoding of UTF8 stalled the SQL_ASCII
// stream, and changed the LATIN1 keys).
func TestEncodingsReadAlike(t *testing.T) {
	for _, tc := range []struct{ enc, asked, key string }{
		{"UTF8", "", "ag\xc3\xa9"}, {"LATIN1", "", "ag\xe9"}, {"SQL_ASCII", "", "ag\xe9"}, {"LATIN1", "UTF8", "ag\xc3\xa9"},
	} {
		t.Run(tc.enc+" "+tc.asked, func(t *testing.T) {
			kafka := testenv.NewKafka(t)
			db := testenv.Require(t, pg).NewDatabaseWith(t, "ENCODING '"+tc.enc+"' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
			if tc.asked != "" {
				u, err := url.Parse(db)
				if err != nil {
					t.Fatal(err)
				}
				q := u.Query()
				q.Set("client_encoding", tc.asked)
				u.RawQuery = q.Encode()
				db = u.String()
			}
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
			if string(a.Key) != tc.key {
				t.Fatalf("key %q, want %q", a.Key, tc.key)
			}
		})
	}
}
