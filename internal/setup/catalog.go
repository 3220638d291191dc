package setup

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/pgident"
	"github.com/outboxcdc/cdc/internal/postgres"
)

// Catalog is what the server's catalog says now of the publication and
// the configured outbox tables: enough to tell whether every insert into
// them reaches the slot (docs/design.md, "Table changes").
type Catalog struct {
	Publication Publication
	Tables      []TableState
	// Role is the connector's role (current_user), for the statements
	// errors tell an operator to run; Database, the database.
	Role, Database string
}

// Publication is the publication's definition, as far as it decides which
// inserts reach the slot.
type Publication struct {
	Name   string
	Exists bool
	// Inserts: it publishes inserts. ViaRoot: publish_via_partition_root,
	// so a partitioned table's rows arrive under its own name, not its
	// leaf partitions'. AllTables: FOR ALL TABLES.
	Inserts, ViaRoot, AllTables bool
	// Owned: the connector's role owns it (or is a superuser), so it may
	// add a table to it and set its options.
	Owned bool
}

// TableState is one configured table as the catalog has it now.
type TableState struct {
	Table
	RelState
}

// RelState is one relation as the catalog has it now.
type RelState struct {
	// OID is the relation id: a new one under a table's name means the
	// table was dropped and created again (or another took its name). 0:
	// no relation of that name (or id) exists.
	OID uint32
	// Schema and Name are the relation's name now (for a lookup by id).
	Schema, Name string
	Partitioned  bool
	// Published: its inserts reach the publication, as its own or
	// through an ancestor's membership, FOR ALL TABLES, or its schema's.
	Published bool
	// Unlogged: it, or one of its partitions, is unlogged (ALTER TABLE
	// ... SET UNLOGGED, which a FOR ALL TABLES or schema publication
	// allows, and CREATE UNLOGGED TABLE ... PARTITION OF, which any
	// does): those inserts are not written to the WAL, so it is not
	// published whatever the publication says.
	Unlogged bool
	// Member names the membership that publishes it: "rel:<oid>" (a
	// pg_publication_rel row, its own or an ancestor's), "schema:<oid>"
	// (pg_publication_namespace) or "all:<oid>" (the publication, FOR ALL
	// TABLES); "" when not published. A relation removed from the
	// publication and added back has another (checkpoint.Table.Member).
	Member string
	// Filtered: the publication has a row filter (WHERE) for it
	// (PostgreSQL 15+), which would keep some inserts from the slot.
	Filtered bool
	// Owned: the role owns the table, which adding it to a publication
	// requires.
	Owned bool
}

// Find returns the state of the table named like t, or nil.
func (c *Catalog) Find(schema, name string) *TableState {
	for i := range c.Tables {
		if c.Tables[i].Schema == schema && c.Tables[i].Name == name {
			return &c.Tables[i]
		}
	}
	return nil
}

// ReadCatalog reads the publication and the tables from the catalog. It
// changes nothing.
func ReadCatalog(ctx context.Context, conn *pgx.Conn, publication string, tables []Table) (Catalog, error) {
	c := Catalog{Publication: Publication{Name: publication}}
	p := &c.Publication
	err := conn.QueryRow(ctx, `SELECT pubinsert, pubviaroot, puballtables, pg_has_role(current_user, pubowner, 'USAGE')
		FROM pg_publication WHERE pubname = $1`, publication).Scan(&p.Inserts, &p.ViaRoot, &p.AllTables, &p.Owned)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return Catalog{}, fmt.Errorf("read publication %s: %w", publication, err)
	default:
		p.Exists = true
	}
	if err := conn.QueryRow(ctx, "SELECT current_user, current_database()").Scan(&c.Role, &c.Database); err != nil {
		return Catalog{}, fmt.Errorf("read current_user: %w", err)
	}
	q, err := relQuery(ctx, conn, `n.nspname = $2 AND c.relname = $3`)
	if err != nil {
		return Catalog{}, err
	}
	for _, t := range tables {
		st := TableState{Table: t}
		st.RelState, err = scanRel(conn.QueryRow(ctx, q, publication, t.Schema, t.Name))
		if err != nil {
			return Catalog{}, fmt.Errorf("read outbox table %s: %w", t, err)
		}
		c.Tables = append(c.Tables, st)
	}
	return c, nil
}

// ReadRelation reads relation id's state now (OID 0: it does not exist),
// as ReadCatalog reads a configured table's: a table is followed by its
// id, not its name (docs/design.md, "Table changes").
func ReadRelation(ctx context.Context, conn Querier, publication string, id uint32) (RelState, error) {
	q, err := relQuery(ctx, conn, `c.oid = $2::oid`)
	if err != nil {
		return RelState{}, err
	}
	st, err := scanRel(conn.QueryRow(ctx, q, publication, id))
	if err != nil {
		return RelState{}, fmt.Errorf("read relation %d: %w", id, err)
	}
	return st, nil
}

// RelFiles reads the storage file of relation id, or of each of its leaf
// partitions, by relation id (checkpoint.Table.Files): an empty map when
// it does not exist. A rewrite of the table gives a leaf another file.
func RelFiles(ctx context.Context, conn Querier, id uint32) (map[uint32]uint32, error) {
	var ids, files []uint32
	err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(l.relid ORDER BY l.relid), '{}'), coalesce(array_agg(l.file ORDER BY l.relid), '{}')
		FROM (SELECT l.relid, pg_relation_filenode(l.relid) AS file FROM (
			SELECT oid AS relid FROM pg_class WHERE oid = $1::oid AND relkind = 'r'
			UNION ALL SELECT relid::oid FROM pg_partition_tree($1::oid::regclass) WHERE isleaf) l) l
		WHERE l.file IS NOT NULL`, id).Scan(&ids, &files)
	if err != nil {
		return nil, fmt.Errorf("read the files of relation %d: %w", id, err)
	}
	m := make(map[uint32]uint32, len(ids))
	for i, id := range ids {
		m[id] = files[i]
	}
	return m, nil
}

// Rewritten reports whether a relation of recorded (RelFiles then) has
// another file in now (RelFiles now): the table was rewritten since. A
// relation gone, or new since, is no rewrite.
func Rewritten(recorded, now map[uint32]uint32) bool {
	for id, file := range recorded {
		if f, ok := now[id]; ok && f != file {
			return true
		}
	}
	return false
}

// Querier is a connection or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// relQuery is the query of a relation's state, selected by where (with
// $2 and on; $1 is the publication's name).
func relQuery(ctx context.Context, conn Querier, where string) (string, error) {
	// FOR TABLES IN SCHEMA and row filters are PostgreSQL 15's
	// (pg_publication_namespace, pg_publication_rel.prqual).
	var version int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		return "", fmt.Errorf("read server_version_num: %w", err)
	}
	bySchema, filtered := `NULL::text`, `false`
	if version >= 150000 {
		bySchema = `(SELECT 'schema:' || pn.oid FROM pg_publication_namespace pn WHERE pn.pnpubid = p.oid AND pn.pnnspid = c.relnamespace)`
		filtered = `pr.prqual IS NOT NULL`
	}
	return `WITH pub AS (SELECT * FROM pg_publication p WHERE p.pubname = $1)
		SELECT c.oid, n.nspname, c.relname, c.relkind = 'p', pg_has_role(current_user, c.relowner, 'USAGE'),
			CASE WHEN NOT u.unlogged THEN coalesce(r.member, (SELECT coalesce(CASE WHEN p.puballtables THEN 'all:' || p.oid END, ` + bySchema + `) FROM pub p), '') ELSE '' END,
			coalesce(r.filtered, false), u.unlogged
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		LEFT JOIN LATERAL (SELECT 'rel:' || pr.oid AS member, ` + filtered + ` AS filtered
			FROM pub p JOIN pg_publication_rel pr ON pr.prpubid = p.oid
			WHERE pr.prrelid = c.oid OR pr.prrelid IN (SELECT relid FROM pg_partition_ancestors(c.oid))
			ORDER BY pr.prrelid = c.oid DESC, pr.oid LIMIT 1) r ON true
		CROSS JOIN LATERAL (SELECT c.relpersistence <> 'p' OR EXISTS (SELECT FROM pg_partition_tree(c.oid) l
			JOIN pg_class lc ON lc.oid = l.relid WHERE lc.relpersistence <> 'p') AS unlogged) u
		WHERE ` + where + ` AND c.relkind IN ('r', 'p')`, nil
}

// scanRel reads relQuery's row; no row is a relation that does not exist.
func scanRel(row pgx.Row) (RelState, error) {
	var st RelState
	err := row.Scan(&st.OID, &st.Schema, &st.Name, &st.Partitioned, &st.Owned, &st.Member, &st.Filtered, &st.Unlogged)
	if errors.Is(err, pgx.ErrNoRows) {
		return RelState{}, nil
	}
	st.Published = st.Member != ""
	return st, err
}

// AddStatement is the statement that adds table t to publication name,
// ONLY t, as tableList names it.
func AddStatement(publication string, t Table) string {
	return fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE ONLY %s", pgident.Quote(publication), t)
}

// ViaRootStatement is the statement that makes publication name publish a
// partitioned table's rows under its own name.
func ViaRootStatement(publication string) string {
	return fmt.Sprintf("ALTER PUBLICATION %s SET (publish_via_partition_root = true)", pgident.Quote(publication))
}

// GrantStatement is the statement that lets role read table t, which
// backfills and repairs need (streaming does not).
func GrantStatement(t Table, role string) string {
	return fmt.Sprintf("GRANT SELECT ON %s TO %s", t, pgident.Quote(role))
}

// AddToPublication adds t to the publication, as Prepare does when the
// connector owns both and a configured table is missing from it; on a hot
// standby, on cfg's primary_url.
func AddToPublication(ctx context.Context, cfg postgres.Config, conn *pgx.Conn, publication string, t Table) error {
	standby, err := postgres.InRecovery(ctx, conn)
	if err != nil {
		return err
	}
	if standby {
		primary, err := postgres.ConnectPrimary(ctx, cfg, fmt.Sprintf("add outbox table %s to publication %s", t, publication), AddStatement(publication, t))
		if err != nil {
			return err
		}
		defer primary.Close(context.WithoutCancel(ctx))
		conn = primary
	}
	if _, err := conn.Exec(ctx, AddStatement(publication, t)); err != nil {
		return errtext.Fatalf("add outbox table %s to publication %s: %v; as the owner of both run: %s", t, publication, err, AddStatement(publication, t))
	}
	return nil
}
