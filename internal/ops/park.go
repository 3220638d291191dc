package ops

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/outboxcdc/cdc/internal/backfill"
	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/postgres"
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

// Redriving is what RequestRedrive asked.
type Redriving struct {
	Request park.Request
	Keys    []checkpoint.Parked // the parked keys it selects now
	record  string              // the checkpoint's key
}

// RequestRedrive asks the running pipeline to send on the parked keys sel
// selects (with dropFirst, each one's first event to the dead-letter topic
// instead): a request signed with checkpoint.signing_key_file's key, kept in
// the checkpoint topic, and announced in the WAL, where the pipeline runs
// it.
func (o *Ops) RequestRedrive(ctx context.Context, sel park.Selector, dropFirst bool) (Redriving, error) {
	keys := o.Config.Checkpoint.SigningKeys
	if len(keys) == 0 {
		return Redriving{}, &errtext.Fatal{Msg: "cdc redrive signs its request with checkpoint.signing_key_file's key, and cdc run takes only signed ones; set it (the same file, or CDC_CHECKPOINT_SIGNING_KEY_FILE) for both: openssl rand -hex 32 > signing.key"}
	}
	rec, store, err := o.loadRecord(ctx)
	if err != nil {
		return Redriving{}, err
	}
	r := Redriving{record: rec.Key(), Request: park.Request{ID: park.RequestPrefix + backfill.NewID(), Key: sel.Key, Table: sel.Table, All: sel.All, DropFirst: dropFirst, RequestedAt: time.Now()}}
	for _, p := range rec.Parked {
		if sel.Match(p) {
			r.Keys = append(r.Keys, p)
		}
	}
	if len(r.Keys) == 0 {
		return Redriving{}, &errtext.Fatal{Msg: fmt.Sprintf("nothing parked matches %s (cdc parked lists the parked keys; the checkpoint shows what Kafka acknowledged, so a key parked a moment ago may not be there yet)", sel)}
	}
	r.Request.Sign(keys[0], rec.Key())
	v, _ := json.Marshal(r.Request)
	if err := store.Put(ctx, checkpoint.RequestKey(rec.Key(), r.Request.ID), v); err != nil {
		return Redriving{}, fmt.Errorf("write the redrive request: %w", err)
	}
	conn, err := postgres.ConnectSQL(ctx, o.Config.Postgres)
	if err != nil {
		return Redriving{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	b, _ := json.Marshal(backfill.Control{Type: park.ControlRequest, ID: r.Request.ID})
	if err := postgres.EmitMessage(ctx, o.Config.Postgres, conn, decode.ControlPrefix, string(b), "the redrive's announcement to the connector"); err != nil {
		return Redriving{}, err
	}
	return r, nil
}

// WatchRedrive waits until the keys r selected are no longer parked in the
// checkpoint (sent on), or are parked with another reason (the first is
// invalid still), or ctx ends; it returns the keys still parked.
func (o *Ops) WatchRedrive(ctx context.Context, r Redriving) ([]checkpoint.Parked, error) {
	t := time.NewTicker(time.Second) // the checkpoint's pace: a record a confirm_interval
	defer t.Stop()
	for {
		recs, err := o.store.Load(ctx, false)
		if err != nil {
			return nil, err
		}
		var left []checkpoint.Parked
		changed := 0
		for _, was := range r.Keys {
			for _, p := range recs[r.record].Parked {
				if p.Dest == was.Dest && p.Key == was.Key && p.Episode == was.Episode {
					left = append(left, p)
					if p.Reason != was.Reason {
						changed++
					}
				}
			}
		}
		if len(left) == changed {
			return left, nil
		}
		select {
		case <-ctx.Done():
			return left, ctx.Err()
		case <-t.C:
		}
	}
}
