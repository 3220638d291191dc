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
	// errors tell an operator to run.
	Role string
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
	// OID is the table's relation id: a new one means the table was
	// dropped and created again. 0: no table of that name exists.
	OID         uint32
	Partitioned bool
	// Published: its inserts reach the publication, as its own or
	// through an ancestor's membership, FOR ALL TABLES, or its schema's.
	// AutoPublished: through FOR ALL TABLES or its schema's membership,
	// so a table created again under its name is published from the
	// moment it exists.
	Published, AutoPublished bool
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
	// FOR TABLES IN SCHEMA is PostgreSQL 15's (pg_publication_namespace).
	var version int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int, current_user").Scan(&version, &c.Role); err != nil {
		return Catalog{}, fmt.Errorf("read server_version_num: %w", err)
	}
	bySchema := `false`
	if version >= 150000 {
		bySchema = `EXISTS (SELECT 1 FROM pg_publication_namespace pn WHERE pn.pnpubid = p.oid AND pn.pnnspid = c.relnamespace)`
	}
	q := `SELECT c.oid, c.relkind = 'p', pg_has_role(current_user, c.relowner, 'USAGE'),
		coalesce((SELECT p.puballtables OR ` + bySchema + ` FROM pg_publication p WHERE p.pubname = $3), false),
		EXISTS (SELECT 1 FROM pg_publication p JOIN pg_publication_rel pr ON pr.prpubid = p.oid
			WHERE p.pubname = $3 AND (pr.prrelid = c.oid OR pr.prrelid IN (SELECT relid FROM pg_partition_ancestors(c.oid))))
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')`
	for _, t := range tables {
		st := TableState{Table: t}
		var member bool
		err := conn.QueryRow(ctx, q, t.Schema, t.Name, publication).Scan(&st.OID, &st.Partitioned, &st.Owned, &st.AutoPublished, &member)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return Catalog{}, fmt.Errorf("read outbox table %s: %w", t, err)
		}
		st.Published = st.AutoPublished || member
		c.Tables = append(c.Tables, st)
	}
	return c, nil
}

// AddStatement is the statement that adds table t to publication name.
func AddStatement(publication string, t Table) string {
	return fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s", pgident.Quote(publication), t)
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
