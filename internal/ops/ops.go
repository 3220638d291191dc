package ops

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/backfill"
	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pgident"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/schema"
	"github.com/outboxcdc/cdc/internal/setup"
	"github.com/outboxcdc/cdc/internal/sink"
	"github.com/outboxcdc/cdc/internal/wal"
)

// Ops runs the operator commands for one pipeline's config.
type Ops struct {
	Config config.Config // validated (pipeline.New)
	Log    hclog.Logger
	// Version is the connector's, recorded in the checkpoints it writes.
	Version string
	// KafkaOpts are extra franz-go options, for the tests' hooks.
	KafkaOpts []kgo.Opt

	store *checkpoint.Store // the checkpoint topic's, once read
}

// checkRetention is what keeps table t's retention from working, or "":
// DELETE on it (mode delete), or owning it and its partitions, which
// detaching and dropping them need (drop_partitions).
func checkRetention(ctx context.Context, cfg postgres.Config, t *outbox.Source) string {
	conn, err := postgres.ConnectSQL(ctx, cfg)
	if err != nil {
		return ""
	}
	defer conn.Close(context.WithoutCancel(ctx))
	name := pgident.QualifiedIdent(t.Name.Schema, t.Name.Name)
	var role string
	var ok, partitioned bool
	err = conn.QueryRow(ctx, `SELECT current_user, has_table_privilege($1, 'DELETE'), c.relkind = 'p'
		FROM pg_class c WHERE c.oid = $1::regclass`, name).Scan(&role, &ok, &partitioned)
	if err != nil {
		return "" // a missing table is reported with the tables
	}
	if t.Retention.Mode == outbox.RetentionDropPartitions {
		if !partitioned {
			return fmt.Sprintf("%s: retention.mode drop_partitions needs a partitioned table; use mode delete", t)
		}
		var owns bool
		err = conn.QueryRow(ctx, `SELECT bool_and(pg_has_role(current_user, c.relowner, 'USAGE')) FROM pg_class c
			WHERE c.oid = $1::regclass OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = $1::regclass)`, name).Scan(&owns)
		if err == nil && !owns {
			return fmt.Sprintf("role %s does not own %s and all its partitions, which retention.mode drop_partitions needs to detach and drop them; as their owner run: ALTER TABLE %s OWNER TO %s (and each partition's), or use mode delete with GRANT DELETE", pgident.Quote(role), t, t, pgident.Quote(role))
		}
		return ""
	}
	if !ok {
		return fmt.Sprintf("role %s may not DELETE from %s, which its retention needs; as its owner run: GRANT DELETE ON %s TO %s", pgident.Quote(role), t, t, pgident.Quote(role))
	}
	return ""
}

// unreachable reports whether err is a broker nobody answers for: a dial
// refused or timed out, a name that does not resolve, a deadline.
func unreachable(err error) bool {
	var op *net.OpError
	var dns *net.DNSError
	return errors.As(err, &dns) || (errors.As(err, &op) && op.Op == "dial") || errors.Is(err, context.DeadlineExceeded)
}

// backfills is the backfill runner for the config, for Check.
func (o *Ops) backfills() *backfill.Runner {
	return &backfill.Runner{Postgres: o.Config.Postgres, StatementTimeout: o.Config.Backfill.StatementTimeout, ReaderRole: o.Config.Backfill.ReaderRole, Tables: o.Config.Tables, Log: o.Log}
}

// Check checks Postgres' and Kafka's preconditions without creating or
// streaming anything. It returns, as a *setup.CheckError, what would stop
// cdc run; and warnings, what would weaken it without stopping it (cdc
// check exits 0 on those): a standby that cannot see its holder, an
// unlimited max_slot_wal_keep_size, an idle_replication_slot_timeout that
// a day-long stop or the replay window outlasts (setup.IdleTimeoutWarning),
// brokers that do not answer now (cdc run would wait for them).
func (o *Ops) Check(ctx context.Context) (warnings []string, err error) {
	var probs []string
	var slots []string
	if o.Config.Replay.Window > 0 {
		slots = append(slots, o.Config.ReplaySlot())
	}
	ws, err := setup.Check(ctx, o.Config.Postgres, o.Config.WALTables(), slots...)
	for _, w := range ws {
		warnings = append(warnings, "postgres: "+w)
	}
	if err != nil {
		var ce *setup.CheckError
		if !errors.As(err, &ce) {
			return warnings, fmt.Errorf("postgres: %w", err) // no connection: nothing else to learn there
		}
		for _, pr := range ce.Problems {
			probs = append(probs, "postgres: "+pr)
		}
	}
	switch w, err := setup.CheckIdleTimeout(ctx, o.Config.Postgres, o.Config.Replay.Window); {
	case err != nil:
		warnings = append(warnings, "postgres: "+errtext.OneLine(err))
	case w != "":
		warnings = append(warnings, "postgres: "+w)
	}
	if o.Config.TakeoverAfter() > 0 {
		if w := checkTakeover(ctx, o.Config.Postgres); w != "" {
			warnings = append(warnings, "postgres: "+w)
		}
	}
	for _, t := range o.Config.Tables {
		if t.Retention != nil {
			if pr := checkRetention(ctx, o.Config.Postgres, t); pr != "" {
				probs = append(probs, "postgres: "+pr)
			}
		}
	}
	if len(probs) == 0 {
		// The backfills' conditions and orders, which need the tables.
		for _, j := range backfill.InitialJobs(o.Config.Tables, false, nil) {
			if err := o.backfills().Check(ctx, []checkpoint.Job{j}); err != nil {
				probs = append(probs, "postgres: "+errtext.OneLine(err))
			}
		}
	}
	if o.Config.UsesRegistry() {
		reg, err := schema.New(o.Config.SchemaRegistry, nil, o.Log.Named("schema"))
		if err != nil {
			return warnings, err
		}
		probs = append(probs, reg.Check(ctx, o.Config.Tables)...)
	}
	kprobs, kwarn, err := o.checkKafka(ctx)
	if err != nil {
		return warnings, err
	}
	probs, warnings = append(probs, kprobs...), append(warnings, kwarn...)
	if len(probs) > 0 {
		return warnings, &setup.CheckError{Problems: probs}
	}
	return warnings, nil
}

// checkKafka is Check's Kafka half: the brokers, the checkpoint topic,
// which the connector creates itself, and every topic that is not a
// template.
func (o *Ops) checkKafka(ctx context.Context) (probs, warnings []string, err error) {
	k, err := sink.New(o.Config.Producer(), o.Log.Named("kafka"), o.KafkaOpts...)
	if err != nil {
		return nil, nil, fmt.Errorf("kafka: %w", err)
	}
	defer k.Close()
	if err := k.Ping(ctx); err != nil {
		if unreachable(err) {
			// Nobody answers (yet): cdc run waits for the brokers.
			return nil, []string{fmt.Sprintf("kafka: %v; cdc run would wait for the brokers, retrying, but check kafka.brokers and that they are up", err)}, nil
		}
		// Refused credentials, TLS, not Kafka at all, a connection
		// closed on the connector: what cdc run stops or loops on.
		return []string{fmt.Sprintf("kafka: %v", err)}, nil, nil
	}
	check := func(topic string, mayCreate, compact bool) {
		if err := k.CheckTopic(ctx, topic, mayCreate, compact); err != nil {
			probs = append(probs, "kafka: "+err.Error())
		}
	}
	check(o.Config.Checkpoint.Topic, true, true)
	seen := map[string]bool{}
	for _, t := range o.Config.Tables {
		for _, topic := range t.FixedTopics() {
			if !seen[topic] {
				seen[topic] = true
				check(topic, o.Config.Kafka.Creates(), false)
			}
		}
	}
	return probs, nil, nil
}

// LoadRecord reads the pipeline's checkpoint for the operator commands,
// and returns the store it read it from.
func (o *Ops) LoadRecord(ctx context.Context, sys wal.System) (checkpoint.Record, *checkpoint.Store, error) {
	store, err := checkpoint.OpenStore(ctx, o.Config.Checkpoint.Topic, sink.ClientOpts(o.Config.Kafka, o.Log.Named("kafka")), o.Log.Named("checkpoint"))
	if err != nil {
		return checkpoint.Record{}, nil, err
	}
	store.SignWith(o.Config.Checkpoint.SigningKeys)
	o.store = store
	recs, err := store.Load(ctx, false)
	if err != nil {
		return checkpoint.Record{}, nil, err
	}
	rec, ok := recs[checkpoint.Key(o.Config.Postgres.Slot, sys.ID)]
	if !ok {
		return checkpoint.Record{}, nil, &errtext.Fatal{Msg: fmt.Sprintf("no checkpoint for slot %q of database system %s in topic %q: start the connector (cdc run) with this config first", o.Config.Postgres.Slot, sys.ID, o.Config.Checkpoint.Topic)}
	}
	return rec, store, nil
}

// SlotInfo is what Decide compares with the checkpoint.
func SlotInfo(conn *wal.Conn, slot setup.SlotState) checkpoint.SlotInfo {
	sys := conn.System()
	return checkpoint.SlotInfo{Exists: slot.Exists, Confirmed: slot.ConfirmedFlush, Timeline: sys.Timeline, WALEnd: sys.WALEnd, Address: conn.Address()}
}

// checkTakeover says what the role lacks to take over from a frozen holder
// ("" when nothing): seeing reply_time takes pg_read_all_stats.
func checkTakeover(ctx context.Context, cfg postgres.Config) string {
	conn, err := postgres.ConnectSQL(ctx, cfg)
	if err != nil {
		return ""
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var role string
	var ok bool
	err = conn.QueryRow(ctx, `SELECT current_user, pg_has_role(current_user, 'pg_read_all_stats', 'USAGE') OR rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&role, &ok)
	if err != nil || ok {
		return ""
	}
	return fmt.Sprintf("role %s cannot see when the slot's holder last spoke (pg_stat_replication.reply_time), so a standby takes over a frozen holder only after wal_sender_timeout (60 s by default), not after standby.takeover_after; run: GRANT pg_read_all_stats TO %s (or set standby.takeover_after: 0 to turn takeover off and silence this)", pgident.Quote(role), pgident.Quote(role))
}

// RequestBackfill is cdc backfill (backfill.Runner.Request) for the
// config's pipeline and its checkpoint.
func (o *Ops) RequestBackfill(ctx context.Context, t *outbox.Source, where string) (backfill.Requested, error) {
	load := func(ctx context.Context) (checkpoint.Record, *checkpoint.Store, error) {
		conn, err := wal.Connect(ctx, o.Config.Postgres, o.Log.Named("wal"))
		if err != nil {
			return checkpoint.Record{}, nil, err
		}
		sys := conn.System()
		conn.Close(context.WithoutCancel(ctx))
		return o.LoadRecord(ctx, sys)
	}
	return o.backfills().Request(ctx, o.Config.Checkpoint.SigningKeys, load, t, where)
}

// WatchBackfill follows job r, which RequestBackfill started, in the
// checkpoint topic, calling show with its state (zero until the pipeline
// started it) about once a second, until it is done or ctx ends. A job
// that ended on an error returns it.
func (o *Ops) WatchBackfill(ctx context.Context, r backfill.Requested, show func(checkpoint.Job)) (checkpoint.Job, error) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		recs, err := o.store.Load(ctx, false)
		if err != nil {
			return checkpoint.Job{}, err
		}
		var job checkpoint.Job
		if rec, ok := recs[r.Key]; ok {
			if j := rec.FindBackfill(r.ID); j != nil {
				job = *j
			}
		}
		show(job)
		if job.Done() {
			if job.Error != "" {
				return job, fmt.Errorf("backfill %s of %s failed: %s", job.ID, job.Table, job.Error)
			}
			return job, nil
		}
		select {
		case <-ctx.Done():
			return job, ctx.Err()
		case <-t.C:
		}
	}
}
