package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/wal"
)

// Active and standby (docs/operations.md, "Active and standby"). Replicas
// of one config share the slot, which admits one walsender at a time: the
// one streaming is active, the others wait. A holder that froze or lost its
// network keeps its walsender until wal_sender_timeout (60 s by default). So
// a standby watches the holder's lease instead: its walsender's reply_time,
// when the holder last sent a status update, which a live holder does at
// least every status_interval even when Kafka is down (rule 10). Once it is
// older than takeover_after, the standby ends that walsender
// (pg_terminate_backend) and takes the slot. The old holder, when it
// resumes, finds its connection gone before it can confirm anything; in
// exactly-once mode the new holder has also fenced it.

// StandbyConfig configures takeover.
type StandbyConfig struct {
	// TakeoverAfter is how long the slot's holder may send Postgres
	// nothing before a standby ends its walsender and takes over. Default
	// DefaultTakeoverAfter; negative turns takeover off (a standby then
	// waits for wal_sender_timeout). At least three status intervals.
	TakeoverAfter time.Duration
}

// DefaultTakeoverAfter is StandbyConfig.TakeoverAfter's default: five
// status intervals of the default 1s, so that takeover comes within about
// 7 s of the holder freezing.
const DefaultTakeoverAfter = 5 * time.Second

func (c *Config) validateStandby() error {
	switch t := c.Standby.TakeoverAfter; {
	case t == 0:
		c.Standby.TakeoverAfter = max(DefaultTakeoverAfter, 3*c.Postgres.StatusInterval)
	case t < 0:
		c.Standby.TakeoverAfter = 0 // off
	case t < 3*c.Postgres.StatusInterval:
		return fmt.Errorf("standby.takeover_after %s: use at least three postgres.status_interval (%s), or a live holder could be taken for a frozen one", t, c.Postgres.StatusInterval)
	}
	return nil
}

// takeOver ends the slot holder's walsender if it has sent nothing for
// TakeoverAfter, and reports whether it did. Failures are logged: the
// standby goes on waiting.
func (p *Pipeline) takeOver(ctx context.Context) bool {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := wal.ConnectSQL(qctx, p.cfg.Postgres)
	if err != nil {
		return false
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var pid int
	var silent *float64 // seconds since the holder's last status update
	err = conn.QueryRow(qctx, `
		SELECT s.active_pid, extract(epoch FROM clock_timestamp() - r.reply_time)::float8
		FROM pg_replication_slots s LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid
		WHERE s.slot_name = $1 AND s.active`, p.cfg.Postgres.Slot).Scan(&pid, &silent)
	if errors.Is(err, pgx.ErrNoRows) {
		return true // free now: try at once
	}
	if err != nil {
		p.log.Warn("standby: cannot read the slot holder's last status update", "error", oneLine(err))
		return false
	}
	// No reply yet: a holder that just connected; watch it.
	if silent == nil || time.Duration(*silent*float64(time.Second)) < p.cfg.Standby.TakeoverAfter {
		return false
	}
	var ended bool
	if err := conn.QueryRow(qctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&ended); err != nil || !ended {
		p.log.Warn("standby: the slot's holder is silent but its walsender could not be ended; waiting for wal_sender_timeout", "pid", pid, "error", fmt.Sprint(err))
		return false
	}
	p.log.Warn("standby: the slot's holder has sent Postgres nothing for longer than standby.takeover_after; ended its walsender to take over",
		"slot", p.cfg.Postgres.Slot, "pid", pid, "silent", (time.Duration(*silent * float64(time.Second))).Round(100*time.Millisecond).String(), "takeover_after", p.cfg.Standby.TakeoverAfter)
	p.waitingLogged = false
	return true
}
