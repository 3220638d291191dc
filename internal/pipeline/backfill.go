package pipeline

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/backfill"
	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/tablewatch"
)

// Backfills are internal/backfill's (docs/design.md, "Backfill"): the
// jobs and their watermark state machine (backfill.Jobs), the runner that
// reads the chunks, and the requests. The pipeline gives them the
// session: the stream's control messages go to the jobs, and the rows
// they hand back go out as events, in the watermark's transaction.

// backfills is the runner for this pipeline's config.
func (p *Pipeline) backfills() *backfill.Runner {
	return &backfill.Runner{
		Postgres: p.cfg.Postgres, StatementTimeout: p.cfg.Backfill.StatementTimeout, ReaderRole: p.cfg.Backfill.ReaderRole, Tables: p.cfg.Tables,
		MaxInFlight: p.cfg.MaxInFlight, MaxInFlightBytes: p.cfg.MaxInFlightBytes, ChunkBytes: backfill.ChunkBytes(p.cfg.MaxInFlightBytes),
		StatusInterval: p.cfg.Postgres.StatusInterval,
		Backoff:        p.cfg.RetryBackoff, BackoffMax: p.cfg.RetryBackoffMax,
		Log: p.log, Metrics: p.m,
	}
}

// control handles one of the connector's own messages in the stream.
func (s *session) control(m *decode.Message) error {
	c, err := backfill.ParseControl(m.Control)
	if err != nil {
		s.p.log.Warn("ignored a logical decoding message with the connector's prefix that does not parse", "prefix", decode.ControlPrefix, "error", err.Error())
		return nil
	}
	bf := s.p.bf
	switch c.Type {
	case backfill.ControlRequest:
		return s.request(c.ID, m.CommitTime)
	case backfill.ControlLow:
		bf.Low(c, m.Commit)
	case backfill.ControlHigh:
		rows, ok, err := bf.High(c, m.Commit, m.CommitTime)
		if !ok || err != nil {
			return err
		}
		for i := range rows {
			if err := s.event(&rows[i]); err != nil {
				return err
			}
		}
		jobs, sent := bf.Sent(len(rows))
		s.p.m.BackfillRows(sent.Table).Add(float64(sent.Sent))
		if f := s.p.opts.OnBackfillChunk; f != nil {
			f(sent.Low, sent.High, sent.Read, sent.Sent)
		}
		s.tracker.Note(s.tx, jobs)
	case backfill.ControlFail:
		if jobs, ok := bf.Fail(c); ok {
			s.tracker.Note(s.tx, jobs)
		}
	case tablewatch.ControlRepair:
		if s.tables != nil {
			return s.repairAt(c, m)
		}
	case park.ControlRequest:
		return s.redrive(c.ID, m)
	}
	return nil
}

// request takes backfill request id, if cdc backfill wrote and signed it,
// as a job that starts at this point of the stream.
func (s *session) request(id string, at time.Time) error {
	if id == "" || s.p.bf.Has(id) {
		return nil // read again after a restart
	}
	a := &s.p.announced
	if a.Refused(id) {
		return nil // refused before: said once
	}
	refuse := func(msg string) {
		a.Refuse(id)
		s.p.log.Warn(msg, "id", id)
	}
	if !s.requests.Read(id) && !a.Allow(time.Now()) {
		// An id the follower has not read costs a look at the topic's
		// end, on the replication loop: a role announcing ids at will
		// gets a few a second, not the loop.
		refuse("ignored a backfill request announced while many unknown ones were: too many to look up; if it is yours, run cdc backfill again")
		return nil
	}
	ctx, cancel := context.WithTimeout(s.ctx, 15*time.Second)
	defer cancel()
	var req checkpoint.Request
	var found bool
	// The follower has read the request already (cdc backfill writes it
	// before it announces it in the WAL): this seldom waits.
	err := s.blocking(func() (err error) {
		req, found, err = s.requests.Request(ctx, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("read backfill request %s: %w", id, err)
	}
	saved := s.p.progress.Saved()
	jobs, err := s.p.bf.Admit(req, found, s.p.cfg.Checkpoint.SigningKeys, saved.Key(), s.p.cfg.Tables, at)
	if refused, ok := err.(*backfill.Refused); ok {
		refuse(refused.Msg)
		if refused.Forged {
			s.p.m.ForgedRequests.Inc()
		}
		return nil
	}
	s.tracker.Note(s.tx, jobs)
	s.p.log.Info("backfill requested", "id", id, "table", req.Table, "where", req.Where)
	return nil
}

// The session is the first start's backfill.Session.

func (s *session) Begin(now time.Time) error {
	if s.eos != nil {
		if err := s.eos.Begin(); err != nil {
			return err
		}
	}
	s.tx = s.tracker.Begin(now)
	return nil
}

func (s *session) Event(m *decode.Message) error { return s.event(m) }

func (s *session) Commit(at pglogrepl.LSN, now time.Time) {
	s.tracker.Commit(s.tx, at, at, now)
	s.tx = nil
	s.kafka.Release(time.Time{})
	// A chunk sent: the first start is busy, not stuck (Healthy).
	s.p.health.Busy()
}

// Working: the server works on the first start's statement, a count or a
// chunk that may take minutes: busy, not stuck (Healthy).
func (s *session) Working() { s.p.health.Busy() }

func (s *session) WaitRoom(ctx context.Context, n int, bytes int64) error {
	return s.tracker.WaitRoom(ctx, n, bytes)
}

// room waits until the events in flight leave room for a chunk of rows
// read beside the stream (a backfill's, a repair's): half of
// max_in_flight, and max_in_flight_bytes less the chunk's budget.
func (s *session) room(ctx context.Context) error {
	cfg := s.p.cfg
	return s.tracker.WaitRoom(ctx, max(cfg.MaxInFlight/2, 1), max(cfg.MaxInFlightBytes-backfill.ChunkBytes(cfg.MaxInFlightBytes), 0))
}

// Save writes the checkpoint with job's progress, through the session's
// producer (in exactly-once mode, in the transaction with the rows it
// counts), and waits for it.
func (s *session) Save(ctx context.Context, job checkpoint.Job) error {
	edit := func(r *checkpoint.Record) { r.SetBackfill(job) }
	if s.eos != nil {
		return s.eos.CommitNow(ctx, edit)
	}
	if err := s.p.progress.SaveNow(ctx, s.p.store, s.kafka.Produce, edit); err != nil {
		return fmt.Errorf("write the backfill's progress to the checkpoint: %w", err)
	}
	return nil
}
