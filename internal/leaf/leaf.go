package leaf

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/postgres"
)

// Finder finds the configured table a leaf partition belongs to, for
// the decoder (decode.Decoder.Partition), on a catalog connection of its
// own, opened at the first lookup. A publication the connector made
// publishes partitions via their root, so lookups happen only for one
// that does not, or for relations of a broader publication.
type Finder struct {
	Postgres postgres.Config
	Tables   []*outbox.Source
	// Known, when set, names the table an ancestor's id belongs to
	// (tablewatch.Watch.Known): a partition of a renamed table.
	Known func(id uint32) (*outbox.Source, uint32, bool)
	conn  *pgx.Conn
}

// Lookup returns the configured table that rel is a partition of, at any
// depth, by the ancestor's id (Known) or name, and that table's relation
// id. xid is the transaction the stream reads rel's Relation message in
// (0: none): the lookup waits until a snapshot shows it, since a
// partition created or attached in it is in no catalog before, and its
// rows would be taken for another table's (postgres.WaitVisible).
func (pt *Finder) Lookup(ctx context.Context, rel decode.Relation, xid uint32) (*outbox.Source, uint32, bool, error) {
	if pt.conn == nil {
		conn, err := postgres.ConnectSQL(ctx, pt.Postgres)
		if err != nil {
			return nil, 0, false, err
		}
		pt.conn = conn
	}
	if xid != 0 {
		if err := postgres.WaitVisible(ctx, pt.conn, xid, postgres.VisibleWait); err != nil {
			pt.Close(ctx)
			return nil, 0, false, err
		}
	}
	rows, err := pt.conn.Query(ctx, `SELECT a.relid::oid, n.nspname, c.relname
		FROM pg_partition_ancestors($1::oid::regclass) WITH ORDINALITY AS a(relid, ord)
		JOIN pg_class c ON c.oid = a.relid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE a.relid::oid <> $1::oid ORDER BY a.ord`, rel.ID)
	if err != nil {
		pt.Close(ctx)
		return nil, 0, false, err
	}
	defer rows.Close()
	for rows.Next() {
		var id uint32
		var schema, name string
		if err := rows.Scan(&id, &schema, &name); err != nil {
			pt.Close(ctx)
			return nil, 0, false, err
		}
		if pt.Known != nil {
			if t, root, ok := pt.Known(id); ok {
				return t, root, true, nil
			}
		}
		for _, t := range pt.Tables {
			if !t.IsMessage() && t.Name.Schema == schema && t.Name.Name == name {
				return t, id, true, nil
			}
		}
	}
	if err := rows.Err(); err != nil {
		pt.Close(ctx)
		return nil, 0, false, err
	}
	return nil, 0, false, nil
}

// Close closes the catalog connection, if one is open.
func (pt *Finder) Close(ctx context.Context) {
	if pt.conn != nil {
		pt.conn.Close(context.WithoutCancel(ctx))
		pt.conn = nil
	}
}
