package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/relay"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestMaxParkedKeysWithinOneTransaction (found by the attack on issue 53):
// one transaction writes invalid events for keys A, B and C, at
// max_parked_keys 2. The connector stops on C with A and B parked by that
// same transaction: no checkpoint lists them before it ends, and every
// start reads it again and parks them again, so the error said to redrive
// keys that no redrive can reach. It names the remedies that work from
// there, and each is run: raise max_parked_keys, or cdc skip the event;
// then the stream goes on (D arrives) with every invalid event parked or
// dead-lettered.
func TestMaxParkedKeysWithinOneTransaction(t *testing.T) {
	for _, remedy := range []string{"raise", "skip"} {
		t.Run(remedy, func(t *testing.T) {
			d := newDetour(t, config.DeliveryAtLeastOnce)
			d.cfg.MaxParkedKeys = 2
			r := d.start(t)
			conn := testenv.Connect(t, d.db)
			c := d.consumer(t)
			ctx := context.Background()
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			pad := strings.Repeat("x", 20000)
			for _, k := range []string{"A", "B", "C"} {
				if _, err := tx.Exec(ctx, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', $1, 'E', $2::jsonb)`, k, fmt.Sprintf(`{"k": %q, "seq": 1, "pad": %q}`, k, pad)); err != nil {
					t.Fatal(err)
				}
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			err = waitFatal(t, r)
			var full *relay.FullError
			if !errors.As(err, &full) || full.Unsaved != 2 || !strings.Contains(err.Error(), "no redrive reaches them") || strings.Contains(err.Error(), "redrive parked keys") {
				t.Fatalf("got %v; want the max_parked_keys stop that says A and B were parked by its own transaction, without a redrive to suggest", err)
			}
			switch remedy {
			case "raise":
				d.cfg.MaxParkedKeys = 3
			case "skip":
				if _, err := d.newPipeline(t).Ops().Skip(ctx, full.Cause.CommitLSN, full.Cause.EventID); err != nil {
					t.Fatalf("cdc skip: %v", err)
				}
			}
			r = d.launch(t, ioDiscard{})
			d.emit(t, conn, "D", 1, "", false)
			var stopped error
			c.WaitFor(t, time.Minute, "D on its topic, or a stop", func(recs []*kgo.Record) bool {
				select {
				case err := <-r.done:
					close(r.done)
					stopped = fmt.Errorf("stopped: %v", err)
					return true
				default:
				}
				return len(seqs(t, recs, d.topic)["D"]) == 1
			})
			if stopped != nil {
				t.Fatalf("after the remedy (%s) the connector %v", remedy, stopped)
			}
			// C's parked record, written just before D, is on another
			// partition, which a fetch may return after D's.
			c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
			parked := d.parkedSeqs(t, c.Records)
			want := []string{"A", "B", "C"}
			if remedy == "skip" {
				want = want[:2]
				c.WaitFor(t, time.Minute, "C's event in the dead-letter topic", func(recs []*kgo.Record) bool { return len(seqs(t, recs, d.dead)["C"]) == 1 })
			}
			for _, k := range want {
				if !slices.Contains(parked[k], 1) {
					t.Errorf("%s's event is not in the parked topic (%v)", k, parked)
				}
			}
		})
	}
}
