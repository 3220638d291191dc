package outbox

import (
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
)

// Columns maps the outbox fields to the table's column names (catalog form).
type Columns struct {
	ID            string // default "id"
	AggregateType string // default "aggregatetype"
	AggregateID   string // default "aggregateid"
	Type          string // default "type"
	Payload       string // default "payload"
}

// DefaultColumns is Debezium's Outbox Event Router convention.
var DefaultColumns = Columns{
	ID:            "id",
	AggregateType: "aggregatetype",
	AggregateID:   "aggregateid",
	Type:          "type",
	Payload:       "payload",
}

// Names lists the mapped columns in a fixed order, for catalog checks.
func (c Columns) Names() []string {
	return []string{c.ID, c.AggregateType, c.AggregateID, c.Type, c.Payload}
}

// DefaultTopic is the topic template Debezium's EventRouter uses.
const DefaultTopic = "outbox.event.{aggregate_type}"

// Table is one configured outbox table.
type Table struct {
	Name    TableName
	Columns Columns
	// Topic is a template; see route.Compile for the placeholders.
	Topic string
}

// Validate reports a configuration error in t.
func (t *Table) Validate() error {
	if t.Name.Name == "" {
		return fmt.Errorf("outbox table: name is required")
	}
	for _, c := range t.Columns.Names() {
		if c == "" {
			return fmt.Errorf("outbox table %s: every column of the mapping must be set (id, aggregate_type, aggregate_id, type, payload)", t.Name)
		}
	}
	if t.Topic == "" {
		return fmt.Errorf("outbox table %s: topic is required", t.Name)
	}
	return nil
}

// Event is one row inserted into an outbox table, with the position and time
// of the transaction that committed it.
//
// The transaction's end LSN is not part of the Event: pgoutput sends it in the
// COMMIT message, after the rows, and events are produced as soon as they are
// decoded. The checkpoint tracker attaches it to the transaction instead.
type Event struct {
	Table *Table

	ID            []byte
	AggregateType []byte
	AggregateID   []byte
	Type          []byte
	Payload       []byte

	// CommitLSN is the LSN of the transaction's commit record (pgoutput
	// Begin.FinalLSN). Several events share it; it is not a unique id.
	CommitLSN  pglogrepl.LSN
	CommitTime time.Time
	XID        uint32
}

// EventError says that one event cannot be delivered as configured. It is a
// poison event: retrying cannot help, so the connector stops on it rather
// than skip it.
type EventError struct {
	Table     TableName
	EventID   string
	CommitLSN pglogrepl.LSN
	Reason    string
}

func (e *EventError) Error() string {
	return fmt.Sprintf("outbox event id=%q in table %s (commit lsn %s): %s; nothing past this transaction is confirmed, so fix the row or the configuration and restart to resume here",
		e.EventID, e.Table, e.CommitLSN, e.Reason)
}
