package setup

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/postgres"
)

// SlotWaitReport is how often WhileCreatingSlot says what the slot's
// creation waits for.
var SlotWaitReport = 5 * time.Second

// WhileCreatingSlot runs create, which creates the slot. A logical slot's
// creation waits until every transaction that had written when it began
// has ended (its consistent point): one session left idle in a
// transaction (a leak) makes it wait for ever, in silence. So every
// SlotWaitReport it says what it waits for through report: the
// transactions, as far as the role can see them, and how to end them
// (detail is for /readyz, detail and advice together for the log).
//
// On a hot standby it waits instead for the primary's next record of its
// running transactions, which the primary logs about every 15 s while it
// writes: with postgres.primary_url, it asks for one every second
// (pg_log_standby_snapshot).
func WhileCreatingSlot(ctx context.Context, cfg postgres.Config, standby bool, log hclog.Logger, state func(detail string), create func() error) error {
	done := make(chan struct{})
	reported := make(chan struct{})
	go func() {
		defer close(reported)
		t := time.NewTicker(SlotWaitReport)
		defer t.Stop()
		ask := time.NewTicker(time.Second)
		defer ask.Stop()
		if !standby || cfg.PrimaryURL == "" {
			ask.Stop()
		}
		asked := false
		for {
			select {
			case <-done:
				return
			case <-ask.C:
				if err := postgres.LogStandbySnapshot(ctx, cfg); err != nil && !asked {
					log.Warn("could not ask the primary to log its running transactions (pg_log_standby_snapshot), which the slot's creation on the standby waits for; it logs them about every 15 s while it writes", "error", errtext.OneLine(err))
				}
				asked = true
			case <-t.C:
				if standby {
					detail := "first start: creating the replication slot on a hot standby waits for the primary to log its running transactions (about every 15 s while it writes; at once with postgres.primary_url)"
					state(detail)
					log.Warn(detail, "slot", cfg.Slot)
					continue
				}
				reportSlotWait(ctx, cfg, log, state)
			}
		}
	}()
	err := create()
	close(done)
	<-reported
	return err
}

// reportSlotWait says once what the slot's creation waits for.
func reportSlotWait(ctx context.Context, cfg postgres.Config, log hclog.Logger, state func(detail string)) {
	conn, err := postgres.ConnectSQL(ctx, cfg)
	if err != nil {
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `SELECT pid, coalesce(state, ''), coalesce(extract(epoch FROM now() - xact_start)::bigint, 0)
		FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid() ORDER BY xact_start LIMIT 5`)
	if err != nil {
		return
	}
	var seen []string
	for rows.Next() {
		var pid int
		var state string
		var age int64
		if rows.Scan(&pid, &state, &age) == nil {
			seen = append(seen, fmt.Sprintf("pid %d, %s for %ds", pid, state, age))
		}
	}
	rows.Close()
	end := "end it, or run SELECT pg_terminate_backend(<pid>) as its owner or a superuser"
	if len(seen) == 0 {
		detail := "first start: creating the replication slot waits for transactions that were open when it began to end"
		state(detail)
		log.Warn(detail+"; the connector's role cannot see other sessions' transactions (GRANT pg_read_all_stats lets it): find them with SELECT pid, state, xact_start FROM pg_stat_activity WHERE backend_xid IS NOT NULL ORDER BY xact_start; "+end,
			"slot", cfg.Slot)
		return
	}
	detail := fmt.Sprintf("first start: creating the replication slot waits for %d open transaction(s) to end: %s", len(seen), strings.Join(seen, "; "))
	state(detail)
	log.Warn(detail+"; a session left idle in a transaction keeps it waiting for ever: "+end, "slot", cfg.Slot)
}
