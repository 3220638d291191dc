package pipeline_test

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestParkedKeysWithoutTheSigningKey (found by the attack on issue 53): K
// parked, then the table turned to on_invalid: fail and
// checkpoint.signing_key_file taken out, which the configuration allows
// without a parking table. The connector started, K's next event went
// behind its parking sealed with no key, and once the key was back that
// record was taken for forged: missing, for a redrive. A start with
// parked keys and no key stops, naming the remedy; with the key back the
// redrive sends K's events in order.
func TestParkedKeysWithoutTheSigningKey(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	r := d.start(t)
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	d.emit(t, conn, "K", 1, "", true)
	d.waitParked(t, c, "K", 1, 1)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	keys := d.cfg.Checkpoint.SigningKeys
	d.tbl.OnInvalid, d.tbl.ParkedTopic, d.cfg.Checkpoint.SigningKeys = outbox.OnInvalidFail, "", nil
	d.emit(t, conn, "K", 2, "", false)
	r = d.launch(t, nil)
	err, stopped := waitStop(r, time.Minute)
	if !stopped {
		r.stop(t)
		t.Fatal("the connector started with a parked key and no signing key")
	}
	if err == nil || !strings.Contains(err.Error(), "checkpoint.signing_key_file") || !strings.Contains(err.Error(), `"K"`) {
		t.Fatalf("stopped with %v; want the parked key and the signing key named", err)
	}
	d.tbl.OnInvalid, d.tbl.ParkedTopic, d.cfg.Checkpoint.SigningKeys = outbox.OnInvalidPark, d.parked, keys
	d.cfg.Kafka.MaxMessageBytes = 1 << 20
	r = d.start(t)
	defer r.stop(t)
	d.waitParked(t, c, "K", 2, 2)
	if used := d.redrive(t, park.Selector{Key: "K"}, false, false); !allDone(used) {
		t.Fatalf("redrive with the key back: %+v", used)
	}
	c.WaitFor(t, time.Minute, "K's 2 events", func(recs []*kgo.Record) bool { return len(seqs(t, recs, d.topic)["K"]) >= 2 })
	c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
	if got := seqs(t, c.Records, d.topic)["K"]; len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Fatalf("K on its topic %v, want 1, 2", got)
	}
}
