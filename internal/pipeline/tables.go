package pipeline

import (
	"context"
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
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/setup"
)

// The outbox tables' lives (docs/design.md, "Table changes"). A table's
// inserts reach the slot only while the publication holds it: a table
// dropped and created again has a new relation id that a FOR TABLE
// publication does not hold, and its rows never reach the WAL stream. The
// checkpoint records the relation id streamed for each table
// (checkpoint.Record.Tables). Each session compares it with the catalog, at
// its start and every postgres.catalog_check_interval (tableWatch.check):
//
//   - a table with another relation id (recreated) is published again
//     (AddToPublication, when the role owns the publication and the table;
//     otherwise the session stops with the statement to run), and then
//     repaired: a snapshot of its rows is taken after it is published, a
//     ControlRepair message written after the snapshot, and where the
//     stream reaches the message it sends the snapshot's rows less those
//     it streamed itself (the fresh events it noted since the session
//     started), and records the new relation id in the checkpoint of that
//     position. Rows committed before the snapshot are in it; rows
//     committed after the table was published are in the stream before
//     the message; the noted ids keep a row in both from going twice.
//   - the same table, gone from the publication, stops the session: its
//     rows inserted meanwhile cannot be told from the rows streamed
//     before, so only an operator can say which to send (cdc backfill).
//   - a table that does not exist is reported, and checked again: nothing
//     can be written to it meanwhile.

// maxFresh bounds the ids of fresh events a session notes per table.
// Past it, a repair may send those rows a second time; none is lost.
const maxFresh = 100_000

// tableWatch is one session's view of the tables' lives.
type tableWatch struct {
	p      *Pipeline
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
	pending   map[string]*repair
	repairing map[*outbox.Source]bool

	// The stream's goroutine alone uses these: the ids of fresh events
	// it met, by table, and the relations it reported as unmapped.
	fresh    map[*outbox.Source]map[string]struct{}
	overflow map[*outbox.Source]bool
	unmapped map[string]bool

	// The watch's goroutine alone uses this: tables found missing.
	missing map[*outbox.Source]bool
}

// repair is a recreated table's rows still to send, where the stream
// reaches its ControlRepair message.
type repair struct {
	id    string
	table *outbox.Source
	rel   uint32             // the table's relation id now
	snap  *backfill.Snapshot // nil: nothing to read (published since it was created)
}

// newTableWatch starts a session's watch from rec, the checkpoint the
// session starts at, whose Tables tableBaseline filled in.
func newTableWatch(p *Pipeline, rec checkpoint.Record, cat setup.Catalog) *tableWatch {
	w := &tableWatch{
		p: p, log: p.log.Named("tables"), byName: map[string]*outbox.Source{},
		streamed: map[*outbox.Source]uint32{}, suspect: map[*outbox.Source]uint32{},
		pending: map[string]*repair{}, repairing: map[*outbox.Source]bool{},
		fresh: map[*outbox.Source]map[string]struct{}{}, overflow: map[*outbox.Source]bool{}, unmapped: map[string]bool{},
		missing: map[*outbox.Source]bool{},
	}
	for _, t := range p.cfg.Tables {
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

// tableBaseline fills rec.Tables, the relation id streamed for each
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
func (p *Pipeline) tableBaseline(ctx context.Context, rec *checkpoint.Record, cat setup.Catalog, first bool) error {
	old := rec.Tables == nil && !first // a checkpoint written before ids were kept
	tables := map[string]uint32{}
	for _, st := range cat.Tables {
		name := st.Table.String()
		id, known := rec.Tables[name]
		if !first && known && id == st.OID && !st.Published {
			return p.leftPublication(st.Table)
		}
		if !st.Published {
			if !cat.Publication.Owned || !st.Owned {
				why := "it does not own the table"
				if !cat.Publication.Owned {
					why = "it does not own the publication"
				}
				return setup.NotPublished(cat.Publication.Name, st.Table, why, cat.Role)
			}
			conn, err := postgres.ConnectSQL(ctx, p.cfg.Postgres)
			if err != nil {
				return err
			}
			err = setup.AddToPublication(ctx, p.cfg.Postgres, conn, cat.Publication.Name, st.Table)
			conn.Close(context.WithoutCancel(ctx))
			if err != nil {
				return err
			}
			p.log.Warn("added an outbox table that was missing from the publication", "table", name, "publication", cat.Publication.Name)
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

// leftPublication is the error for table t, streamed before and no longer
// in the publication.
func (p *Pipeline) leftPublication(t setup.Table) error {
	pub := p.cfg.Postgres.Publication
	return &errtext.Fatal{Msg: fmt.Sprintf("outbox table %s left publication %s (someone removed it), so its inserts since do not reach the connector; "+
		"as the publication's owner run: %s; then send the rows it received while it was out with cdc backfill --config %s --table %s --where '<those rows>', and start the connector again",
		t, pub, setup.AddStatement(pub, t), p.configFile(), t)}
}

// isFresh is the decoder's Decoder.Fresh.
func (w *tableWatch) isFresh(t *outbox.Source, id uint32) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s, ok := w.streamed[t]; ok {
		return id != s
	}
	s, ok := w.suspect[t]
	return ok && id == s
}

// noteFresh notes a fresh event the stream met, on its goroutine.
func (w *tableWatch) noteFresh(ev *outbox.Event) {
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

// unmappedInsert counts an insert into a relation no table maps, and logs
// the first of each relation.
func (w *tableWatch) unmappedInsert(rel string) {
	w.p.m.Unmapped(rel)
	if w.unmapped[rel] {
		return
	}
	w.unmapped[rel] = true
	w.log.Warn("an insert into a relation of the publication that no configured table maps: not an event; if it is an outbox table, configure it, else remove it from the publication",
		"relation", rel, "publication", w.p.cfg.Postgres.Publication)
}

// run checks the catalog at once and then every
// postgres.catalog_check_interval, until ctx ends or a check finds what
// must stop the session, which it hands to fail.
func (w *tableWatch) run(ctx context.Context, fail func(error)) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.WithoutCancel(ctx))
		}
		w.closeRepairs(ctx)
	}()
	t := time.NewTicker(w.p.cfg.Postgres.CatalogCheckInterval)
	defer t.Stop()
	for {
		var err error
		if conn == nil {
			conn, err = postgres.ConnectSQL(ctx, w.p.cfg.Postgres)
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
func (w *tableWatch) check(ctx context.Context, conn *pgx.Conn) error {
	cfg := w.p.cfg.Postgres
	// On a hot standby, how far its replay is behind the primary, with
	// the same look.
	var delay float64
	if err := conn.QueryRow(ctx, `SELECT CASE WHEN pg_is_in_recovery() THEN coalesce(extract(epoch FROM now() - pg_last_xact_replay_timestamp())::float8, 0) ELSE 0 END`).Scan(&delay); err != nil {
		return fmt.Errorf("read the standby's replay delay: %w", err)
	}
	w.p.m.StandbyDelay.Set(max(delay, 0))
	cat, err := setup.ReadCatalog(ctx, conn, cfg.Publication, w.p.cfg.WALTables())
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
				w.p.m.TableMissing(t.String(), true)
				w.log.Warn("outbox table does not exist (dropped or renamed); nothing can be written to it meanwhile, and once a table of that name exists again the connector publishes it and sends what it received",
					"table", t.String())
			}
			continue
		}
		if w.missing[t] {
			delete(w.missing, t)
			w.p.m.TableMissing(t.String(), false)
		}
		w.mu.Lock()
		streamed, known := w.streamed[t]
		busy := w.repairing[t]
		w.mu.Unlock()
		if busy || (known && streamed == st.OID && st.Published) {
			continue
		}
		if known && streamed == st.OID {
			return w.p.leftPublication(st.Table)
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
func (w *tableWatch) startRepair(ctx context.Context, conn *pgx.Conn, t *outbox.Source, rel uint32, rows bool, role string) error {
	r := &repair{id: backfill.NewID(), table: t, rel: rel}
	if rows {
		snap, err := w.p.backfills().OpenSnapshot(ctx, t)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42501" { // insufficient_privilege: a new table has no grants
			return &errtext.Fatal{Msg: fmt.Sprintf("outbox table %s was dropped and created again, and the connector's role may not read the new one to send the rows it received before it was published; as its owner run: %s; then start the connector again",
				t, setup.GrantStatement(setup.Table{TableName: t.Name}, role))}
		}
		if err != nil {
			return err
		}
		r.snap = snap
	}
	w.mu.Lock()
	w.pending[r.id] = r
	w.repairing[t] = true
	w.mu.Unlock()
	if err := backfill.EmitRepair(ctx, w.p.cfg.Postgres, conn, r.id); err != nil {
		w.drop(ctx, r)
		return err
	}
	total := int64(0)
	if r.snap != nil {
		total = r.snap.Total
	}
	w.log.Info("repair of a recreated table under way: its rows go where the stream reaches this point", "table", t.String(), "rows", total)
	return nil
}

// take returns the pending repair id and forgets it, or nil.
func (w *tableWatch) take(id string) *repair {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.pending[id]
	delete(w.pending, id)
	return r
}

// drop forgets repair r, which will not be sent, and lets the watch open
// another for its table.
func (w *tableWatch) drop(ctx context.Context, r *repair) {
	w.mu.Lock()
	delete(w.pending, r.id)
	delete(w.repairing, r.table)
	w.mu.Unlock()
	if r.snap != nil {
		r.snap.Close(ctx)
	}
}

// done records that r's table's relation is streamed from here on, and
// returns the tables' ids for the checkpoint note.
func (w *tableWatch) done(r *repair) map[string]uint32 {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.streamed[r.table] = r.rel
	delete(w.suspect, r.table)
	delete(w.repairing, r.table)
	ids := map[string]uint32{}
	for t, id := range w.streamed {
		ids[t.String()] = id
	}
	return ids
}

// closeRepairs closes the snapshots of repairs the stream did not reach:
// the next session repairs their tables again.
func (w *tableWatch) closeRepairs(ctx context.Context) {
	w.mu.Lock()
	pending := maps.Clone(w.pending)
	w.mu.Unlock()
	for _, r := range pending {
		w.drop(ctx, r)
	}
}

// repairAt sends repair c's rows where the stream met its message m, in
// m's transaction, less those the stream sent itself, and notes the
// table's new relation in the checkpoint of m's position.
func (s *session) repairAt(c backfill.Control, m *decode.Message) error {
	w := s.tables
	r := w.take(c.ID)
	if r == nil {
		return nil // another session's, read again, or not the connector's
	}
	sent, read := 0, 0
	if r.snap != nil {
		defer r.snap.Close(s.ctx)
		dec, seen := r.snap.Decoder(), w.fresh[r.table]
		limit := max(s.p.cfg.MaxInFlight/2, 1)
		bytes := max(s.p.cfg.MaxInFlightBytes-chunkBytes(s.p.cfg.MaxInFlightBytes), 0)
		for final := false; !final; {
			var rows [][][]byte
			err := s.blocking(func() (err error) {
				rows, final, err = r.snap.Next(s.ctx)
				return err
			})
			if err != nil {
				return fmt.Errorf("repair of %s: %w", r.table, err)
			}
			for _, row := range rows {
				read++
				ev, err := dec.Row(row, m.Commit, m.CommitTime)
				if err != nil {
					return err
				}
				if _, ok := seen[ev.Event.ID()]; ok {
					continue // the stream sent it, in its place
				}
				if err := s.event(&ev); err != nil {
					return err
				}
				sent++
			}
			// The held batch goes now: the loop that lets batches go is
			// this goroutine, which waits below for their acks.
			s.kafka.Release(time.Time{})
			if err := s.blocking(func() error { return s.tracker.WaitRoom(s.ctx, limit, bytes) }); err != nil {
				return err
			}
		}
	}
	s.tracker.NoteTables(s.tx, w.done(r))
	delete(w.fresh, r.table)
	delete(w.overflow, r.table)
	s.dec.Refresh()
	s.p.m.TableRepaired(r.table.String())
	s.p.m.BackfillRows(r.table.String()).Add(float64(sent))
	w.log.Info("repaired a recreated table: sent the rows it received before it was published", "table", r.table.String(), "rows_read", read, "rows_sent", sent)
	return nil
}

// partitions finds the configured table a leaf partition belongs to, for
// the decoder (decode.Decoder.Partition), on a catalog connection of its
// own, opened at the first lookup. A publication the connector made
// publishes partitions via their root, so lookups happen only for one
// that does not, or for relations of a broader publication.
type partitions struct {
	cfg    postgres.Config
	tables []*outbox.Source
	conn   *pgx.Conn
}

// lookup returns the configured table that rel is a partition of, at any
// depth, and that table's relation id.
func (pt *partitions) lookup(ctx context.Context, rel decode.Relation) (*outbox.Source, uint32, bool, error) {
	if pt.conn == nil {
		conn, err := postgres.ConnectSQL(ctx, pt.cfg)
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
		pt.close(ctx)
		return nil, 0, false, err
	}
	defer rows.Close()
	for rows.Next() {
		var id uint32
		var schema, name string
		if err := rows.Scan(&id, &schema, &name); err != nil {
			pt.close(ctx)
			return nil, 0, false, err
		}
		for _, t := range pt.tables {
			if !t.IsMessage() && t.Name.Schema == schema && t.Name.Name == name {
				return t, id, true, nil
			}
		}
	}
	if err := rows.Err(); err != nil {
		pt.close(ctx)
		return nil, 0, false, err
	}
	return nil, 0, false, nil
}

func (pt *partitions) close(ctx context.Context) {
	if pt.conn != nil {
		pt.conn.Close(context.WithoutCancel(ctx))
		pt.conn = nil
	}
}

// newDecoder is a session's decoder: leaf partitions found through pt,
// and, with a watch, the fresh events of recreated tables marked.
func (s *session) newDecoder(pt *partitions, w *tableWatch) *decode.Decoder {
	d := decode.New(s.p.cfg.Tables)
	d.Partition = func(rel decode.Relation) (t *outbox.Source, root uint32, ok bool, err error) {
		err = s.blocking(func() (err error) {
			t, root, ok, err = pt.lookup(s.ctx, rel)
			return err
		})
		return t, root, ok, err
	}
	if w != nil {
		d.Fresh = w.isFresh
	}
	return d
}
