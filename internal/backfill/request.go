package backfill

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/postgres"
)

// Requested is what Request started.
type Requested struct {
	ID    string
	Table string
	Where string
	Rows  int64  // rows matching now
	Key   string // the checkpoint record the job is in
}

// Request asks the running pipeline (cdc run with this config) to
// backfill table's rows matching where, beside its stream: it is cdc
// backfill. It checks the table, the condition and the order first, and
// sends nothing when they are wrong. The request, signed with keys[0] for
// the checkpoint's key, goes to the checkpoint topic; a logical decoding
// message with its ID tells the pipeline, at a point of the stream, which
// is where the job starts. load reads the pipeline's checkpoint, and
// returns the store it read it from.
func (r *Runner) Request(ctx context.Context, keys [][]byte, load func(context.Context) (checkpoint.Record, *checkpoint.Store, error), t *outbox.Source, where string) (Requested, error) {
	if len(keys) == 0 {
		return Requested{}, &errtext.Fatal{Msg: "cdc backfill signs its request with checkpoint.signing_key_file's key, and cdc run takes only signed ones; set it (the same file, or CDC_CHECKPOINT_SIGNING_KEY_FILE) for both: openssl rand -hex 32 > signing.key"}
	}
	rows, err := postgres.ConnectRows(ctx, r.Postgres, r.StatementTimeout)
	if err != nil {
		return Requested{}, err
	}
	defer rows.Close(context.WithoutCancel(ctx))
	job := checkpoint.Job{ID: newID(), Table: t.String(), Where: where}
	plan, _, err := r.plan(ctx, rows, job)
	if err != nil {
		return Requested{}, err
	}
	total, err := plan.Count(ctx, rows)
	if err != nil {
		return Requested{}, err
	}
	rec, store, err := load(ctx)
	if err != nil {
		return Requested{}, err
	}
	if a := rec.ActiveBackfill(); a != nil {
		return Requested{}, &errtext.Fatal{Msg: fmt.Sprintf("backfill %s of %s is running (%d of %d rows); wait for it to finish (cdc status shows it), then ask again", a.ID, a.Table, a.Rows, a.Total)}
	}
	req := checkpoint.Request{ID: job.ID, Table: job.Table, Where: where, RequestedAt: time.Now()}
	req.Sign(keys[0], rec.Key())
	if err := store.SaveRequest(ctx, rec.Key(), req); err != nil {
		return Requested{}, err
	}
	b, _ := json.Marshal(decode.Control{Type: decode.ControlRequest, ID: job.ID})
	if err := postgres.EmitMessage(ctx, r.Postgres, rows, decode.ControlPrefix, string(b), "the backfill's announcement to the connector"); err != nil {
		return Requested{}, err
	}
	return Requested{ID: job.ID, Table: job.Table, Where: where, Rows: total, Key: rec.Key()}, nil
}
