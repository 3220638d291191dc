package tablewatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxcdc/cdc/internal/backfill"
	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/metrics"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/setup"
)

// maxFresh bounds the ids of fresh events a session notes per table.
// Past it, a repair may send those rows a second time; none is lost.
const maxFresh = 100_000

// Watch is one session's view of the tables' lives.
type Watch struct {
	deps   Deps
	log    hclog.Logger
	byName map[string]*outbox.Source // the configured tables, by SQL name

	mu sync.Mutex
	// streamed is the relation id streamed for each table, as the
	// checkpoint will record it; suspect, for a table whose id the
	// checkpoint does not hold (written before it kept them) and which
	// was not in the publication, the relation whose events are fresh.
	streamed map[*outbox.Source]uint32
	suspect  map[*outbox.Source]uint32
	// pending are the repairs announced and not yet reached by the
	// stream, by id; repairing, the tables they are for.
	pending   map[string]*Repair
	repairing map[*outbox.Source]bool

	// The stream's goroutine alone uses these: the ids of fresh events
	// it met, by table, and the relations it reported as unmapped.
	fresh    map[*outbox.Source]map[string]struct{}
	overflow map[*outbox.Source]bool
	unmapped map[string]bool

	// The watch's goroutine alone uses this: tables found missing.
	missing map[*outbox.Source]bool
}

// Repair is a recreated table's rows still to send, where the stream
// reaches its ControlRepair message.
type Repair struct {
	ID    string
	Table *outbox.Source
	Rel   uint32             // the table's relation id now
	Snap  *backfill.Snapshot // nil: nothing to read (published since it was created)
}

// Deps is what a Watch needs of its pipeline.
type Deps struct {
	Postgres postgres.Config
	Tables   []*outbox.Source
	// WALTables are Tables' outbox tables with the columns read, for the
	// catalog.
	WALTables []setup.Table
	// ConfigFile is the config's path, for the commands an error names.
	ConfigFile string
	Metrics    *metrics.Metrics
	// OpenSnapshot opens a snapshot of a table's rows for a repair.
	OpenSnapshot func(ctx context.Context, t *outbox.Source) (*backfill.Snapshot, error)
	Log          hclog.Logger
}

// New starts a session's watch from rec, the checkpoint the session
// starts at, whose Tables Baseline filled in.
func New(d Deps, rec checkpoint.Record, cat setup.Catalog) *Watch {
	w := &Watch{
		deps: d, log: d.Log.Named("tables"), byName: map[string]*outbox.Source{},
		streamed: map[*outbox.Source]uint32{}, suspect: map[*outbox.Source]uint32{},
		pending: map[string]*Repair{}, repairing: map[*outbox.Source]bool{},
		fresh: map[*outbox.Source]map[string]struct{}{}, overflow: map[*outbox.Source]bool{}, unmapped: map[string]bool{},
		missing: map[*outbox.Source]bool{},
	}
	for _, t := range d.Tables {
		if t.IsMessage() {
			continue
		}
		w.byName[t.String()] = t
		if id, ok := rec.Tables[t.String()]; ok {
			w.streamed[t] = id
		} else if st := cat.Find(t.Name.Schema, t.Name.Name); st != nil && st.OID != 0 {
			w.suspect[t] = st.OID
		}
	}
	return w
}

// Baseline fills rec.Tables, the relation id streamed for each
// table, from the catalog of a session's start, and adds the tables
// missing from the publication to it. On a first start (create) every
// table's id is today's, and a table missing from a publication the
// connector may change is added to it before the slot exists. On a
// resumed start a table's recorded id stays until a repair sends what the
// table holds; a table the checkpoint does not know yet (configured since)
// starts at today's id, like a first start's. A table missing from the
// publication is added back when it was recreated (another id), and
// refused when it is the table the checkpoint streamed: its rows inserted
// while it was out cannot be told from the others.
func Baseline(ctx context.Context, d Deps, rec *checkpoint.Record, cat setup.Catalog, first bool) error {
	old := rec.Tables == nil && !first // a checkpoint written before ids were kept
	tables := map[string]uint32{}
	for _, st := range cat.Tables {
		name := st.Table.String()
		id, known := rec.Tables[name]
		if !first && known && id == st.OID && !st.Published {
			return LeftPublication(d, st.Table)
		}
		if !st.Published {
			if !cat.Publication.Owned || !st.Owned {
				why := "it does not own the table"
				if !cat.Publication.Owned {
					why = "it does not own the publication"
				}
				return setup.NotPublished(cat.Publication.Name, st.Table, why, cat.Role)
			}
			conn, err := postgres.ConnectSQL(ctx, d.Postgres)
			if err != nil {
				return err
			}
			err = setup.AddToPublication(ctx, d.Postgres, conn, cat.Publication.Name, st.Table)
			conn.Close(context.WithoutCancel(ctx))
			if err != nil {
				return err
			}
			d.Log.Warn("added an outbox table that was missing from the publication", "table", name, "publication", cat.Publication.Name)
		}
		switch {
		case known:
			tables[name] = id
		case old && !st.Published:
			// Repaired by the watch (suspect): it may have been
			// recreated while the connector was stopped.
		default:
			tables[name] = st.OID
		}
	}
	rec.Tables = tables
	return nil
}

// LeftPublication is the error for table t, streamed before and no longer
// in the publication.
func LeftPublication(d Deps, t setup.Table) error {
	pub := d.Postgres.Publication
	return &errtext.Fatal{Msg: fmt.Sprintf("outbox table %s left publication %s (someone removed it), so its inserts since do not reach the connector; "+
		"as the publication's owner run: %s; then send the rows it received while it was out with cdc backfill --config %s --table %s --where '<those rows>', and start the connector again",
		t, pub, setup.AddStatement(pub, t), d.ConfigFile, t)}
}

// IsFresh is the decoder's Decoder.Fresh.
func (w *Watch) IsFresh(t *outbox.Source, id uint32) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s, ok := w.streamed[t]; ok {
		return id != s
	}
	s, ok := w.suspect[t]
	return ok && id == s
}

// NoteFresh notes a fresh event the stream met, on its goroutine.
func (w *Watch) NoteFresh(ev *outbox.Event) {
	ids := w.fresh[ev.Source]
	if ids == nil {
		ids = map[string]struct{}{}
		w.fresh[ev.Source] = ids
	}
	if len(ids) >= maxFresh {
		if !w.overflow[ev.Source] {
			w.overflow[ev.Source] = true
			w.log.Warn("more events of a recreated table than a repair keeps track of; rows streamed past these may be sent twice by the repair (none is lost)", "table", ev.Source.String(), "tracked", maxFresh)
		}
		return
	}
	ids[ev.ID()] = struct{}{}
}

// UnmappedInsert counts an insert into a relation no table maps, and logs
// the first of each relation.
func (w *Watch) UnmappedInsert(rel string) {
	w.deps.Metrics.Unmapped(rel)
	if w.unmapped[rel] {
		return
	}
	w.unmapped[rel] = true
	w.log.Warn("an insert into a relation of the publication that no configured table maps: not an event; if it is an outbox table, configure it, else remove it from the publication",
		"relation", rel, "publication", w.deps.Postgres.Publication)
}

// Run checks the catalog at once and then every
// postgres.catalog_check_interval, until ctx ends or a check finds what
// must stop the session, which it hands to fail.
func (w *Watch) Run(ctx context.Context, fail func(error)) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.WithoutCancel(ctx))
		}
		w.closeRepairs(ctx)
	}()
	t := time.NewTicker(w.deps.Postgres.CatalogCheckInterval)
	defer t.Stop()
	for {
		var err error
		if conn == nil {
			conn, err = postgres.ConnectSQL(ctx, w.deps.Postgres)
		}
		if err == nil {
			err = w.check(ctx, conn)
		}
		var fatal *errtext.Fatal
		switch {
		case ctx.Err() != nil:
			return
		case errors.As(err, &fatal):
			fail(err)
			return
		case err != nil:
			// The next look tries again; the stream goes on meanwhile
			// (what it streams is not wrong, only possibly incomplete
			// until the next look).
			w.log.Warn("could not look at the outbox tables in the catalog; trying again", "error", errtext.OneLine(err))
			if conn != nil {
				conn.Close(context.WithoutCancel(ctx))
				conn = nil
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// check compares the catalog with what the session streams, once.
func (w *Watch) check(ctx context.Context, conn *pgx.Conn) error {
	cfg := w.deps.Postgres
	// On a hot standby, how far its replay is behind the primary, with
	// the same look.
	var delay float64
	if err := conn.QueryRow(ctx, `SELECT CASE WHEN pg_is_in_recovery() THEN coalesce(extract(epoch FROM now() - pg_last_xact_replay_timestamp())::float8, 0) ELSE 0 END`).Scan(&delay); err != nil {
		return fmt.Errorf("read the standby's replay delay: %w", err)
	}
	w.deps.Metrics.StandbyDelay.Set(max(delay, 0))
	cat, err := setup.ReadCatalog(ctx, conn, cfg.Publication, w.deps.WALTables)
	if err != nil {
		return err
	}
	for _, st := range cat.Tables {
		t := w.byName[st.Table.String()]
		if t == nil {
			continue
		}
		if st.OID == 0 {
			if !w.missing[t] {
				w.missing[t] = true
				w.deps.Metrics.TableMissing(t.String(), true)
				w.log.Warn("outbox table does not exist (dropped or renamed); nothing can be written to it meanwhile, and once a table of that name exists again the connector publishes it and sends what it received",
					"table", t.String())
			}
			continue
		}
		if w.missing[t] {
			delete(w.missing, t)
			w.deps.Metrics.TableMissing(t.String(), false)
		}
		w.mu.Lock()
		streamed, known := w.streamed[t]
		busy := w.repairing[t]
		w.mu.Unlock()
		if busy || (known && streamed == st.OID && st.Published) {
			continue
		}
		if known && streamed == st.OID {
			return LeftPublication(w.deps, st.Table)
		}
		if !st.Published {
			if !cat.Publication.Owned || !st.Owned {
				why := "it does not own the table"
				if !cat.Publication.Owned {
					why = "it does not own the publication"
				}
				return &errtext.Fatal{Msg: fmt.Sprintf("outbox table %s was dropped and created again, and the new table is not in publication %s, so its inserts do not reach the connector (which may not add it: %s); "+
					"as the owner of the publication and the table run: %s; %s; then start the connector again: it sends the rows the new table received meanwhile, each once",
					t, cfg.Publication, why, setup.AddStatement(cfg.Publication, st.Table), setup.GrantStatement(st.Table, cat.Role))}
			}
			if err := setup.AddToPublication(ctx, cfg, conn, cfg.Publication, st.Table); err != nil {
				return err
			}
			// On a standby: the rows the repair reads, as of the table's
			// publication on the primary.
			if err := postgres.CatchUp(ctx, cfg, conn); err != nil {
				return err
			}
			w.log.Warn("outbox table was dropped and created again; added the new table to the publication, and sending the rows it received before", "table", t.String(), "publication", cfg.Publication)
		}
		if err := w.startRepair(ctx, conn, t, st.OID, !st.AutoPublished, cat.Role); err != nil {
			return err
		}
	}
	return nil
}

// startRepair opens a repair of table t, whose relation is rel now and
// published: a snapshot of its rows (with rows), then the message that
// tells the stream where to send them.
func (w *Watch) startRepair(ctx context.Context, conn *pgx.Conn, t *outbox.Source, rel uint32, rows bool, role string) error {
	r := &Repair{ID: backfill.NewID(), Table: t, Rel: rel}
	if rows {
		snap, err := w.deps.OpenSnapshot(ctx, t)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42501" { // insufficient_privilege: a new table has no grants
			return &errtext.Fatal{Msg: fmt.Sprintf("outbox table %s was dropped and created again, and the connector's role may not read the new one to send the rows it received before it was published; as its owner run: %s; then start the connector again",
				t, setup.GrantStatement(setup.Table{TableName: t.Name}, role))}
		}
		if err != nil {
			return err
		}
		r.Snap = snap
	}
	w.mu.Lock()
	w.pending[r.ID] = r
	w.repairing[t] = true
	w.mu.Unlock()
	if err := EmitRepair(ctx, w.deps.Postgres, conn, r.ID); err != nil {
		w.drop(ctx, r)
		return err
	}
	total := int64(0)
	if r.Snap != nil {
		total = r.Snap.Total
	}
	w.log.Info("repair of a recreated table under way: its rows go where the stream reaches this point", "table", t.String(), "rows", total)
	return nil
}

// Take returns the pending repair id and forgets it, or nil.
func (w *Watch) Take(id string) *Repair {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.pending[id]
	delete(w.pending, id)
	return r
}

// drop forgets repair r, which will not be sent, and lets the watch open
// another for its table.
func (w *Watch) drop(ctx context.Context, r *Repair) {
	w.mu.Lock()
	delete(w.pending, r.ID)
	delete(w.repairing, r.Table)
	w.mu.Unlock()
	if r.Snap != nil {
		r.Snap.Close(ctx)
	}
}

// Done records that r's table's relation is streamed from here on,
// forgets the fresh events the stream noted of it, and returns the
// tables' ids for the checkpoint note. The stream's goroutine calls it.
func (w *Watch) Done(r *Repair) map[string]uint32 {
	delete(w.fresh, r.Table)
	delete(w.overflow, r.Table)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.streamed[r.Table] = r.Rel
	delete(w.suspect, r.Table)
	delete(w.repairing, r.Table)
	ids := map[string]uint32{}
	for t, id := range w.streamed {
		ids[t.String()] = id
	}
	return ids
}

// closeRepairs closes the snapshots of repairs the stream did not reach:
// the next session repairs their tables again.
func (w *Watch) closeRepairs(ctx context.Context) {
	w.mu.Lock()
	pending := maps.Clone(w.pending)
	w.mu.Unlock()
	for _, r := range pending {
		w.drop(ctx, r)
	}
}

// Partitions finds the configured table a leaf partition belongs to, for
// the decoder (decode.Decoder.Partition), on a catalog connection of its
// own, opened at the first lookup. A publication the connector made
// publishes partitions via their root, so lookups happen only for one
// that does not, or for relations of a broader publication.
type Partitions struct {
	Postgres postgres.Config
	Tables   []*outbox.Source
	conn     *pgx.Conn
}

// Lookup returns the configured table that rel is a partition of, at any
// depth, and that table's relation id.
func (pt *Partitions) Lookup(ctx context.Context, rel decode.Relation) (*outbox.Source, uint32, bool, error) {
	if pt.conn == nil {
		conn, err := postgres.ConnectSQL(ctx, pt.Postgres)
		if err != nil {
			return nil, 0, false, err
		}
		pt.conn = conn
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
func (pt *Partitions) Close(ctx context.Context) {
	if pt.conn != nil {
		pt.conn.Close(context.WithoutCancel(ctx))
		pt.conn = nil
	}
}

// Fresh is the ids of the fresh events of t the stream noted. The
// stream's goroutine calls it.
func (w *Watch) Fresh(t *outbox.Source) map[string]struct{} { return w.fresh[t] }

// ControlRepair announces, in the stream, the point at which a table the
// pipeline found recreated (or added back to its publication) is published
// again: the stream sends there the rows of the table's backfill.Snapshot, taken
// after the table was published and before this message was written, less
// those it streamed itself (docs/design.md, "Table changes"). Its ID is
// random, and known only to the session that wrote it: one another role
// writes, or an earlier session's read again, names no repair and is
// passed over.
const ControlRepair = "table-repair"

// EmitRepair writes the ControlRepair message with id, in a transaction of
// its own on conn, or on cfg's primary_url while conn's server is a hot
// standby.
func EmitRepair(ctx context.Context, cfg postgres.Config, conn *pgx.Conn, id string) error {
	b, _ := json.Marshal(backfill.Control{Type: ControlRepair, ID: id})
	return postgres.EmitMessage(ctx, cfg, conn, decode.ControlPrefix, string(b), "a table repair's message")
}
