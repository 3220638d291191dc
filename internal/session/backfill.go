package session

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
// reads the chunks, and the requests. The session gives them the stream:
// its control messages go to the jobs, and the rows they hand back go out
// as events, in the watermark's transaction.

// control handles one of the connector's own messages in the stream.
func (s *session) control(m *decode.Message) error {
	c, err := decode.ParseControl(m.Control)
	if err != nil {
		s.d.Log.Warn("ignored a logical decoding message with the connector's prefix that does not parse", "prefix", decode.ControlPrefix, "error", err.Error())
		return nil
	}
	bf := s.d.Jobs
	switch c.Type {
	case decode.ControlRequest:
		return s.request(c.ID, m.CommitTime)
	case decode.ControlLow:
		bf.Low(c, m.Commit)
	case decode.ControlHigh:
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
		s.d.Metrics.BackfillRows(sent.Table).Add(float64(sent.Sent))
		if f := s.d.OnBackfillChunk; f != nil {
			f(sent.Low, sent.High, sent.Read, sent.Sent)
		}
		s.tracker.Note(s.tx, jobs)
	case decode.ControlFail:
		if jobs, ok := bf.Fail(c); ok {
			s.tracker.Note(s.tx, jobs)
		}
	case tablewatch.ControlRepair:
		if s.tables != nil {
			return s.repairAt(c, m)
		}
	case park.ControlRequest:
		return s.redrive(c.ID, m.CommitTime)
	}
	return nil
}

// request takes backfill request id, announced by a message committed at
// at, as a job that starts at this point of the stream, once request.Admit
// admits it (signed by cdc backfill, fresh, not taken before).
func (s *session) request(id string, at time.Time) error {
	req, err := admit(s, backfill.RequestKind, id, at)
	var jobs []checkpoint.Job
	if err == nil {
		jobs, err = s.d.Jobs.Admit(req, s.d.Config.Tables)
		s.refusal("backfill", id, err)
	}
	if refused(err) {
		return nil
	}
	if err != nil {
		return err
	}
	s.tracker.Note(s.tx, jobs)
	s.use(id, at, true, "backfill of "+req.Table+" started")
	s.d.Log.Info("backfill requested", "id", id, "table", req.Table, "where", req.Where)
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
	s.out.NoteParked(s.tx)
	s.tracker.Commit(s.tx, at, at, now)
	s.tx = nil
	s.kafka.Release(time.Time{})
	// A chunk sent: the first start is busy, not stuck (Healthy).
	s.d.Busy()
}

// Working: the server works on the first start's statement, a count or a
// chunk that may take minutes: busy, not stuck (Healthy).
func (s *session) Working() { s.d.Busy() }

func (s *session) WaitRoom(ctx context.Context, n int, bytes int64) error {
	return s.tracker.WaitRoom(ctx, n, bytes)
}

// room waits until the events in flight leave room for a chunk of rows
// read beside the stream (a backfill's, a repair's): half of
// max_in_flight, and max_in_flight_bytes less the chunk's budget.
func (s *session) room(ctx context.Context) error {
	cfg := s.d.Config
	return s.tracker.WaitRoom(ctx, max(cfg.MaxInFlight/2, 1), max(cfg.MaxInFlightBytes-backfill.ChunkBytes(cfg.MaxInFlightBytes), 0))
}

// Save writes the checkpoint with job's progress, through the session's
// producer (in exactly-once mode, in the transaction with the rows it
// counts), and waits for it.
func (s *session) Save(ctx context.Context, job checkpoint.Job) error {
	// Everything sent is acknowledged (the runner waited): the keys its
	// rows parked are in the record too, or a stop now would lose them.
	list := s.parked.List()
	edit := func(r *checkpoint.Record) { r.SetBackfill(job); r.Parked = list }
	if s.eos != nil {
		return s.eos.CommitNow(ctx, edit)
	}
	if err := s.d.Progress.SaveNow(ctx, s.d.Store, s.kafka.Produce, edit); err != nil {
		return fmt.Errorf("write the backfill's progress to the checkpoint: %w", err)
	}
	return nil
}
