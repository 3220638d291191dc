package tablewatch

import (
	"context"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/setup"
)

// Baseline fills rec.Tables, what the session streams of each table, from
// the catalog of a session's start, and adds the tables missing from the
// publication to it. On a first start (create) every table's relation is
// today's, and a table missing from a publication the connector may change
// is added to it before the slot exists; its Floor is set once the slot
// exists (Floors). On a resumed start a table's recorded relation stays
// until a repair sends what the table holds; a table the checkpoint does
// not know yet (configured since) starts at today's relation, with a Floor
// of now: its rows from before were never streamed. A configured table
// whose relation the checkpoint recorded under another name (renamed, and
// the configuration followed, or an exchange of names) takes that record:
// a relation is matched by its id before its name. A table missing from the
// publication is added back when it was recreated (another id), and
// refused when it is the table the checkpoint streamed: its rows inserted
// while it was out cannot be told from the others.
func Baseline(ctx context.Context, d Deps, rec *checkpoint.Record, cat setup.Catalog, first bool) error {
	b := &baseline{d: d}
	defer b.close(ctx)
	old := rec.Tables == nil && !first // a checkpoint written before ids were kept
	tables := map[string]checkpoint.Table{}
	claimed := map[uint32]string{} // relations resumed, by the table now streaming each
	for _, st := range cat.Tables {
		name := st.Table.String()
		prev, known := rec.Tables[name]
		if !first && st.OID != 0 && (!known || prev.Rel != st.OID) {
			if other, ok := recordedAs(d, rec, name, st.OID); ok {
				prev, known = other, true
			}
		}
		if known {
			former, err := b.existing(ctx, prev.Former)
			if err != nil {
				return err
			}
			prev.Former = former
		}
		if st.OID == 0 {
			// Missing under its name: renamed, it is followed by its id.
			rs, err := b.followed(ctx, known, prev)
			if err != nil {
				return err
			}
			if rs.OID == 0 {
				return setup.TableMissing(st.Table, cat.Database)
			}
			d.Metrics.TableRenamed(name, true)
			d.Log.Error("outbox table was renamed: the connector follows the relation it streamed, so its inserts under the new name are this table's events; set tables[].name to the new name in the config",
				"table", name, "renamed_to", setup.Table{TableName: outbox.TableName{Schema: rs.Schema, Name: rs.Name}}.String(), "relation", rs.OID)
			st.RelState = rs
		}
		if st.Unlogged {
			return setup.UnloggedTable(st.Table, d.ConfigFile)
		}
		if !first && known && prev.Rel == st.OID {
			if err := b.resume(ctx, st, &prev); err != nil {
				return err
			}
			tables[name] = prev
			claimed[st.OID] = name
			continue
		}
		published := st.Published
		if !st.Published {
			if err := b.publish(ctx, cat, &st); err != nil {
				return err
			}
		}
		if st.Filtered {
			return setup.Filtered(d.Postgres.Publication, st.Table)
		}
		switch {
		case known:
			tables[name] = prev // recreated: the watch repairs it, and records the new relation then
		case old && !published:
			// Repaired by the watch (suspect): it may have been
			// recreated while the connector was stopped.
		case first:
			tables[name] = checkpoint.Table{Rel: st.OID, Member: st.Member, Floor: checkpoint.NoFloor}
		default:
			floor, files, err := b.floor(ctx, st.OID)
			if err != nil {
				return err
			}
			tables[name] = checkpoint.Table{Rel: st.OID, Member: st.Member, Floor: floor, Files: files}
		}
	}
	disown(tables, claimed)
	rec.Tables = tables
	return nil
}

// disown takes from each table's record the relations another table now
// resumes (claimed): a table whose name another took (DROP b; ALTER TABLE
// a RENAME TO b; CREATE TABLE a, with both configured) kept a record of
// the relation b now streams, and its repair made it a's former relation:
// b's inserts went to a's topic. Its record then names no relation (a
// recreated table with nothing left of the old one).
func disown(tables map[string]checkpoint.Table, claimed map[uint32]string) {
	for name, st := range tables {
		if owner, ok := claimed[st.Rel]; ok && owner != name {
			st.Rel, st.Member = 0, ""
		}
		st.Former = slices.DeleteFunc(slices.Clone(st.Former), func(id uint32) bool {
			owner, ok := claimed[id]
			return ok && owner != name
		})
		if len(st.Former) == 0 {
			st.Former = nil
		}
		tables[name] = st
	}
}

// resume checks, on a resumed start, table st whose relation is the one
// the checkpoint streamed (prev): still in the publication, through the
// same membership, without a row filter. A table that left and came back
// while the connector was stopped received inserts that never reached the
// slot: said loudly, and retention keeps every row from before (its Floor
// moves to now). So does a table with rows below its Floor rewritten
// since the Floor was set (rewritten).
func (b *baseline) resume(ctx context.Context, st setup.TableState, prev *checkpoint.Table) error {
	switch {
	case !st.Published:
		return setup.LeftPublication(b.d.Postgres.Publication, b.d.ConfigFile, st.Table)
	case st.Filtered:
		return setup.Filtered(b.d.Postgres.Publication, st.Table)
	case prev.Member != "" && st.Member != prev.Member:
		b.d.Log.Error("outbox table left the publication and was added back while the connector was stopped: the inserts it received in between never reached the connector; send them with cdc backfill (--table, --where); retention keeps the table's rows from before this start",
			"table", st.Table.String(), "publication", b.d.Postgres.Publication)
		prev.Member, prev.Floor = st.Member, checkpoint.NoFloor
	case prev.Member == "":
		prev.Member = st.Member
	}
	if prev.Floor != 0 && prev.Floor != checkpoint.NoFloor {
		rewritten, err := b.rewritten(ctx, st.Table, prev)
		if err != nil {
			return err
		}
		if rewritten {
			prev.Floor = checkpoint.NoFloor
		}
	}
	if prev.Floor == checkpoint.NoFloor {
		floor, files, err := b.floor(ctx, prev.Rel)
		if err != nil {
			return err
		}
		prev.Floor, prev.Files = floor, files
	}
	return nil
}

// rewritten reports whether table t's relation, whose Floor is above 0,
// was rewritten since the Floor was set (checkpoint.Table.Files): its rows
// below the Floor may carry the rewrite's xid now, so the Floor no longer
// keeps them. A record without Files (written before they were kept)
// takes today's: a rewrite before now cannot be seen.
func (b *baseline) rewritten(ctx context.Context, t setup.Table, prev *checkpoint.Table) (bool, error) {
	conn, err := b.conn(ctx)
	if err != nil {
		return false, err
	}
	files, err := setup.RelFiles(ctx, conn, prev.Rel)
	if err != nil {
		return false, err
	}
	if prev.Files == nil {
		prev.Files = files
		return false, nil
	}
	if !setup.Rewritten(prev.Files, files) {
		return false, nil
	}
	b.d.Log.Warn("outbox table was rewritten (ALTER TABLE ... TYPE, a column with a volatile default, VACUUM FULL or CLUSTER) since the connector began streaming it without its older rows: their transactions no longer tell them from the rows streamed, so retention keeps every row from before this start; delete those by hand once Kafka holds them",
		"table", t.String())
	return true, nil
}

// publish adds st to the publication where the connector may, and reads
// its state again; otherwise it is the error that says what to run.
func (b *baseline) publish(ctx context.Context, cat setup.Catalog, st *setup.TableState) error {
	if !cat.Publication.Owned || !st.Owned {
		why := "it does not own the table"
		if !cat.Publication.Owned {
			why = "it does not own the publication"
		}
		return setup.NotPublished(cat.Publication.Name, st.Table, why, cat.Role)
	}
	conn, err := b.conn(ctx)
	if err != nil {
		return err
	}
	if err := setup.AddToPublication(ctx, b.d.Postgres, conn, cat.Publication.Name, st.Table); err != nil {
		return err
	}
	b.d.Log.Warn("added an outbox table that was missing from the publication", "table", st.Table.String(), "publication", cat.Publication.Name)
	// On a standby, the membership once it has replayed the change.
	if err := postgres.CatchUp(ctx, b.d.Postgres, conn); err != nil {
		return err
	}
	rs, err := setup.ReadRelation(ctx, conn, cat.Publication.Name, st.OID)
	if err != nil {
		return err
	}
	st.RelState = rs
	return nil
}

// maxNames bounds the former names a table's record keeps
// (checkpoint.Table.Names).
const maxNames = 4

// recordedAs finds the checkpoint's record of relation id, configured
// table name's now, under another name: the table was renamed and the
// configuration followed it, or two tables exchanged names (and the
// configuration followed, as the watch's error asks). A relation is its
// record's whatever its name, so each resumes from the checkpoint; were
// the record under the name taken instead, each would be "recreated" as
// the other's relation, and the watch would stop on the exchange at every
// start. A configuration that did not follow an exchange made while the
// connector was stopped cannot be told from one that did: its events go
// where the names now say, none lost. The record keeps the name it had
// (checkpoint.Table.Names), by which a redrive finds the table's parked
// records.
func recordedAs(d Deps, rec *checkpoint.Record, name string, id uint32) (checkpoint.Table, bool) {
	names := make([]string, 0, len(rec.Tables))
	for other := range rec.Tables {
		names = append(names, other)
	}
	slices.Sort(names)
	for _, other := range names {
		if st := rec.Tables[other]; other != name && st.Rel == id {
			st.Names = append(slices.DeleteFunc(slices.Clone(st.Names), func(n string) bool { return n == other || n == name }), other)
			st.Names = st.Names[max(len(st.Names)-maxNames, 0):]
			d.Log.Warn("a configured outbox table is the relation the checkpoint streamed under another name (it was renamed, and the configuration followed): it streams on from the checkpoint", "table", name, "was", other, "relation", id)
			return st, true
		}
	}
	return checkpoint.Table{}, false
}

// Floors sets, once a first start created the slot (or adopted one), the
// Floor of each table Baseline left at NoFloor to the next xid now: every
// transaction at or above it commits after the slot's consistent point, so
// the stream carries it. A first start's backfill of every row lowers it
// to 0 once done (package session's Save). On a standby without a
// primary_url nothing is known: they stay NoFloor, and the next start sets
// them.
func Floors(ctx context.Context, d Deps, rec *checkpoint.Record) error {
	b := &baseline{d: d}
	defer b.close(ctx)
	for name, st := range rec.Tables {
		if st.Floor != checkpoint.NoFloor {
			continue
		}
		floor, files, err := b.floor(ctx, st.Rel)
		if err != nil {
			return err
		}
		st.Floor, st.Files = floor, files
		rec.Tables[name] = st
	}
	return nil
}

// baseline holds what Baseline and Floors read with: a catalog
// connection.
type baseline struct {
	d   Deps
	sql *pgx.Conn
}

func (b *baseline) conn(ctx context.Context) (*pgx.Conn, error) {
	if b.sql == nil {
		conn, err := postgres.ConnectSQL(ctx, b.d.Postgres)
		if err != nil {
			return nil, err
		}
		b.sql = conn
	}
	return b.sql, nil
}

func (b *baseline) close(ctx context.Context) {
	if b.sql != nil {
		b.sql.Close(context.WithoutCancel(ctx))
	}
}

// floor is a Floor for relation rel, the next xid on the server that
// assigns them, and the relation's files (checkpoint.Table.Files) read
// just before it: a rewrite after the files were read is seen (another
// file), and one before gave its xid to the rows below the Floor. NoFloor
// (and no files) where the next xid cannot be known.
func (b *baseline) floor(ctx context.Context, rel uint32) (uint64, map[uint32]uint32, error) {
	conn, err := b.conn(ctx)
	if err != nil {
		return 0, nil, err
	}
	files, err := setup.RelFiles(ctx, conn, rel)
	if err != nil {
		return 0, nil, err
	}
	next, ok, err := postgres.WritableNextXID(ctx, b.d.Postgres)
	if err != nil || !ok {
		return checkpoint.NoFloor, nil, err
	}
	return next, files, nil
}

// followed is the relation the checkpoint recorded for a table missing
// under its name (known, prev), as it is now: OID 0 when none was recorded
// or it is gone too.
func (b *baseline) followed(ctx context.Context, known bool, prev checkpoint.Table) (setup.RelState, error) {
	if !known || prev.Rel == 0 {
		return setup.RelState{}, nil
	}
	conn, err := b.conn(ctx)
	if err != nil {
		return setup.RelState{}, err
	}
	return setup.ReadRelation(ctx, conn, b.d.Postgres.Publication, prev.Rel)
}

// existing returns the ids of ids that still name a relation.
func (b *baseline) existing(ctx context.Context, ids []uint32) ([]uint32, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	conn, err := b.conn(ctx)
	if err != nil {
		return nil, err
	}
	var kept []uint32
	for _, id := range ids {
		rs, err := setup.ReadRelation(ctx, conn, b.d.Postgres.Publication, id)
		if err != nil {
			return nil, err
		}
		if rs.OID != 0 {
			kept = append(kept, id)
		}
	}
	return kept, nil
}
