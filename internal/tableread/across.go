package tableread

import (
	"bytes"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/outbox"
)

// Head is one table's read, merged with others' in the order of the
// commits (Plan.CommitBefore): its rows read and not sent yet, whether
// they are the read's last, and its decoder.
type Head struct {
	Plan  *Plan
	Dec   *decode.RowDecoder
	Rows  [][][]byte
	Final bool
}

// Unordered says that one commit wrote rows into two of the tables merged,
// and that nothing tells their order across the tables: the rows of one
// commit lie in each table in the order they were inserted, but no
// position compares across tables. An aggregate's order is not guessed
// (docs/design.md, "Backfill"): the reads stop, or, with
// backfill.on_unknown_order: send, go table by table.
type Unordered struct {
	// Aggregate is "aggregatetype/aggregateid" of an aggregate with rows
	// of the commit in two tables; "" when a table's rows of the commit
	// run past its chunk, so that the aggregates were not all seen.
	Aggregate string
	// Key is the record key the aggregate's events share with the
	// other table's, where it is not the aggregate id (expressions.key).
	Key    string
	Tables [2]string
	// Budget is the byte budget of a table's chunk (Plan.SetBudget) when
	// that, not its rows, is what the commit's rows ran past; 0 otherwise.
	Budget int64
}

func (u *Unordered) Error() string {
	what := fmt.Sprintf("one transaction wrote aggregate %q's events into both %s and %s", brief(u.Aggregate), u.Tables[0], u.Tables[1])
	if u.Key != "" {
		what = fmt.Sprintf("one transaction wrote events of record key %q (aggregate %q's among them) into both %s and %s", brief(u.Key), brief(u.Aggregate), u.Tables[0], u.Tables[1])
	}
	fix := "if that order does not matter to its consumers, set backfill.on_unknown_order: send and start again"
	switch {
	case u.Aggregate == "" && u.Budget > 0:
		what = fmt.Sprintf("one transaction wrote into %s and %s, and more than a chunk's %d bytes of rows into %s, so the aggregates with events in both were not all seen", u.Tables[0], u.Tables[1], u.Budget, u.Tables[1])
		fix = "raise max_in_flight_bytes (the tables merged share a sixteenth of it for their chunks, at most 4 MiB), or, if the order of an aggregate's events across the tables does not matter to its consumers, set backfill.on_unknown_order: send, and start again"
	case u.Aggregate == "":
		what = fmt.Sprintf("one transaction wrote more rows into %s and %s than a chunk holds, so the aggregates with events in both were not all seen", u.Tables[0], u.Tables[1])
		fix = "raise tables[].backfill.chunk_size above that transaction's rows, or, if the order of an aggregate's events across the tables does not matter to its consumers, set backfill.on_unknown_order: send, and start again"
	}
	return "the backfill before the stream: " + what + "; nothing in the tables tells the order of one transaction's rows across them, so it stops rather than send an aggregate's events out of order; " + fix
}

// brief is s cut to 100 bytes, for a message.
func brief(s string) string {
	if len(s) > 100 {
		return s[:100] + "..."
	}
	return s
}

// Crossing checks the commit of the first row of heads[at] (the row the
// merge sends next, the first of its commit to be sent): when the first
// row of another head is of that commit too, the commit wrote into two
// tables, and it returns an *errtext.Fatal of an *Unordered when an
// aggregate has rows of it in two tables. Rows of distinct aggregates
// need no order across tables: nil. When a head's rows of the commit
// run to the end of what it holds, more is that head: read its next
// chunk onto it and check again, until it holds the commit's rows or a
// chunk's worth of them (rows or bytes, Plan.SetBudget), so that memory
// holds less than two chunks. A commit larger than a chunk is Unordered
// without an aggregate. at and now
// are the rows' commit position and time, as the merge decodes them.
// keyOf is an event's record key, as routed (nil: the aggregate id): the
// order a key's consumers see is the one kept, so two aggregates that
// share a key (expressions.key) are one there.
func Crossing(heads []Head, at int, lsn pglogrepl.LSN, now time.Time, keyOf func(*outbox.Event) ([]byte, error)) (more int, err error) {
	first := heads[at]
	var in []int
	for i, h := range heads {
		if len(h.Rows) > 0 && !first.Plan.CommitBefore(first.Rows[0], h.Plan, h.Rows[0]) && !h.Plan.CommitBefore(h.Rows[0], first.Plan, first.Rows[0]) {
			in = append(in, i)
		}
	}
	if len(in) < 2 {
		return -1, nil
	}
	table := func(i int) string { return heads[i].Plan.Table.Name.String() }
	owner := map[string]int{}
	for _, i := range in {
		h, n, size := heads[i], 0, int64(0)
		for n < len(h.Rows) && !h.Plan.CommitBefore(h.Rows[0], h.Plan, h.Rows[n]) {
			for _, v := range h.Rows[n] {
				size += int64(len(v))
			}
			n++
		}
		switch {
		case n == len(h.Rows) && !h.Final && n < h.Plan.chunk && (h.Plan.budget <= 0 || size < h.Plan.budget):
			return i, nil
		case n == len(h.Rows) && !h.Final:
			other := in[0]
			if other == i {
				other = in[1]
			}
			u := &Unordered{Tables: [2]string{table(other), table(i)}}
			if n < h.Plan.chunk {
				u.Budget = h.Plan.budget
			}
			return -1, &errtext.Fatal{Msg: u.Error()}
		}
		for _, row := range h.Rows[:n] {
			// By record key where it is known, else by aggregate; a row
			// that does not decode fails as it is sent.
			a, by, k := fmt.Sprint("\x00", i), fmt.Sprint("\x00", i), ""
			if m, err := h.Dec.Row(row, lsn, now); err == nil {
				id := m.Event.Fields[outbox.FieldAggregateID].B
				a = AggregateOf(m.Event.Fields[outbox.FieldAggregateType].B, id)
				by = a
				if keyOf != nil {
					if key, err := keyOf(&m.Event); err == nil {
						by = "\x00key " + string(key)
						if !bytes.Equal(key, id) {
							k = string(key)
						}
					}
				}
			}
			if o, ok := owner[by]; ok && o != i {
				return -1, &errtext.Fatal{Msg: (&Unordered{Aggregate: a, Key: k, Tables: [2]string{table(o), table(i)}}).Error()}
			}
			owner[by] = i
		}
	}
	return -1, nil
}

// AggregateOf is "aggregatetype/aggregateid" of an event's fields, as
// Crossing's aggregate returns it.
func AggregateOf(aggregateType, aggregateID []byte) string {
	return strings.ReplaceAll(string(aggregateType), "/", "//") + "/" + string(aggregateID)
}
