package main

import (
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestStandbyTakesOverAFrozenHolder (issues 14 and 23): two replicas of one
// config, running as the least-privileged role docker/init.sql makes; the
// one holding the slot freezes (SIGSTOP) while events flow. The standby
// ends the frozen holder's walsender itself, once it has seen the holder
// silent for takeover_after, not after wal_sender_timeout (60 s here, the
// default), and the frozen one, when it resumes, finds its connection
// ended and waits as a standby. No event is lost. As that role without
// pg_read_all_stats, the standby could not see the holder's reply_time and
// waited for wal_sender_timeout.
//
// The time the takeover takes is logged, not bounded by a round number:
// docs/operations.md promises about 7 s (takeover_after and two of the
// standby's looks, takeover_after/4 apart), but each look and the new
// session's start cost what the machine's load makes them cost, which no
// setting bounds. What the test tells apart is the standby's takeover from
// Postgres': the standby says it ended the walsender, and how long it saw
// the holder silent (at least takeover_after, or it took a live holder
// for frozen); and it took over before Postgres would have ended the
// walsender itself.
func TestStandbyTakesOverAFrozenHolder(t *testing.T) {
	const walSenderTimeout = 60 * time.Second // Postgres' default
	const takeoverAfter = config.DefaultTakeoverAfter
	p := testenv.Require(t, pg)
	db := p.NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`)
	kafka := testenv.NewKafka(t)
	config := outboxConfig(t, kafka, fmt.Sprintf("url: %q", withOptions(testenv.LeastPrivileged(t, db, "outbox", true), fmt.Sprintf("wal_sender_timeout=%dms", walSenderTimeout.Milliseconds()))), "")
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
	// Postgres ends a silent walsender wal_sender_timeout after the
	// holder's last status update, which came at most status_interval
	// before the freeze: from then on a takeover may be Postgres' doing.
	if bound := walSenderTimeout - postgres.DefaultStatusInterval; took >= bound {
		t.Errorf("the standby took over %s after the holder froze; want it before wal_sender_timeout could end the walsender (%s)", took.Round(100*time.Millisecond), bound)
	}
	ended := regexp.MustCompile(`ended its walsender to take over.* silent=(\S+)`).FindStringSubmatch(b.out.String())
	if ended == nil {
		t.Fatalf("the standby did not say it ended the frozen holder's walsender:\n%s", b.out)
	}
	if silent, err := time.ParseDuration(ended[1]); err != nil || silent < takeoverAfter {
		t.Errorf("the standby ended a holder it saw silent for %s (%v); want at least takeover_after (%s)", ended[1], err, takeoverAfter)
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
	t.Logf("took over %s after the freeze (the holder seen silent for %s); %d events, none lost, %d records", took.Round(100*time.Millisecond), ended[1], len(want), len(c.Records))
}
