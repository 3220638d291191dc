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

// TestStandbyTakesOverAFrozenHolder (issues 14 and 23): two replicas of one
// config, running as the least-privileged role docker/init.sql makes; the
// one holding the slot freezes (SIGSTOP) while events flow. The standby
// takes over within takeover_after + 5 s (10 s), not after
// wal_sender_timeout (60 s here, the default), and the frozen one, when it
// resumes, finds its connection ended and waits as a standby. No event is
// lost. As that role without pg_read_all_stats, the standby could not see
// the holder's reply_time and waited for wal_sender_timeout.
func TestStandbyTakesOverAFrozenHolder(t *testing.T) {
	p := testenv.Require(t, pg)
	db := p.NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`)
	kafka := testenv.NewKafka(t)
	config := outboxConfig(t, kafka, fmt.Sprintf("url: %q", withOptions(testenv.LeastPrivileged(t, db, "outbox", true), "wal_sender_timeout=60s")), "")
	a := startProc(t, config)
	testenv.Eventually(t, 30*time.Second, "the first replica to hold the slot", func() bool { return slotActive(t, db) })
	b := startProc(t, config)
	testenv.Eventually(t, 30*time.Second, "the second replica to wait as a standby", func() bool {
		return strings.Contains(b.out.String(), "waiting for it as a standby")
	})

	written, stopWriter := pacedWriter(db, 5*time.Millisecond)
	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.WaitCount(t, time.Minute, 100)

	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	testenv.Eventually(t, 30*time.Second, "the standby to take over", func() bool {
		return strings.Contains(b.out.String(), "streaming from replication slot")
	})
	took := time.Since(frozen)
	if took > 10*time.Second {
		t.Errorf("the standby took over %s after the holder froze; want at most 10s", took.Round(100*time.Millisecond))
	}
	if !strings.Contains(b.out.String(), "ended its walsender to take over") {
		t.Errorf("the standby did not say it ended the frozen holder's walsender:\n%s", b.out)
	}
	at := written.Load()
	testenv.Eventually(t, time.Minute, "events after the takeover", func() bool { return written.Load() > at+200 })
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "the resumed replica to wait as a standby", func() bool {
		return strings.Count(a.out.String(), "waiting for it as a standby") > 0
	})
	if err := stopWriter(); err != nil {
		t.Fatal(err)
	}
	want := outboxIDs(t, db)
	c.WaitFor(t, 2*time.Minute, "every event", func(recs []*kgo.Record) bool {
		got := map[string]bool{}
		for _, r := range recs {
			got[testenv.Header(r, route.HeaderID)] = true
		}
		for id := range want {
			if !got[id] {
				return false
			}
		}
		return true
	})
	if strings.Contains(b.out.String(), "ended its walsender") && strings.Contains(a.out.String(), "ended its walsender") {
		t.Errorf("both replicas ended each other's walsender")
	}
	t.Logf("took over %s after the freeze; %d events, none lost, %d records", took.Round(100*time.Millisecond), len(want), len(c.Records))
}
