package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"
)

// DefaultTable is the inbox table's name unless Inbox.Table says otherwise.
const DefaultTable = "event_inbox"

// Inbox is an inbox table. The zero value is DefaultTable.
type Inbox struct {
	// Table is the table's name, optionally schema-qualified, as an SQL
	// identifier (quoted if it needs to be).
	Table string
}

var identifier = regexp.MustCompile(`^("[^"]+"|[A-Za-z_][A-Za-z0-9_$]*)(\.("[^"]+"|[A-Za-z_][A-Za-z0-9_$]*))?$`)

func (in Inbox) table() (string, error) {
	if in.Table == "" {
		return DefaultTable, nil
	}
	if !identifier.MatchString(in.Table) {
		return "", fmt.Errorf("inbox: table %q is not an SQL identifier (schema.name, quoted if needed)", in.Table)
	}
	return in.Table, nil
}

// DDL is the statement that creates the inbox table if it is missing.
func (in Inbox) DDL() (string, error) {
	t, err := in.table()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
  consumer_name text NOT NULL,
  event_id text NOT NULL,
  processed_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (consumer_name, event_id)
)`, t), nil
}

// Execer is what Create and Cleanup run statements on: a *pgx.Conn, a
// *pgxpool.Pool or a pgx.Tx.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Create creates the inbox table if it is missing.
func (in Inbox) Create(ctx context.Context, db Execer) error {
	ddl, err := in.DDL()
	if err != nil {
		return err
	}
	_, err = db.Exec(ctx, ddl)
	return err
}

// Process records eventID for consumer in tx, and runs fn in tx only if
// the id was not recorded before. It reports whether fn ran. The caller
// commits tx, then the Kafka offset; an error from fn is returned as it is,
// and the caller rolls back, which forgets the id too.
func (in Inbox) Process(ctx context.Context, tx pgx.Tx, consumer, eventID string, fn func(context.Context, pgx.Tx) error) (bool, error) {
	if consumer == "" || eventID == "" {
		return false, errors.New("inbox: a consumer name and an event id are required")
	}
	t, err := in.table()
	if err != nil {
		return false, err
	}
	tag, err := tx.Exec(ctx, "INSERT INTO "+t+" (consumer_name, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING", consumer, eventID)
	if err != nil {
		return false, fmt.Errorf("inbox: record event %s: %w", eventID, err)
	}
	if tag.RowsAffected() == 0 {
		return false, nil // seen before
	}
	return true, fn(ctx, tx)
}

// Process is Inbox{}.Process: the table event_inbox.
func Process(ctx context.Context, tx pgx.Tx, consumer, eventID string, fn func(context.Context, pgx.Tx) error) (bool, error) {
	return Inbox{}.Process(ctx, tx, consumer, eventID, fn)
}

// Cleanup deletes the ids processed more than retention ago, in batches so
// that no statement holds many locks, and returns how many it deleted.
func (in Inbox) Cleanup(ctx context.Context, db Execer, retention time.Duration) (int64, error) {
	t, err := in.table()
	if err != nil {
		return 0, err
	}
	var total int64
	for {
		tag, err := db.Exec(ctx, "DELETE FROM "+t+" WHERE ctid IN (SELECT ctid FROM "+t+" WHERE processed_at < now() - make_interval(secs => $1) LIMIT 10000)",
			retention.Seconds())
		if err != nil {
			return total, fmt.Errorf("inbox: clean up: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < 10000 {
			return total, nil
		}
	}
}

// Header is one record header, as any Kafka client gives it.
type Header struct {
	Key   string
	Value []byte
}

// HeaderKeys are the headers EventID reads, in order: the connector's id
// header, seed 004's name for it, and CloudEvents binary mode's.
var HeaderKeys = []string{"id", "x-event-id", "ce_id"}

// ErrNoEventID means a record carries no event id that EventID knows.
var ErrNoEventID = errors.New("inbox: the record has no event id (headers id, x-event-id or ce_id; envelope event_id; CloudEvents id)")

// EventID finds a record's event id: in its headers (HeaderKeys), else in
// its value when that is the connector's envelope ("event_id") or a
// structured CloudEvent ("id" beside "specversion"). A payload's own "id"
// member is not taken: it is the application's, not necessarily the event's.
func EventID(headers []Header, value []byte) (string, error) {
	for _, k := range HeaderKeys {
		for _, h := range headers {
			if h.Key == k && len(h.Value) > 0 {
				return string(h.Value), nil
			}
		}
	}
	var v struct {
		EventID     *string `json:"event_id"`
		ID          *string `json:"id"`
		SpecVersion *string `json:"specversion"`
	}
	if len(value) > 0 && value[0] == '{' && json.Unmarshal(value, &v) == nil {
		switch {
		case v.EventID != nil && *v.EventID != "":
			return *v.EventID, nil
		case v.SpecVersion != nil && v.ID != nil && *v.ID != "":
			return *v.ID, nil
		}
	}
	return "", ErrNoEventID
}

// RecordEventID is EventID for a franz-go record.
func RecordEventID(r *kgo.Record) (string, error) {
	hs := make([]Header, len(r.Headers))
	for i, h := range r.Headers {
		hs[i] = Header{Key: h.Key, Value: h.Value}
	}
	return EventID(hs, r.Value)
}
