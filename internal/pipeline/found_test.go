package pipeline_test

// Adversarial review of parked keys, their redrive, the one gate and the
// one way in (issues 53 and 54). Each test here fails on the code it
// names: it is a finding, not a regression test of something that works.

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/fault"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/signing"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// waitStop waits up to d for Run to return on its own: the error, or
// ok false when it kept running.
func waitStop(r *running, d time.Duration) (err error, ok bool) {
	select {
	case err := <-r.done:
		close(r.done)
		return err, true
	case <-time.After(d):
		return nil, false
	}
}

// TestTooLargeForTheParkedTopicStops (found by the attack on parking): an
// event too large for its topic and for the parked topic, first of a
// parking or invalid behind one, stops the connector with a permanent
// error naming the remedy; it reconnected and met the event again, for
// ever (its cause was not the event's error).
func TestTooLargeForTheParkedTopicStops(t *testing.T) {
	for _, which := range []string{"behind a parking", "the first of a parking"} {
		t.Run(which, func(t *testing.T) {
			d := newDetour(t, config.DeliveryAtLeastOnce)
			d.cfg.Kafka.DeadLetterMaxMessageBytes = 16384 // the parked topic's limit: a padded event does not fit
			r := d.start(t)
			conn := testenv.Connect(t, d.db)
			if which == "behind a parking" {
				c := d.consumer(t)
				d.emit(t, conn, "K", 1, `"topic": 7`, false) // parks K, and fits
				d.waitParked(t, c, "K", 1, 1)
			}
			d.emit(t, conn, "K", 2, "", true) // fits neither its topic nor the parked topic
			err, stopped := waitStop(r, 30*time.Second)
			if !stopped {
				t.Fatalf("the connector did not stop on an event too large for the parked topic (%s): it reconnects and meets it again; docs/operations.md says it stops", which)
			}
			if !fault.Permanent(err) || !strings.Contains(err.Error(), "dead_letter_max_message_bytes") {
				t.Fatalf("stopped with %v; want a permanent error naming the remedy", err)
			}
		})
	}
}

// keyOnPartition is a key the parking hashes to partition want of n
// (relay.Sender.park: fnv32a of the key, modulo the partitions).
func keyOnPartition(want, n uint32) string {
	for i := 0; ; i++ {
		k := fmt.Sprintf("K%d", i)
		h := fnv.New32a()
		h.Write([]byte(k))
		if h.Sum32()%n == want {
			return k
		}
	}
}

// TestParkingWhosePartitionIsGone (found by the attack; rule 36): a parked
// topic made again with fewer partitions leaves a parking on a partition
// that is gone: the key's next event stops the connector naming the
// remedy that works, cdc redrive --accept-gap, and that remedy, asked
// while the connector is stopped, runs as it starts again: the key is
// un-parked and its next event streams.
func TestParkingWhosePartitionIsGone(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	adm := kadm.NewClient(d.kafka.Client(t))
	ctx := context.Background()
	if _, err := adm.CreateTopic(ctx, 4, -1, nil, d.parked); err != nil {
		t.Fatal(err)
	}
	k := keyOnPartition(3, 4)
	r := d.start(t)
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	d.emit(t, conn, k, 1, "", true)
	d.emit(t, conn, k, 2, "", false)
	if p := d.waitParked(t, c, k, 2, 2); p.Partition != 3 {
		t.Fatalf("parked on partition %d, want 3", p.Partition)
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if _, err := adm.DeleteTopic(ctx, d.parked); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the parked topic made again, with 1 partition", func() bool {
		_, err := adm.CreateTopic(ctx, 1, -1, nil, d.parked)
		return err == nil
	})
	r = d.start(t)
	d.emit(t, conn, k, 3, "", false)
	err, stopped := waitStop(r, time.Minute)
	var ee *outbox.EventError
	if !stopped || !errors.As(err, &ee) || !fault.Permanent(err) || !strings.Contains(err.Error(), "--accept-gap") {
		t.Fatalf("stopped %v with %v; want the event's error naming cdc redrive --accept-gap", stopped, err)
	}
	p := d.newPipeline(t)
	rd, err := p.Ops().RequestRedrive(ctx, park.Selector{Key: k}, false, true)
	if err != nil {
		t.Fatal(err)
	}
	d.start(t)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if used, err := p.Ops().WatchRedrive(wctx, rd); err != nil || !allDone(used) {
		t.Fatalf("the remedy: %+v, %v", used, err)
	}
	d.emit(t, conn, k, 4, "", false)
	c.WaitFor(t, time.Minute, "the key's events on its topic", func(recs []*kgo.Record) bool { return slices.Contains(seqs(t, recs, d.topic)[k], 4) })
	c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
	if got := seqs(t, c.Records, d.topic)[k]; !slices.Equal(got, []int{3, 4}) {
		t.Fatalf("%s on its topic: %v; want 3 and 4 (1 and 2 were lost with the topic, the gap accepted)", k, got)
	}
}

// TestForgedRequestsAtAStart (found by the attack; rule 35): thousands of
// forged redrive requests in the checkpoint topic cost a session's start
// an HMAC each and one line in the log, and do not crowd out the
// operator's: a redrive asked while the connector is stopped, beside
// 2,000 forged ones made at the same moment, still runs as it starts.
func TestForgedRequestsAtAStart(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	r := d.start(t)
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	d.emit(t, conn, "K", 1, "", true)
	d.waitParked(t, c, "K", 1, 1)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	const forged = 2000
	key := checkpoint.Key("outbox_cdc", systemID(t, d.db))
	now := time.Now().UTC().Add(time.Minute).Format(time.RFC3339Nano) // newer than the operator's
	var recs []*kgo.Record
	for i := range forged {
		id := fmt.Sprintf("redrive-forged-%d", i)
		v := fmt.Sprintf(`{"id": %q, "parkings": [{"key": "K", "episode": "0000000000000000"}], "requested_at": %q, "mac": "%064d"}`, id, now, 0)
		recs = append(recs, &kgo.Record{Topic: d.cpt, Key: []byte(checkpoint.RequestKey(key, id)), Value: []byte(v)})
	}
	if err := d.kafka.Client(t).ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	p := d.newPipeline(t)
	rd, err := p.Ops().RequestRedrive(context.Background(), park.Selector{Key: "K"}, true, false)
	if err != nil {
		t.Fatal(err)
	}
	logs := &testenv.Buffer{}
	r = d.launch(t, logs)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if used, err := p.Ops().WatchRedrive(ctx, rd); err != nil || !allDone(used) {
		t.Fatalf("the operator's redrive beside forged ones: %+v, %v", used, err)
	}
	// The start goes on with the requests after the operator's: counted
	// once it has been through them all.
	testenv.Eventually(t, time.Minute, fmt.Sprintf("the %d forged requests counted", forged), func() bool {
		return counterValue(r.p.Metrics().ForgedRequests) == forged
	})
	if n := strings.Count(logs.String(), "do not verify"); n != 1 {
		t.Errorf("%d lines about the forged requests; want one:\n%.2000s", n, logs.String())
	}
}

// TestCheckpointKeepsWithinItsTopic (found by the attack): the requests a
// checkpoint remembers take at most an eighth of its record's limit, as
// the parked keys take half: ten redrives that keep a key parked, with
// kafka.max_message_bytes at 4096, leave the checkpoint writable (the 6th
// made the connector stop on its own record, MESSAGE_TOO_LARGE). The
// ledger forgets no request young enough to be announced again
// (request.LedgerKeeps), so once those fill its share a new one is
// refused, saying to run the command later (by cdc redrive, which sees the
// room full in the checkpoint, or by the connector, a step ahead of it),
// rather than remembered past the record's limit or forgotten: each is
// taken or refused so, and the connector runs on.
func TestCheckpointKeepsWithinItsTopic(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	d.cfg.Kafka.MaxMessageBytes = 4096
	logs := &testenv.Buffer{}
	d.logOut = logs
	r := d.start(t)
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	d.emit(t, conn, "K", 1, "", true)
	d.waitParked(t, c, "K", 1, 1)
	p := d.newPipeline(t)
	taken, refused := 0, 0
	for i := 1; i <= 10; i++ {
		rd, err := p.Ops().RequestRedrive(context.Background(), park.Selector{Key: "K"}, false, false)
		if err != nil && strings.Contains(err.Error(), "run the command again in a few minutes") {
			refused++ // cdc redrive saw the room full in the checkpoint
			continue
		}
		if err != nil {
			t.Fatalf("redrive %d: %v", i, err)
		}
		id := rd.Requests[0].ID
		testenv.Eventually(t, time.Minute, fmt.Sprintf("redrive %d taken, or refused for the ledger's room", i), func() bool {
			select {
			case stop := <-r.done:
				close(r.done)
				t.Fatalf("redrive %d: the connector stopped, unable to write its own checkpoint: %v", i, stop)
			default:
			}
			if rec, ok := loadCheckpoint(t, d.env); ok && rec.FindUsed(id) != nil {
				if u := rec.FindUsed(id); u.Done {
					t.Fatalf("redrive %d sent the key on: %+v", i, u)
				}
				taken++
				return true
			}
			for _, line := range strings.Split(logs.String(), "\n") {
				if strings.Contains(line, id) && strings.Contains(line, "too many requests were taken") {
					refused++
					return true
				}
			}
			return false
		})
	}
	if taken == 0 || taken+refused != 10 {
		t.Fatalf("%d redrives taken, %d refused for room, of 10", taken, refused)
	}
	t.Logf("%d redrives taken, %d refused for the ledger's room", taken, refused)
}

// TestFirstStartBackfillKeepsItsParking (found by the attack; rule 33): a
// key a first start's backfill parks is in the checkpoint its progress is
// saved in, in both modes: at least once, the progress was saved without
// it, and a stop then left the key's event in the parked topic, out of any
// redrive's reach, and its next event went to its topic.
func TestFirstStartBackfillKeepsItsParking(t *testing.T) {
	for _, mode := range []string{config.DeliveryAtLeastOnce, config.DeliveryExactlyOnce} {
		t.Run(mode, func(t *testing.T) {
			d := newDetour(t, mode)
			d.tbl.Backfill = &outbox.BackfillOptions{}
			conn := testenv.Connect(t, d.db)
			d.emit(t, conn, "K", 1, "", true) // before the slot: the backfill sends it, and parks K
			d.emit(t, conn, "L", 1, "", false)
			r := d.start(t)
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
			c := d.consumer(t)
			d.waitParkedTopic(t, c, "K", 1)
			rec, _ := loadCheckpoint(t, d.env)
			var jobs []string
			for _, j := range rec.Backfills {
				jobs = append(jobs, fmt.Sprintf("%s done=%v rows=%d", j.Table, j.Done(), j.Rows))
			}
			if len(rec.Parked) == 0 {
				d.start(t)
				d.emit(t, conn, "K", 2, "", false)
				c.WaitFor(t, 30*time.Second, "K's second event", func(recs []*kgo.Record) bool { return len(seqs(t, recs, d.topic)["K"]) >= 1 })
				t.Fatalf("after a first start's backfill parked K and a clean stop, the checkpoint lists no parking (backfills %v): K's first event is only in the parked topic, out of any redrive's reach, and K's next event went to %s: %v",
					jobs, d.topic, seqs(t, c.Records, d.topic)["K"])
			}
		})
	}
}

// waitParkedTopic waits until the parked topic holds key k's event of
// seq last.
func (d *detour) waitParkedTopic(t *testing.T, c *testenv.Consumer, k string, last int) {
	t.Helper()
	c.WaitFor(t, time.Minute, fmt.Sprintf("%s's event %d parked", k, last), func(recs []*kgo.Record) bool {
		for _, s := range d.parkedSeqs(t, recs)[k] {
			if s == last {
				return true
			}
		}
		return false
	})
}

// TestSkipWhenTheParkingsShareIsFull (found by the attack; rule 36): a
// parked key's next record that needs a run entry past the parked keys'
// share of the checkpoint record stops the connector, naming a redrive of
// the key (TestParkedKeyOutgrowingItsShareHasARemedy runs it); cdc skip,
// no longer offered there (the key's next event would stop it again), is
// still honoured for the event it names when an operator runs it.
func TestSkipWhenTheParkingsShareIsFull(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	key := strings.Repeat("k", 1000)
	entry := func(runs int) int {
		p := checkpoint.Parked{Table: "public.outbox", Dest: d.topic, Key: park.KeyID(key), Reason: strings.Repeat("r", 256), First: "2893e41f-038a-4e4e-be9e-43f60f30e8bd",
			FirstSum: 1<<64 - 1, FirstLSN: 0x1930190, Episode: "0123456789abcdef", Since: time.Now(), Events: 1, Topic: d.parked, Partition: 1, Start: 0}
		for i := range runs {
			p.Runs = append(p.Runs, checkpoint.Run{ID: "0123456789abcdef", From: int64(i + 1), Key: signing.ID([]byte(testSigningKey))})
		}
		return checkpoint.ParkedSize(p) + 2*19
	}
	// The share (half the record) holds the parking with one run, not two.
	d.cfg.Kafka.MaxMessageBytes = int32(2 * (entry(1) + 12))
	if entry(2) <= int(d.cfg.Kafka.MaxMessageBytes)/2 {
		t.Fatalf("sizes: %d, %d, share %d", entry(1), entry(2), d.cfg.Kafka.MaxMessageBytes/2)
	}
	r := d.start(t)
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	d.emit(t, conn, key, 1, "", true)
	d.waitParked(t, c, key, 1, 1)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	r = d.start(t) // a new session: the key's next record is of a new run
	second := d.emit(t, conn, key, 2, "", false)
	err, stopped := waitStop(r, 30*time.Second)
	var ee *outbox.EventError
	if !stopped || !errors.As(err, &ee) || !strings.Contains(err.Error(), "cdc redrive --key") {
		t.Fatalf("the connector did not stop on the key's next event naming a redrive of it: %v", err)
	}
	t.Logf("stopped with: %.300s", err)
	if _, err := d.newPipeline(t).Ops().Skip(context.Background(), ee.CommitLSN, second); err != nil {
		t.Fatal(err)
	}
	r = d.launch(t, nil)
	if err, stopped := waitStop(r, 20*time.Second); stopped {
		t.Fatalf("after cdc skip of the event, the connector stops on the same event again: %.300s", err)
	}
}
