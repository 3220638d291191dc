package pipeline

import (
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/redrive"
	"github.com/outboxcdc/cdc/internal/sink"
)

// redrive runs redrive request id, announced by m, in m's transaction
// (package redrive), and notes the parked keys there when they changed.
func (s *session) redrive(id string, m *decode.Message) error {
	if s.replay != nil || s.parked == nil {
		return nil
	}
	saved := s.p.progress.Saved()
	r := &redrive.Runner{Kafka: sink.ClientOpts(s.p.cfg.Kafka, s.p.log.Named("kafka")), Committed: s.eos != nil,
		Keys: s.p.cfg.Checkpoint.SigningKeys, Key: saved.Key(), Tables: s.p.cfg.Tables, Read: s.requests.Get, Log: s.p.log}
	changed, err := r.Run(s.ctx, redrive.Session{Blocking: s.blocking, Settle: s.settle, Redrive: func(p *checkpoint.Parked, src *outbox.Source, recs []*kgo.Record, drop bool) (int, error, error) {
		return s.out.Redrive(s.ctx, s.tx, p, src, recs, drop)
	}}, s.parked, id, m.CommitTime)
	if errors.Is(err, redrive.ErrRefused) {
		s.p.m.ForgedRequests.Inc()
		return nil
	}
	if changed {
		s.tracker.NoteParked(s.tx, s.parked.List())
		s.p.m.ParkedKeys.Set(float64(s.parked.Len()))
	}
	return err
}

// settle lets Kafka acknowledge, and exactly once commits, every event
// sent so far, in the open Postgres transaction (which sent none yet).
func (s *session) settle() error {
	s.kafka.Release(time.Time{})
	if err := s.blocking(func() error { return s.tracker.WaitRoom(s.ctx, 0, -1) }); err != nil || s.eos == nil {
		return err
	}
	if err := s.blocking(func() error { return s.eos.CommitNow(s.ctx, nil) }); err != nil {
		return err
	}
	return s.eos.Begin()
}
