package setup

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// PublishedWhole reports whether relation rs, table t now, has been in the
// publication since before it held a row: its own pg_publication_rel row
// (rs.Member) was written by the transaction that created it under the
// name it has now, and it holds no row of that transaction. The stream
// then carried every row it holds, in its place among the other tables'
// events, and a repair has none to send: a snapshot's rows, sent where
// the stream meets the relation, would go ahead of the events other
// tables committed before them (docs/design.md, "Table changes").
//
// The creating transaction is the xmin of the relation's ctid attribute
// (pg_attribute, attnum -1), a row nothing updates. Its row type's
// pg_type row is rewritten by a rename and by SET SCHEMA, so its xmin is
// the creating one only while the relation has the name it was created
// with: a table renamed into the configured name carried its rows as
// another relation, which the stream did not send as this table's. Rows
// the creating transaction wrote are not taken as streamed, even those
// after its ALTER PUBLICATION: the answer is then false, and the repair
// sends them. A role that may not read the table gets false too: the
// repair's snapshot then says what to grant.
func PublishedWhole(ctx context.Context, conn *pgx.Conn, rs RelState, t Table) (bool, error) {
	member, ok := strings.CutPrefix(rs.Member, "rel:")
	if !ok {
		return false, nil // FOR ALL TABLES or a schema's: no row of its own to date
	}
	var created string
	err := conn.QueryRow(ctx, `SELECT a.xmin::text FROM pg_publication_rel pr
		JOIN pg_class c ON c.oid = pr.prrelid
		JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = -1
		JOIN pg_type ty ON ty.oid = c.reltype
		WHERE pr.oid = $1::oid AND pr.prrelid = $2 AND pr.xmin = a.xmin AND ty.xmin = a.xmin`, member, rs.OID).Scan(&created)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read when outbox table %s joined the publication: %w", t, err)
	}
	var empty bool
	err = conn.QueryRow(ctx, `SELECT NOT EXISTS (SELECT FROM `+t.String()+` WHERE xmin = $1::xid)`, created).Scan(&empty)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42501" { // insufficient_privilege
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read outbox table %s's rows of the transaction that created it: %w", t, err)
	}
	return empty, nil
}
