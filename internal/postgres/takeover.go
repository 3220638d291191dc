package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/pgident"
)

// Takeover is how a replica that finds the slot held takes it from a
// holder that went silent (docs/operations.md, "Active and standby").
// Replicas of one config share the slot, which admits one walsender at a
// time: the one streaming is active, the others wait. A holder that froze
// or lost its network keeps its walsender until wal_sender_timeout (60 s by
// default). So a waiting replica watches the holder's lease instead: its
// walsender's reply_time, when the holder last sent a status update, which
// a live holder does at least every status_interval even when Kafka is down
// (docs/design.md, "Status updates under backpressure"), and while it
// blocks on Kafka (wal.Stream.While). Once the replica has seen it
// unchanged for After, on its own clock, it ends that walsender
// (pg_terminate_backend, which a role may do to its own backends) and
// takes the slot. Seeing reply_time takes pg_read_all_stats, which cdc
// check verifies and docker/init.sql grants. The old holder, when it
// resumes, finds its connection gone before it can confirm anything; in
// exactly-once mode the new holder has also fenced it.
//
// A Takeover is used by one goroutine.
type Takeover struct {
	Postgres Config
	// After is standby.takeover_after: how long the holder may send
	// nothing before its walsender is ended.
	After time.Duration
	Log   hclog.Logger

	lease lease
	// blind: it said once that its role cannot see the holder.
	blind bool
}

// lease is what a replica last saw of the slot's holder: its walsender,
// the holder's last status update time as Postgres recorded it, and when
// this replica first saw that value, on its own clock. The holder's time
// (reply_time is the client's clock) is only compared with itself: a
// holder whose clock is 30 s behind is not silent, one whose reply_time
// has not changed for After is.
type lease struct {
	pid   int
	reply time.Time
	seen  time.Time
}

// Try ends the slot holder's walsender if it has sent nothing for After.
// now reports whether the slot may be tried at once (it is free, or its
// holder was ended), ended whether this call ended the holder. Failures
// are logged: the replica goes on waiting.
//
// reply_time is NULL for a role without pg_read_all_stats, whatever the
// holder does (NULL means "cannot see", never "healthy" or "silent"):
// such a replica says once what to grant and waits for
// wal_sender_timeout instead.
func (t *Takeover) Try(ctx context.Context) (now, ended bool) {
	slot := t.Postgres.Slot
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := ConnectSQL(qctx, t.Postgres)
	if err != nil {
		return false, false
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
		WHERE s.slot_name = $1 AND s.active`, slot).Scan(&pid, &reply, &role, &canSee)
	if errors.Is(err, pgx.ErrNoRows) {
		t.lease = lease{}
		return true, false // free now: try at once
	}
	if err != nil {
		t.Log.Warn("standby: cannot read the slot holder's last status update", "error", errtext.OneLine(err))
		return false, false
	}
	if !canSee {
		if !t.blind {
			t.Log.Warn("standby: this role cannot see the slot holder's status updates (pg_stat_replication.reply_time needs pg_read_all_stats), so it cannot take over a frozen holder before wal_sender_timeout; grant it: GRANT pg_read_all_stats TO "+pgident.Quote(role)+" (cdc check says so too)",
				"slot", slot)
			t.blind = true
		}
		return false, false
	}
	seen := time.Now()
	var at time.Time
	if reply != nil {
		at = *reply
	}
	if pid != t.lease.pid || !at.Equal(t.lease.reply) {
		// A new holder, or one that spoke since: watch it from now.
		t.lease = lease{pid: pid, reply: at, seen: seen}
		return false, false
	}
	silent := seen.Sub(t.lease.seen)
	if silent < t.After {
		return false, false
	}
	var done bool
	if err := conn.QueryRow(qctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&done); err != nil || !done {
		t.Log.Warn("standby: the slot's holder is silent but its walsender could not be ended; waiting for wal_sender_timeout", "pid", pid, "error", fmt.Sprint(err))
		return false, false
	}
	t.Log.Warn("standby: the slot's holder has sent Postgres nothing for longer than standby.takeover_after; ended its walsender to take over",
		"slot", slot, "pid", pid, "silent", silent.Round(100*time.Millisecond).String(), "takeover_after", t.After)
	t.lease = lease{}
	return true, true
}
