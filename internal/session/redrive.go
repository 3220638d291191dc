package session

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/delivery"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/redrive"
	"github.com/outboxcdc/cdc/internal/request"
	"github.com/outboxcdc/cdc/internal/sink"
)

// Operator requests: a backfill's and a redrive's announcements pass
// request.Admit, the one way in, and run; Record.Used remembers each.

// redriveKind is how package request reads a redrive request.
var redriveKind = request.Kind[park.Request]{Name: "redrive", Parse: park.ParseRequest}

// admit admits announcement id of kind k, committed at at: the request,
// or a *request.Refused, said in the log (and counted when forged).
func admit[T request.Signed](s *session, k request.Kind[T], id string, at time.Time) (T, error) {
	saved := s.d.Progress.Saved()
	req, err := request.Admit(s.ctx, s.d.Requests, s.requests, k, request.Admission{ID: id, At: at,
		Keys: s.d.Config.Checkpoint.SigningKeys, Key: saved.Key(), Taken: s.ledger.Taken, Blocking: s.blocking, Room: s.ledger.Room})
	s.refusal(k.Name, id, err)
	return req, err
}

// refusal logs and counts err when it is a request of kind refused.
func (s *session) refusal(kind, id string, err error) {
	refused, forged := s.d.Requests.Log(s.d.Log, kind, id, err)
	if refused {
		s.d.Metrics.RefusedRequests.WithLabelValues(kind).Inc()
	}
	if forged {
		s.d.Metrics.ForgedRequests.Inc()
	}
}

// refused reports whether err is a request refused, which loses nothing.
func refused(err error) bool { _, ok := err.(*request.Refused); return ok }

// use remembers request id as taken in the open transaction, with what
// it did.
func (s *session) use(id string, at time.Time, done bool, outcome string) {
	s.tracker.NoteUsed(s.tx, s.ledger.Take(checkpoint.Used{ID: id, At: at, Done: done, Outcome: outcome}))
}

// settler lets Kafka have what the session sent so far (delivery.Settler).
func (s *session) settler() delivery.Settler {
	return delivery.Settler{Tracker: s.tracker, Committer: s.eos, Progress: s.d.Progress, Store: s.d.Store,
		Produce: s.kafka.Produce, Release: func() { s.kafka.Release(time.Time{}) }, Blocking: s.blocking}
}

// redrive runs redrive request id, announced by a message committed at
// at, in the open transaction, when it is admitted.
func (s *session) redrive(id string, at time.Time) error {
	if s.replay != nil || s.parked == nil {
		return nil
	}
	if s.sentInTx {
		// A redrive settles what came before it with Kafka (in exactly-once
		// mode, commits it) and saves the checkpoint at the last whole
		// transaction: events of this one sent before it would be
		// committed, and sent again after a crash. cdc redrive announces in
		// a transaction of its own, which is the one to take: this copy
		// (an application's) leaves the request as it was.
		s.d.Log.Warn("a redrive announcement in a transaction that carried outbox events is not taken there (cdc redrive writes its own)", "id", id)
		return nil
	}
	req, err := admit(s, redriveKind, id, at)
	if refused(err) {
		return nil
	}
	if err != nil {
		return err
	}
	return s.runRedrive(req, at)
}

// runRedrive runs admitted redrive req in the open transaction (package
// redrive), between chunks waiting for room (exactly once: committing the
// chunk, with how far each parking has been released).
func (s *session) runRedrive(req park.Request, at time.Time) error {
	cfg, saved, settle := s.d.Config, s.d.Progress.Saved(), s.settler()
	chunk := max(cfg.MaxInFlight/2, 1)
	r := &redrive.Runner{Kafka: sink.ClientOpts(cfg.Kafka, s.d.Log.Named("kafka")), Committed: s.eos != nil,
		Keys: cfg.Checkpoint.SigningKeys, Key: saved.Key(), ChunkRecords: chunk, ChunkBytes: int(max(cfg.MaxInFlightBytes/2, 1<<20)),
		Log: s.d.Log.Named("redrive"), Retained: func() (names []string) {
			for _, t := range cfg.Tables {
				if t.Retention != nil {
					names = append(names, t.String())
				}
			}
			return names
		}}
	out, err := r.Run(s.ctx, redrive.Session{
		Blocking: s.blocking,
		Settle:   func() error { return settle.All(s.ctx) },
		Route: func(p *checkpoint.Parked, rec *kgo.Record, drop bool) (func() error, error, error) {
			out, kind, ev, still, err := s.out.Redriven(s.ctx, p, rec, cfg.Tables, saved.Tables, drop)
			if still != nil || err != nil {
				return nil, still, err
			}
			return func() error { return s.out.SendRedriven(s.ctx, s.tx, out, kind, ev) }, nil, nil
		},
		Chunk: func(*checkpoint.Parked) error {
			list, used := s.parked.List(), s.ledger.Used
			return settle.Room(s.ctx, chunk, cfg.MaxInFlightBytes/2, func(r *checkpoint.Record) { r.Parked, r.Used = list, used })
		},
		Dirty: s.out.ParkedChanged,
	}, s.parked, req)
	if err != nil {
		return err
	}
	s.d.Metrics.ParkedKeys.Set(float64(s.parked.Len()))
	s.out.NoteParked(s.tx)
	s.use(req.ID, at, out.Done, out.String())
	s.d.Log.Info("redrive run; cdc parked shows what stays parked", "id", req.ID, "done", out.Done, "outcome", out.String())
	return nil
}

// pendingRedrives runs, before the stream's first transaction, the
// redrive requests no session took: one made while the connector stops on
// an event before its announcement (max_parked_keys reached) is what lets
// it start. It goes through the same way in (request.Admit, fresh from
// now), and its outcome is saved at once, for cdc redrive to see.
func (s *session) pendingRedrives(ctx context.Context) error {
	if s.replay != nil || s.parked == nil || s.parked.Len() == 0 || len(s.d.Config.Checkpoint.SigningKeys) == 0 {
		return nil
	}
	ids, err := s.requests.Pending(ctx, park.RequestPrefix, park.Made, time.Now())
	if err != nil {
		return err
	}
	forged := 0
	defer func() {
		if forged > 0 {
			s.d.Metrics.ForgedRequests.Add(float64(forged))
			s.d.Log.Warn("ignored redrive requests in the checkpoint topic that do not verify (written by someone without checkpoint.signing_key_file's key)", "count", forged)
		}
	}()
	for _, id := range ids {
		if s.ledger.Taken(id) {
			continue
		}
		now, saved := time.Now(), s.d.Progress.Saved()
		req, err := request.Admit(ctx, s.d.Requests, s.requests, redriveKind, request.Admission{ID: id, At: now,
			Keys: s.d.Config.Checkpoint.SigningKeys, Key: saved.Key(), Taken: s.ledger.Taken, Blocking: s.blocking, Room: s.ledger.Room})
		if r, ok := err.(*request.Refused); ok {
			if r.Forged {
				forged++
			}
			continue
		}
		if err == nil {
			s.d.Log.Info("running a redrive the stream has not reached, before streaming", "id", id)
			err = s.Begin(now)
		}
		if err == nil {
			err = s.runRedrive(req, now)
			s.Commit(s.tracker.Position().LSN, now)
		}
		if err == nil {
			list, used := s.parked.List(), s.ledger.Used
			err = s.settler().Save(ctx, func(r *checkpoint.Record) { r.Parked, r.Used = list, used })
		}
		if err != nil {
			return err
		}
	}
	return nil
}
