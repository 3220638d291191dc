package tablewatch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/metrics"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/setup"
	"github.com/outboxcdc/cdc/internal/tableread"
)

// Watch is one session's view of the tables' lives.
type Watch struct {
	deps   Deps
	log    hclog.Logger
	byName map[string]*outbox.Source // the configured tables, by SQL name

	mu sync.Mutex
	// streamed is what the session streams of each table, as the
	// checkpoint will record it; suspect, for a table whose id the
	// checkpoint does not hold (written before it kept them) and which
	// was not in the publication, the relation whose events are fresh.
	streamed map[*outbox.Source]checkpoint.Table
	suspect  map[*outbox.Source]uint32
	// rels are the relations known to be a table's, by id, whatever
	// their name: each table's streamed relation, its former ones and
	// their leaf partitions (identity.go).
	rels map[uint32]known
	// pending are the repairs announced and not yet reached by the
	// stream, by id; repairing, the tables they are for.
	pending   map[string]*Repair
	repairing map[*outbox.Source]bool
	// early are the repairs whose rows the stream sent at the first
	// fresh event of their relation, before their message (Before), by
	// id: their snapshots are the stream's, closed once read.
	early map[string]*Repair
	// began and looked count the looks at the catalog (Run): begun, and
	// the last one that ended without an error. changed is closed, and
	// replaced, when a look ends or a repair is announced; poke asks Run
	// for a look now; ended is closed when Run returns.
	began, looked int
	// visible is the transaction of the fresh event a stream waits at
	// (Before), 0 when none: a look waits until its snapshot shows it
	// (waitVisible).
	visible uint32
	changed chan struct{}
	poke    chan struct{}
	ended   chan struct{}

	// The stream's goroutine alone uses these: the ids of fresh events
	// it met, by table, and the relations it reported as unmapped.
	fresh    map[*outbox.Source]map[string]struct{}
	overflow map[*outbox.Source]bool
	unmapped map[string]bool

	// The watch's goroutine alone uses these: tables found missing, and
	// followed under another name (the name it was last seen under).
	missing map[*outbox.Source]bool
	renamed map[*outbox.Source]string
	warned  map[string]bool
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
	OpenSnapshot func(ctx context.Context, t *outbox.Source) (*tableread.Snapshot, error)
	// NewSnapshot connects one, to begin in another transaction's
	// exported snapshot (tableread.NewSnapshot).
	NewSnapshot func(ctx context.Context, t *outbox.Source) (*tableread.Snapshot, error)
	Log         hclog.Logger
}

// New starts a session's watch from rec, the checkpoint the session
// starts at, whose Tables Baseline filled in.
func New(d Deps, rec checkpoint.Record, cat setup.Catalog) *Watch {
	w := &Watch{
		deps: d, log: d.Log.Named("tables"), byName: map[string]*outbox.Source{},
		streamed: map[*outbox.Source]checkpoint.Table{}, suspect: map[*outbox.Source]uint32{}, rels: map[uint32]known{},
		pending: map[string]*Repair{}, repairing: map[*outbox.Source]bool{}, early: map[string]*Repair{},
		changed: make(chan struct{}), poke: make(chan struct{}, 1), ended: make(chan struct{}),
		fresh: map[*outbox.Source]map[string]struct{}{}, overflow: map[*outbox.Source]bool{}, unmapped: map[string]bool{},
		missing: map[*outbox.Source]bool{}, renamed: map[*outbox.Source]string{}, warned: map[string]bool{},
	}
	for _, t := range d.Tables {
		if t.IsMessage() {
			continue
		}
		w.byName[t.String()] = t
		if st, ok := rec.Tables[t.String()]; ok {
			w.streamed[t] = st
			w.knowLocked(t, st)
		} else if st := cat.Find(t.Name.Schema, t.Name.Name); st != nil && st.OID != 0 {
			w.suspect[t] = st.OID
		}
	}
	return w
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
		close(w.ended)
	}()
	t := time.NewTicker(w.deps.Postgres.CatalogCheckInterval)
	defer t.Stop()
	for {
		var err error
		w.mu.Lock()
		w.began++
		w.mu.Unlock()
		if conn == nil {
			conn, err = postgres.ConnectSQL(ctx, w.deps.Postgres)
		}
		if err == nil {
			err = w.check(ctx, conn)
		}
		if err == nil {
			w.mu.Lock()
			w.looked = w.began
			w.changedLocked()
			w.mu.Unlock()
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
			// until the next look; retention checks the same facts
			// itself before it deletes).
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
		case <-w.poke:
		}
	}
}

// changedLocked wakes those waiting in Before. w.mu is held.
func (w *Watch) changedLocked() {
	close(w.changed)
	w.changed = make(chan struct{})
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
	if err := w.waitVisible(ctx, conn); err != nil {
		return err
	}
	cat, err := setup.ReadCatalog(ctx, conn, cfg.Publication, w.deps.WALTables)
	if err != nil {
		return err
	}
	if err := w.checkPublication(ctx, conn, cat); err != nil {
		return err
	}
	for _, st := range cat.Tables {
		t := w.byName[st.Table.String()]
		if t == nil {
			continue
		}
		if err := w.checkTable(ctx, conn, cat, t, st); err != nil {
			return err
		}
	}
	w.deps.Metrics.CatalogChecked.SetToCurrentTime()
	return nil
}

// waitVisible waits until a snapshot shows the transaction of the fresh
// event the stream waits at (w.visible), so that the look's catalog holds
// what that transaction did. The walsender sends a transaction once its
// commit record is flushed, which can be before the committing backend
// makes it visible: a look right then saw the table as it was before the
// recreation, found no repair to start, and the stream sent the new
// relation's events ahead of the rows the repair sent later (seen on
// PostgreSQL 18 under load). The xid is 32 bits; its epoch is that of the
// snapshot's xmax, or the one before (postgres.Visible).
func (w *Watch) waitVisible(ctx context.Context, conn *pgx.Conn) error {
	w.mu.Lock()
	xid := w.visible
	w.mu.Unlock()
	if xid == 0 {
		return nil
	}
	return postgres.WaitVisible(ctx, conn, xid, postgres.VisibleWait)
}

// checkPublication checks what of the publication decides for every
// table: that it exists and publishes inserts. A publication that stopped
// publishing partitioned tables under their root is set back when the
// role owns it; its leaves' inserts are mapped by their ids meanwhile.
func (w *Watch) checkPublication(ctx context.Context, conn *pgx.Conn, cat setup.Catalog) error {
	pub := cat.Publication
	switch {
	case !pub.Exists:
		return errtext.Fatalf("publication %s was dropped while the connector streamed, so no insert reaches it; create it again (the connector does on its next start, where its role may) and send what the tables received meanwhile with cdc backfill --config %s", pub.Name, w.deps.ConfigFile)
	case !pub.Inserts:
		return errtext.Fatalf("publication %s no longer publishes inserts (someone changed publish), so the outbox tables' inserts since do not reach the connector; as its owner run: ALTER PUBLICATION %s SET (publish = 'insert'); then send what the tables received meanwhile with cdc backfill --config %s", pub.Name, pub.Name, w.deps.ConfigFile)
	}
	if pub.ViaRoot {
		return nil
	}
	for _, st := range cat.Tables {
		if !st.Partitioned {
			continue
		}
		if !pub.Owned {
			w.once("viaroot", "publication publishes partitioned outbox tables under their leaf partitions' names (publish_via_partition_root is off): their inserts are mapped by the partitions' ids; as its owner run: "+setup.ViaRootStatement(pub.Name))
			return nil
		}
		if _, err := conn.Exec(ctx, setup.ViaRootStatement(pub.Name)); err != nil {
			return fmt.Errorf("set publish_via_partition_root back on publication %s: %w", pub.Name, err)
		}
		w.log.Warn("publish_via_partition_root was turned off on the publication; set it back (leaf partitions' inserts meanwhile are mapped by their ids)", "publication", pub.Name)
		return nil
	}
	return nil
}

// checkTable compares one configured table, st as the catalog has it by
// its name, with what the session streams of it.
func (w *Watch) checkTable(ctx context.Context, conn *pgx.Conn, cat setup.Catalog, t *outbox.Source, st setup.TableState) error {
	cfg := w.deps.Postgres
	w.mu.Lock()
	prev, known := w.streamed[t]
	busy := w.repairing[t]
	w.mu.Unlock()
	if busy {
		return nil
	}
	cur := st.RelState
	old := uint32(0) // the relation streamed before, when it exists under another name
	if known && prev.Rel != st.OID {
		// The name is another relation's, or none's: the relation
		// streamed is followed by its id (docs/design.md, "Table
		// changes").
		rs, err := setup.ReadRelation(ctx, conn, cfg.Publication, prev.Rel)
		if err != nil {
			return err
		}
		switch {
		case rs.OID != 0 && st.OID == 0:
			w.followRename(t, rs)
			cur = rs
		case rs.OID != 0:
			old = rs.OID
			if other := w.tableOf(st.OID); other != nil && other != t {
				return errtext.Fatalf("outbox tables %s and %s exchanged relations (renamed into each other's names), so the configuration's mapping no longer says which is which; name each table as it is now in %s and start the connector again",
					t, other, w.deps.ConfigFile)
			}
			w.once("swap "+t.String(), fmt.Sprintf("outbox table %s names another relation now (a swap): the new one is published and its rows sent; the old one, now %s, stays the table's while it exists (its inserts are still events); drop it, or remove it from the publication, once the migration is done",
				t, setup.Table{TableName: outbox.TableName{Schema: rs.Schema, Name: rs.Name}}))
		}
	} else if known {
		w.followRename(t, setup.RelState{})
	}
	if cur.OID == 0 {
		if !w.missing[t] {
			w.missing[t] = true
			w.deps.Metrics.TableMissing(t.String(), true)
			w.log.Warn("outbox table does not exist (dropped); nothing can be written to it meanwhile, and once a table of that name exists again the connector publishes it and sends what it received",
				"table", t.String())
		}
		return nil
	}
	if w.missing[t] {
		delete(w.missing, t)
		w.deps.Metrics.TableMissing(t.String(), false)
	}
	if known && prev.Rel == cur.OID {
		switch {
		case cur.Unlogged:
			return setup.UnloggedTable(t, w.deps.ConfigFile)
		case !cur.Published:
			return setup.LeftPublication(w.deps.Postgres.Publication, w.deps.ConfigFile, t)
		case prev.Member != "" && cur.Member != prev.Member:
			return setup.LeftAndBack(w.deps.Postgres.Publication, w.deps.ConfigFile, t)
		case cur.Filtered:
			return setup.Filtered(w.deps.Postgres.Publication, t)
		}
		if cur.Partitioned {
			if err := w.noteLeaves(ctx, conn, t, cur.OID); err != nil {
				return err
			}
		}
		return w.checkFiles(ctx, conn, t, prev)
	}
	return w.newRelation(ctx, conn, cat, t, st, old)
}

// newRelation publishes and repairs st, another relation than the one
// streamed under table t's name (a table dropped and created again, or
// swapped); old is the relation streamed before, when it still exists.
func (w *Watch) newRelation(ctx context.Context, conn *pgx.Conn, cat setup.Catalog, t *outbox.Source, st setup.TableState, old uint32) error {
	cfg := w.deps.Postgres
	if st.Unlogged {
		return setup.UnloggedTable(t, w.deps.ConfigFile)
	}
	if err := w.name(ctx, conn, t, st.RelState); err != nil {
		return err
	}
	// added: published below without the lock, which is not tried again.
	added := !st.Published
	if !st.Published {
		if !cat.Publication.Owned || !st.Owned {
			why := "it does not own the table"
			if !cat.Publication.Owned {
				why = "it does not own the publication"
			}
			return &errtext.Fatal{Msg: fmt.Sprintf("outbox table %s was dropped and created again (or another table took its name), and the new table is not in publication %s, so its inserts do not reach the connector (which may not add it: %s); "+
				"as the owner of the publication and the table run: %s; %s; then start the connector again: it sends the rows the new table received meanwhile, each once",
				t, cfg.Publication, why, setup.AddStatement(cfg.Publication, st.Table), setup.GrantStatement(st.Table, cat.Role))}
		}
		// On a primary, published and repaired in one transaction,
		// which keeps the order across tables (lockedRepair).
		if primary, err := onPrimary(ctx, conn); err != nil {
			return err
		} else if primary {
			if done, err := w.lockedRepair(ctx, conn, t, st, old, cat.Role, true); done || err != nil {
				return err
			}
		}
		if err := setup.AddToPublication(ctx, cfg, conn, cfg.Publication, st.Table); err != nil {
			return err
		}
		rs, err := setup.ReadRelation(ctx, conn, cfg.Publication, st.OID)
		if err != nil {
			return err
		}
		st.RelState = rs
		w.log.Warn("outbox table was dropped and created again (or another table took its name); added the new table to the publication, and sending the rows it received before", "table", t.String(), "publication", cfg.Publication)
	}
	if st.Filtered {
		return setup.Filtered(w.deps.Postgres.Publication, t)
	}
	if primary, err := onPrimary(ctx, conn); err != nil {
		return err
	} else if primary && !added {
		if done, err := w.lockedRepair(ctx, conn, t, st, old, cat.Role, false); done || err != nil {
			return err
		}
	}
	return w.startRepair(ctx, conn, t, st.RelState, old, cat.Role)
}

// name records st, the relation under table t's name now, and its leaf
// partitions as t's (Known), before any repair's snapshot of it is taken.
// The decoder maps their inserts from here on, one it cached as unmapped
// too (a schema renamed into place sends no Relation message anew), and
// they are fresh, so the stream waits for the snapshot's rows before them
// (Before). Every insert the stream passed over as unmapped before was
// committed before it read it, so before the snapshot, which holds it.
// Named only at the repair's message, the inserts committed between a
// snapshot and that message were in neither (startRepair, and
// lockedRepair's role, which may not lock).
//
// The snapshot of the naming is kept (NamedAfter): an insert the stream
// reads late, whose transaction ended before the naming, is the repair
// snapshot's as if the stream had passed over it in time. It is taken
// before the relation is named: an insert the stream reads between the
// two is passed over as unmapped, and ended before the repair's snapshot.
func (w *Watch) name(ctx context.Context, conn *pgx.Conn, t *outbox.Source, st setup.RelState) error {
	var named checkpoint.Seen
	var err error
	if named.Xmin, named.Xmax, named.Xip, err = postgres.Snapshot(ctx, conn); err != nil {
		return fmt.Errorf("name the new relation of %s: %w", t, err)
	}
	w.mu.Lock()
	if _, ok := w.rels[st.OID]; !ok {
		w.rels[st.OID] = known{t: t, root: st.OID, named: &named}
	}
	w.mu.Unlock()
	if st.Partitioned {
		return w.noteLeaves(ctx, conn, t, st.OID)
	}
	return nil
}

// followRename says, once per name, that t's relation is followed under
// another name (rs), or that it has its configured name again (rs zero).
func (w *Watch) followRename(t *outbox.Source, rs setup.RelState) {
	if rs.OID == 0 {
		if _, ok := w.renamed[t]; ok {
			delete(w.renamed, t)
			w.deps.Metrics.TableRenamed(t.String(), false)
		}
		return
	}
	name := setup.Table{TableName: outbox.TableName{Schema: rs.Schema, Name: rs.Name}}.String()
	if w.renamed[t] == name {
		return
	}
	w.renamed[t] = name
	w.deps.Metrics.TableRenamed(t.String(), true)
	w.log.Error("outbox table was renamed: the connector follows the relation, so its inserts under the new name are still this table's events; set tables[].name to the new name in the config",
		"table", t.String(), "renamed_to", name, "relation", rs.OID)
}

// once logs msg at warn level the first time key comes up (the watch's
// goroutine).
func (w *Watch) once(key, msg string) {
	if !w.warned[key] {
		w.warned[key] = true
		w.log.Warn(msg)
	}
}
