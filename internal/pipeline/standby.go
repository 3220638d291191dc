package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/pgident"
	"github.com/outboxcdc/cdc/internal/postgres"
)

// Active and standby (docs/operations.md, "Active and standby"). Replicas of
// one config share the slot, which admits one walsender at a time: the one
// streaming is active, the others wait. A holder that froze or lost its network
// keeps its walsender until wal_sender_timeout (60 s by default). So a standby
// watches the holder's lease instead: its walsender's reply_time, when the
// holder last sent a status update, which a live holder does at least every
// status_interval even when Kafka is down (docs/design.md, "Status updates
// under backpressure"), and while it blocks on Kafka (wal.Stream.While). Once
// the standby has seen it unchanged for takeover_after, on its own clock, it
// ends that walsender (pg_terminate_backend, which a role may do to its own
// backends) and takes the slot. Seeing reply_time takes pg_read_all_stats,
// which cdc check verifies and docker/init.sql grants. The old holder, when it
// resumes, finds its connection gone before it can confirm anything; in
// exactly-once mode the new holder has also fenced it.

// lease is what a standby last saw of the slot's holder: its walsender,
// the holder's last status update time as Postgres recorded it, and when
// this standby first saw that value, on its own clock. The holder's time
// (reply_time is the client's clock) is only compared with itself: a
// holder whose clock is 30 s behind is not silent, one whose reply_time
// has not changed for takeover_after is.
type lease struct {
	pid   int
	reply time.Time
	seen  time.Time
}

// takeOver ends the slot holder's walsender if it has sent nothing for
// TakeoverAfter, and reports whether it did (or the slot is free). Failures
// are logged: the standby goes on waiting.
//
// reply_time is NULL for a role without pg_read_all_stats, whatever the
// holder does (NULL means "cannot see", never "healthy" or
// "silent"): such a standby says once what to grant and waits for
// wal_sender_timeout instead.
func (p *Pipeline) takeOver(ctx context.Context) bool {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := postgres.ConnectSQL(qctx, p.cfg.Postgres)
	if err != nil {
		return false
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var pid int
	var reply *time.Time
	var canSee bool
	var role string
	err = conn.QueryRow(qctx, `
		SELECT s.active_pid, r.reply_time, current_user,
		       pg_has_role(current_user, 'pg_read_all_stats', 'USAGE') OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
		FROM pg_replication_slots s LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid
		WHERE s.slot_name = $1 AND s.active`, p.cfg.Postgres.Slot).Scan(&pid, &reply, &role, &canSee)
	if errors.Is(err, pgx.ErrNoRows) {
		p.lease = lease{}
		return true // free now: try at once
	}
	if err != nil {
		p.log.Warn("standby: cannot read the slot holder's last status update", "error", errtext.OneLine(err))
		return false
	}
	if !canSee {
		if !p.leaseBlind {
			p.log.Warn("standby: this role cannot see the slot holder's status updates (pg_stat_replication.reply_time needs pg_read_all_stats), so it cannot take over a frozen holder before wal_sender_timeout; grant it: GRANT pg_read_all_stats TO "+pgident.Quote(role)+" (cdc check says so too)",
				"slot", p.cfg.Postgres.Slot)
			p.leaseBlind = true
		}
		return false
	}
	now := time.Now()
	var at time.Time
	if reply != nil {
		at = *reply
	}
	if pid != p.lease.pid || !at.Equal(p.lease.reply) {
		// A new holder, or one that spoke since: watch it from now.
		p.lease = lease{pid: pid, reply: at, seen: now}
		return false
	}
	silent := now.Sub(p.lease.seen)
	if silent < p.cfg.Standby.TakeoverAfter {
		return false
	}
	var ended bool
	if err := conn.QueryRow(qctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&ended); err != nil || !ended {
		p.log.Warn("standby: the slot's holder is silent but its walsender could not be ended; waiting for wal_sender_timeout", "pid", pid, "error", fmt.Sprint(err))
		return false
	}
	p.log.Warn("standby: the slot's holder has sent Postgres nothing for longer than standby.takeover_after; ended its walsender to take over",
		"slot", p.cfg.Postgres.Slot, "pid", pid, "silent", silent.Round(100*time.Millisecond).String(), "takeover_after", p.cfg.Standby.TakeoverAfter)
	p.waitingLogged = false
	p.lease = lease{}
	return true
}
