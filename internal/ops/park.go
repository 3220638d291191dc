package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/outboxcdc/cdc/internal/backfill"
	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/request"
	"github.com/outboxcdc/cdc/internal/wal"
)

// cdc parked and cdc redrive (package park; docs/operations.md, "Parked
// keys").

// loadRecord reads the pipeline's checkpoint, finding its database system
// through a replication connection.
func (o *Ops) loadRecord(ctx context.Context) (checkpoint.Record, *checkpoint.Store, error) {
	conn, err := wal.Connect(ctx, o.Config.Postgres, o.Log.Named("wal"))
	if err != nil {
		return checkpoint.Record{}, nil, err
	}
	sys := conn.System()
	conn.Close(context.WithoutCancel(ctx))
	return o.LoadRecord(ctx, sys)
}

// Parked is the keys the pipeline holds back, as its checkpoint says: as
// far as Kafka acknowledged.
func (o *Ops) Parked(ctx context.Context) ([]checkpoint.Parked, error) {
	rec, _, err := o.loadRecord(ctx)
	return rec.Parked, err
}

// Redriving is what RequestRedrive asked: one request or more (each
// names at most park.MaxRefs parkings).
type Redriving struct {
	Requests []park.Request
	Keys     []checkpoint.Parked // the parkings they name, as the checkpoint showed them
	record   string              // the checkpoint's key
}

// RequestRedrive asks the pipeline to send on the parkings sel selects in
// the checkpoint now (with dropFirst, each one's first event to the
// dead-letter topic instead; with acceptGap, what is left of a parking
// that lost records): requests signed with checkpoint.signing_key_file's
// key, each naming the parkings (key and episode) it is for, kept in the
// checkpoint topic, and announced in the WAL, where a running pipeline
// runs them; one that stopped before it can reach the announcement runs
// them as it starts again.
func (o *Ops) RequestRedrive(ctx context.Context, sel park.Selector, dropFirst, acceptGap bool) (Redriving, error) {
	return o.Redrive(ctx, sel, RedriveOptions{DropFirst: dropFirst, AcceptGap: acceptGap})
}

// RedriveOptions are cdc redrive's flags: --drop-first, --drop-invalid
// (every event still invalid at the redrive to the dead-letter topic, the
// rest on in order: for an event nobody will fix, wherever it is in the
// parking), --accept-gap.
type RedriveOptions struct{ DropFirst, DropInvalid, AcceptGap bool }

// Redrive is RequestRedrive with every option.
func (o *Ops) Redrive(ctx context.Context, sel park.Selector, opt RedriveOptions) (Redriving, error) {
	keys := o.Config.Checkpoint.SigningKeys
	if len(keys) == 0 {
		return Redriving{}, &errtext.Fatal{Msg: "cdc redrive signs its request with checkpoint.signing_key_file's key, and cdc run takes only signed ones; set it (the same file, or CDC_CHECKPOINT_SIGNING_KEY_FILE) for both: openssl rand -hex 32 > signing.key"}
	}
	rec, store, err := o.loadRecord(ctx)
	if err != nil {
		return Redriving{}, err
	}
	r := Redriving{record: rec.Key()}
	r.Keys = sel.Pick(rec.Parked)
	if len(r.Keys) == 0 {
		return Redriving{}, &errtext.Fatal{Msg: fmt.Sprintf("nothing parked matches %s (cdc parked lists the parked keys; the checkpoint shows what Kafka acknowledged, so a key parked a moment ago may not be there yet: try again in a second)", sel)}
	}
	// The connector remembers every request it takes for a while, so that
	// none runs twice, within a share of the checkpoint record; one past
	// it is refused, and its command would wait out the request's age for
	// nothing. Said here instead, where the checkpoint shows it already.
	ledger := request.Ledger{Used: rec.Used, MaxBytes: int(o.Config.Kafka.MaxMessageBytesOf(o.Config.Checkpoint.Topic)) / 8}
	if !roomFor(ledger, (len(r.Keys)+park.MaxRefs-1)/park.MaxRefs) {
		return Redriving{}, &errtext.Fatal{Msg: fmt.Sprintf("the connector remembers each request it took for %s, so that none runs twice, and the %d it took lately fill the checkpoint's room for them (an eighth of kafka.max_message_bytes): run the command again in a few minutes, or redrive several keys in one request (--table, --all)", request.LedgerKeeps, len(rec.Used))}
	}
	conn, err := postgres.ConnectSQL(ctx, o.Config.Postgres)
	if err != nil {
		return Redriving{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for from := 0; from < len(r.Keys); from += park.MaxRefs {
		req := park.Request{ID: park.RequestPrefix + backfill.NewID(), DropFirst: opt.DropFirst, DropInvalid: opt.DropInvalid, AcceptGap: opt.AcceptGap, RequestedAt: time.Now()}
		for _, p := range r.Keys[from:min(from+park.MaxRefs, len(r.Keys))] {
			req.Parkings = append(req.Parkings, park.Ref{Key: p.Key, Episode: p.Episode})
		}
		req.Sign(keys[0], rec.Key())
		v, _ := json.Marshal(req)
		if err := store.Put(ctx, checkpoint.RequestKey(rec.Key(), req.ID), v); err != nil {
			return Redriving{}, fmt.Errorf("write the redrive request: %w", err)
		}
		b, _ := json.Marshal(decode.Control{Type: park.ControlRequest, ID: req.ID})
		if err := postgres.EmitMessage(ctx, o.Config.Postgres, conn, decode.ControlPrefix, string(b), "the redrive's announcement to the connector"); err != nil {
			return Redriving{}, err
		}
		r.Requests = append(r.Requests, req)
	}
	return r, nil
}

// roomFor reports whether ledger has room for n more requests, made now.
func roomFor(ledger request.Ledger, n int) bool {
	now := time.Now()
	ledger.Used = slices.Clone(ledger.Used)
	for range n {
		id := park.RequestPrefix + backfill.NewID()
		if !ledger.Room(id, now) {
			return false
		}
		ledger.Used = append(ledger.Used, checkpoint.Used{ID: id, At: now})
	}
	return true
}

// ErrNotTaken is a redrive request no pipeline took while it could: the
// connector did not run, or did not reach its announcement, within
// checkpoint.RequestMaxAge of it being made.
var ErrNotTaken = errors.New("no connector took the redrive request in time")

// watchTries is how many reads of the checkpoint topic in a row may fail
// before WatchRedrive gives up.
const watchTries = 5

// WatchRedrive waits until the pipeline has taken every request of r
// (the checkpoint remembers each with what it did), or until each could
// no longer be taken (checkpoint.RequestMaxAge after it was made, and a
// checkpoint interval more: ErrNotTaken), or ctx ends. It returns what
// each did.
func (o *Ops) WatchRedrive(ctx context.Context, r Redriving) ([]checkpoint.Used, error) {
	t := time.NewTicker(time.Second) // the checkpoint's pace: a record a confirm_interval
	defer t.Stop()
	deadline := time.Now().Add(checkpoint.RequestMaxAge + 2*o.Config.Postgres.StatusInterval + 5*time.Second)
	failed := 0
	for {
		recs, err := o.store.Load(ctx, false)
		if err != nil {
			// A read that failed once (a broker slow to answer a dial on a
			// loaded machine) is looked again a second later; the redrive
			// runs in the connector whatever the command sees.
			if failed++; failed >= watchTries || ctx.Err() != nil {
				return nil, err
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-t.C:
			}
			continue
		}
		failed = 0
		var done []checkpoint.Used
		for _, req := range r.Requests {
			if u := recs[r.record].FindUsed(req.ID); u != nil {
				done = append(done, *u)
			}
		}
		if len(done) == len(r.Requests) {
			return done, nil
		}
		if time.Now().After(deadline) {
			return done, ErrNotTaken
		}
		select {
		case <-ctx.Done():
			return done, ctx.Err()
		case <-t.C:
		}
	}
}
