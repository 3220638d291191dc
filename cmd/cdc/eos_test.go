package main

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// eosConfig writes an exactly-once config for db; Postgres ends a
// replication connection that is silent for 2s (wal_sender_timeout, set
// for the connector's connections only).
func eosConfig(t *testing.T, db string, kafka *testenv.Kafka) string {
	t.Helper()
	return outboxConfig(t, kafka, fmt.Sprintf("url: %q, status_interval: 200ms", withOptions(db, "wal_sender_timeout=2s")),
		"reconnect: {backoff: 200ms, backoff_max: 1s}\ndelivery: exactly-once")
}

// fencedMsg is what a fenced instance says as it stops.
const fencedMsg = "another instance of this pipeline took over"

// TestExactlyOnceFrozenInstance: the active instance freezes (SIGSTOP)
// while events flow; once Postgres drops its connection a second instance
// takes the slot and fences it. When the first resumes it sends nothing:
// it stops on the fence, or finds the slot taken and waits. A
// read_committed consumer sees every event exactly once.
func TestExactlyOnceFrozenInstance(t *testing.T) {
	p := testenv.Require(t, pg)
	db := p.NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`)
	kafka := testenv.NewKafka(t)
	config := eosConfig(t, testenv.LeastPrivileged(t, db, "outbox", true), kafka)
	a := startProc(t, config)
	testenv.Eventually(t, 30*time.Second, "the first instance to hold the slot", func() bool { return slotActive(t, db) })

	// A writer commits small transactions throughout.
	written, stopWriter := pacedWriter(db, 2*time.Millisecond)
	c := kafka.NewCommittedConsumer(t, kafka.AllTopics())
	c.WaitCount(t, time.Minute, 300)

	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozenAt := written.Load()
	b := startProc(t, config)
	testenv.Eventually(t, time.Minute, "the second instance to take over", func() bool {
		return strings.Contains(b.out.String(), "streaming from replication slot")
	})
	testenv.Eventually(t, time.Minute, "events after the takeover", func() bool { return written.Load() > frozenAt+500 })
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// The resumed one either stops on the fence or waits for the slot.
	testenv.Eventually(t, time.Minute, "the resumed instance to stop or wait", func() bool {
		out := a.out.String()
		return strings.Contains(out, fencedMsg) || strings.Contains(out, "replication slot is in use")
	})
	testenv.Eventually(t, time.Minute, "more events after the resume", func() bool { return written.Load() > frozenAt+1000 })
	if err := stopWriter(); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.out.String(), fencedMsg) {
		t.Fatalf("the instance that took over was fenced by the one resumed:\n%s", b.out)
	}

	want := outboxIDs(t, db)
	c.WaitFor(t, 2*time.Minute, "every event", func(recs []*kgo.Record) bool {
		got := map[string]bool{}
		for _, r := range recs {
			got[testenv.Header(r, route.HeaderID)] = true
		}
		return len(got) >= len(want)
	})
	c.SettleConfirmed(t, time.Minute, db, "outbox_cdc")
	counts := map[string]int{}
	for _, r := range c.Records {
		counts[testenv.Header(r, route.HeaderID)]++
	}
	dups := 0
	for id := range want {
		switch n := counts[id]; {
		case n == 0:
			t.Errorf("event %s lost", id)
		case n > 1:
			dups++
		}
	}
	if dups > 0 || len(c.Records) != len(want) {
		t.Errorf("%d events, %d records, %d duplicated; want each once", len(want), len(c.Records), dups)
	}
	how := "waited for the slot"
	if strings.Contains(a.out.String(), fencedMsg) {
		how = "stopped on the fence"
	}
	t.Logf("%d events, each once; the resumed instance %s", len(want), how)
}
