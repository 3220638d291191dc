// Package metrics defines the connector's Prometheus metrics; docs/metrics.md
// lists each with its meaning. The pipeline updates them; nothing here reads
// Postgres or Kafka.
//
// Invariants:
//   - Metric names and labels are an interface that dashboards and alerts
//     depend on: change them only with docs/metrics.md and the examples.
//   - Every series carries pipeline="<name>" (PipelineLabel), one value a
//     process.
//   - Label values are bounded by the configuration: a source is a
//     configured table or message prefix, a topic one its template yields.
//   - Updating a metric on the per-event path allocates nothing: callers
//     resolve a labelled child once (EventCounter) and keep it.
package metrics

import (
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Metrics are the connector's collectors.
type Metrics struct {
	Registry *prometheus.Registry

	events         *prometheus.CounterVec
	filtered       *prometheus.CounterVec
	deadLetters    *prometheus.CounterVec
	backfillRows   *prometheus.CounterVec
	InvalidEvents  prometheus.Counter
	LagBytes       prometheus.Gauge
	RetainedWAL    prometheus.Gauge
	ReplayRetained prometheus.Gauge
	slotWALStatus  *prometheus.GaugeVec
	ConfirmedLSN   prometheus.Gauge
	CommitToAck    prometheus.Histogram
	Behind         prometheus.Gauge
	EventAge       prometheus.Histogram
	InFlight       prometheus.Gauge
	Restarts       prometheus.Counter
	ProduceErrors  prometheus.Counter
	Streaming      prometheus.Gauge
	WindowsLost    prometheus.Counter
	Checkpoints    prometheus.Counter
	// ForgedRequests counts backfill requests whose signature did not
	// verify; ForeignRecords records in the checkpoint topic that are not
	// checkpoints the connector could read.
	ForgedRequests prometheus.Counter
	ForeignRecords prometheus.Counter
	// RefusedRequests counts the operator requests (announcements) the one
	// way in refused, by kind: forged, replayed, stale, unknown.
	RefusedRequests *prometheus.CounterVec
	// ProduceRequests counts produce requests written to brokers: events
	// per request shows how well batching works.
	ProduceRequests prometheus.Counter
	// SchemaLookups counts lookups of a schema by result (SchemaResults);
	// schemaInvalid events that did not match their schema, by source.
	SchemaLookups *prometheus.CounterVec
	schemaInvalid *prometheus.CounterVec
	// The outbox tables' lives (docs/design.md, "Table changes"):
	// inserts into published relations no table maps, by relation;
	// repairs of a table recreated or added back to the publication; and
	// configured tables that do not exist at the moment.
	unmapped     *prometheus.CounterVec
	tableRepairs *prometheus.CounterVec
	tableMissing *prometheus.GaugeVec
	tableRenamed *prometheus.GaugeVec
	// ParkedKeys is how many keys on_invalid: park holds back.
	ParkedKeys   prometheus.Gauge
	parkedEvents *prometheus.CounterVec
	// CatalogChecked is when the tables' watch last compared the catalog
	// with what the session streams, without an error.
	CatalogChecked prometheus.Gauge
	// unmappedNamed are the relations cdc_unmapped_relation_changes_total
	// has a series of its own for (at most MaxUnmappedRelations).
	unmappedMu    sync.Mutex
	unmappedNamed map[string]bool
	// StandbyDelay is cdc_standby_replay_delay_seconds.
	StandbyDelay prometheus.Gauge
	// Retention (internal/retention), by table.
	retentionDeleted *prometheus.CounterVec
	retentionDropped *prometheus.CounterVec
	retentionLastRun *prometheus.GaugeVec
	retentionErrors  *prometheus.CounterVec
}

// SchemaResults are the values of cdc_schema_lookups_total's result label:
// a schema found in the cache, read from the registry, registered by the
// connector, missing from the registry, or a registry that failed.
var SchemaResults = []string{"cached", "fetched", "registered", "not_found", "error"}

// PipelineLabel is the label every series carries: the pipeline's name
// (config.Config.Name, the slot's name by default).
const PipelineLabel = "pipeline"

// WALStatuses are the values of pg_replication_slots.wal_status.
var WALStatuses = []string{"reserved", "extended", "unreserved", "lost"}

// latencyBuckets span a millisecond to two minutes: a healthy connector
// acks in milliseconds, a stalled broker in minutes.
var latencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}

// New registers the collectors, and Go's and the process's, on a new
// registry. Every series carries the label pipeline="<pipeline>", so that
// one dashboard and one set of alerts serve a fleet of connectors, one per
// database (docs/metrics.md).
func New(pipeline string) *Metrics {
	reg := prometheus.NewRegistry()
	labelled := prometheus.WrapRegistererWith(prometheus.Labels{PipelineLabel: pipeline}, reg)
	f := func(c prometheus.Collector) { labelled.MustRegister(c) }
	m := &Metrics{Registry: reg}
	m.events = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cdc_events_total",
		Help: "Events Kafka acknowledged, by source (table or message prefix) and topic."}, []string{"source", "topic"})
	m.filtered = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cdc_events_filtered_total",
		Help: "Events the table's filter left out (not sent, and handled: their transaction is confirmed with the others), by table."}, []string{"table"})
	m.deadLetters = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cdc_dead_letters_total",
		Help: "Invalid events written to a dead-letter topic, by source."}, []string{"source"})
	m.backfillRows = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cdc_backfill_rows_total",
		Help: "Rows a backfill read and handed to the stream (those a filter left out too), by table."}, []string{"table"})
	m.InvalidEvents = prometheus.NewCounter(prometheus.CounterOpts{Name: "cdc_invalid_events_total",
		Help: "Events that could not be delivered as configured (dead-lettered, or stopping the connector)."})
	m.LagBytes = prometheus.NewGauge(prometheus.GaugeOpts{Name: "cdc_lag_bytes",
		Help: "The server's WAL end minus the slot's confirmed position, in bytes."})
	m.RetainedWAL = prometheus.NewGauge(prometheus.GaugeOpts{Name: "cdc_retained_wal_bytes",
		Help: "WAL the slot keeps on the server's disk (WAL end minus restart_lsn), in bytes."})
	m.ReplayRetained = prometheus.NewGauge(prometheus.GaugeOpts{Name: "cdc_replay_retained_wal_bytes",
		Help: "WAL the replay window's slot keeps, in bytes; 0 without a window."})
	m.slotWALStatus = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "cdc_slot_wal_status",
		Help: "1 for the slot's wal_status (reserved, extended, unreserved, lost), 0 for the others."}, []string{"status"})
	m.ConfirmedLSN = prometheus.NewGauge(prometheus.GaugeOpts{Name: "cdc_confirmed_lsn",
		Help: "The slot's confirmed_flush_lsn, as a number."})
	m.CommitToAck = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "cdc_commit_to_ack_seconds",
		Help: "From an event's commit in Postgres to Kafka's acknowledgement.", Buckets: latencyBuckets})
	m.Behind = prometheus.NewGauge(prometheus.GaugeOpts{Name: "cdc_behind_seconds",
		Help: "Age of the oldest commit not yet acknowledged by Kafka; 0 when caught up."})
	m.EventAge = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "cdc_event_age_seconds",
		Help: "Kafka's acknowledgement minus the event's own timestamp field (for tables that map one).", Buckets: latencyBuckets})
	m.InFlight = prometheus.NewGauge(prometheus.GaugeOpts{Name: "cdc_in_flight_records",
		Help: "Records sent to Kafka and not yet acknowledged."})
	m.Restarts = prometheus.NewCounter(prometheus.CounterOpts{Name: "cdc_restarts_total",
		Help: "Sessions that ended on a transient error and were restarted."})
	m.ProduceErrors = prometheus.NewCounter(prometheus.CounterOpts{Name: "cdc_kafka_produce_errors_total",
		Help: "Records Kafka refused or failed (each ends its session; nothing is skipped)."})
	m.Streaming = prometheus.NewGauge(prometheus.GaugeOpts{Name: "cdc_streaming",
		Help: "1 while this instance holds the slot and streams, 0 otherwise (a standby, reconnecting, stopped)."})
	m.WindowsLost = prometheus.NewCounter(prometheus.CounterOpts{Name: "cdc_replay_windows_lost_total",
		Help: "Replay windows lost because Postgres invalidated the replay slot."})
	m.Checkpoints = prometheus.NewCounter(prometheus.CounterOpts{Name: "cdc_checkpoints_total",
		Help: "Checkpoints written to the checkpoint topic and acknowledged."})
	m.ForgedRequests = prometheus.NewCounter(prometheus.CounterOpts{Name: "cdc_backfill_requests_refused_total",
		Help: "Backfill requests ignored because their signature did not verify (not written by cdc backfill with checkpoint.signing_key_file's key)."})
	m.RefusedRequests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cdc_requests_refused_total",
		Help: "Announced operator requests refused (not signed, too old, taken already, unknown), by kind (backfill, redrive); past a few a minute the log has a summary, not a line each."}, []string{"kind"})
	m.ForeignRecords = prometheus.NewCounter(prometheus.CounterOpts{Name: "cdc_checkpoint_foreign_records_total",
		Help: "Records in the checkpoint topic the connector did not write (not a checkpoint it can read), skipped."})
	m.ProduceRequests = prometheus.NewCounter(prometheus.CounterOpts{Name: "cdc_kafka_produce_requests_total",
		Help: "Produce requests written to the brokers (events, dead letters and checkpoints together)."})
	m.SchemaLookups = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cdc_schema_lookups_total",
		Help: "Schema lookups for tables with a registry schema, by result: cached, fetched, registered, not_found, error."}, []string{"result"})
	m.schemaInvalid = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cdc_schema_invalid_total",
		Help: "Events whose payload did not match their schema (dead-lettered, or stopping the connector), by source."}, []string{"source"})
	m.newTableMetrics()
	m.StandbyDelay = prometheus.NewGauge(prometheus.GaugeOpts{Name: "cdc_standby_replay_delay_seconds",
		Help: "On a hot standby (postgres.url), how long ago the last transaction it replayed committed on the primary: while the primary writes, how far the standby's replay, and so the stream, is behind it. 0 on a primary."})
	m.retentionDeleted = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cdc_retention_rows_deleted_total",
		Help: "Outbox rows retention deleted (delivered, and older than retention.after), by table."}, []string{"table"})
	m.retentionDropped = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cdc_retention_partitions_dropped_total",
		Help: "Partitions retention detached and dropped (mode drop_partitions), by table."}, []string{"table"})
	m.retentionLastRun = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "cdc_retention_last_run_timestamp_seconds",
		Help: "When retention last swept the table without an error (unix seconds), by table."}, []string{"table"})
	m.retentionErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cdc_retention_errors_total",
		Help: "Retention sweeps of the table that failed (the log says why; the next one tries again), by table."}, []string{"table"})
	for _, c := range []prometheus.Collector{m.StandbyDelay, m.retentionDeleted, m.retentionDropped, m.retentionLastRun, m.retentionErrors, m.unmapped, m.tableRepairs, m.tableMissing, m.tableRenamed, m.CatalogChecked, m.ParkedKeys, m.parkedEvents, m.SchemaLookups, m.schemaInvalid, m.ProduceRequests, m.events, m.filtered, m.deadLetters, m.InvalidEvents, m.LagBytes, m.RetainedWAL, m.ReplayRetained,
		m.slotWALStatus, m.ConfirmedLSN, m.CommitToAck, m.Behind, m.EventAge, m.InFlight, m.Restarts, m.ProduceErrors,
		m.Streaming, m.WindowsLost, m.Checkpoints, m.backfillRows, m.ForgedRequests, m.RefusedRequests, m.ForeignRecords,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		f(c)
	}
	return m
}

// newTableMetrics makes the metrics of the outbox tables' lives and of
// parked keys.
func (m *Metrics) newTableMetrics() {
	m.unmapped = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cdc_unmapped_relation_changes_total",
		Help: "Inserts into a relation of the publication that no configured table maps (not events; the log names the first of each relation), by relation: the first 32 relations have a series each, the others count under relation=\"(others)\"."}, []string{"relation"})
	m.tableRepairs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cdc_table_repairs_total",
		Help: "Outbox tables found dropped and created again, or added back to the publication, whose unstreamed rows the connector sent, by table."}, []string{"table"})
	m.tableMissing = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "cdc_table_missing",
		Help: "1 while a configured outbox table does not exist (dropped or renamed), 0 otherwise, by table."}, []string{"table"})
	m.ParkedKeys = prometheus.NewGauge(prometheus.GaugeOpts{Name: "cdc_parked_keys",
		Help: "Keys on_invalid: park holds back now: an invalid event parked each, and the key's later events follow it to the parked topic until cdc redrive sends them on."})
	m.parkedEvents = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cdc_parked_events_total",
		Help: "Events sent to a parked topic (the invalid ones that parked their key, and those behind them), by table."}, []string{"table"})
	m.CatalogChecked = prometheus.NewGauge(prometheus.GaugeOpts{Name: "cdc_catalog_checked_timestamp_seconds",
		Help: "When the tables' watch last compared the catalog with what the session streams, without an error (unix seconds): every postgres.catalog_check_interval while streaming."})
	m.tableRenamed = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "cdc_table_renamed",
		Help: "1 while the relation a configured outbox table streams has another name than the configuration's (renamed: the connector follows it, across restarts too; set tables[].name), 0 otherwise, by table."}, []string{"table"})
}

// Source is a configured source, for Init: its name, the topics it is
// known to write to (its static topic and dead-letter topic, not a
// template's), and whether it is a table (backfills count rows of tables).
type Source struct {
	Name   string
	Topics []string
	Table  bool
	Schema bool // its payload has a registry schema
	Park   bool // on_invalid: park
}

// Init creates every labelled series the configuration makes known, at 0,
// so that an alert on increase() or absent() has a series to watch before
// the first event, dead letter or backfilled row.
func (m *Metrics) Init(sources []Source) {
	for _, s := range sources {
		if s.Schema {
			m.schemaInvalid.WithLabelValues(s.Name)
			for _, r := range SchemaResults {
				m.SchemaLookups.WithLabelValues(r)
			}
		}
		m.deadLetters.WithLabelValues(s.Name)
		m.filtered.WithLabelValues(s.Name)
		if s.Park {
			m.parkedEvents.WithLabelValues(s.Name)
		}
		for _, t := range s.Topics {
			m.events.WithLabelValues(s.Name, t)
		}
		if s.Table {
			m.backfillRows.WithLabelValues(s.Name)
			m.tableRepairs.WithLabelValues(s.Name)
			m.tableMissing.WithLabelValues(s.Name)
			m.tableRenamed.WithLabelValues(s.Name)
		}
	}
}

// EventCounter is cdc_events_total for one source and topic; keep it.
func (m *Metrics) EventCounter(source, topic string) prometheus.Counter {
	return m.events.WithLabelValues(source, topic)
}

// EventCounters keeps cdc_events_total's children by source and topic, so
// that the per-event path looks one up without building its label values
// (source.String() runs once per source and topic). The zero value is
// ready; it is not safe for concurrent use.
type EventCounters struct {
	c map[eventKey]prometheus.Counter
}

type eventKey struct {
	source fmt.Stringer // compared as the configured source's pointer
	topic  string
}

// Get returns source's and topic's counter from m.
func (e *EventCounters) Get(m *Metrics, source fmt.Stringer, topic string) prometheus.Counter {
	k := eventKey{source, topic}
	c, ok := e.c[k]
	if !ok {
		if e.c == nil {
			e.c = map[eventKey]prometheus.Counter{}
		}
		c = m.EventCounter(source.String(), topic)
		e.c[k] = c
	}
	return c
}

// Filtered is cdc_events_filtered_total for table; keep it.
func (m *Metrics) Filtered(table string) prometheus.Counter {
	return m.filtered.WithLabelValues(table)
}

// BackfillRows is cdc_backfill_rows_total for table.
func (m *Metrics) BackfillRows(table string) prometheus.Counter {
	return m.backfillRows.WithLabelValues(table)
}

// SchemaInvalid counts one event of source that did not match its schema.
func (m *Metrics) SchemaInvalid(source string) { m.schemaInvalid.WithLabelValues(source).Inc() }

// DeadLetter counts one dead-lettered event of source.
func (m *Metrics) DeadLetter(source string) { m.deadLetters.WithLabelValues(source).Inc() }

// MaxUnmappedRelations bounds cdc_unmapped_relation_changes_total's
// series: a role that may create tables in a FOR ALL TABLES or schema
// publication could otherwise make series without end.
const MaxUnmappedRelations = 32

// UnmappedOthers is the relation label of the unmapped inserts past
// MaxUnmappedRelations relations.
const UnmappedOthers = "(others)"

// Unmapped counts one insert into relation, which no table maps.
func (m *Metrics) Unmapped(relation string) {
	m.unmappedMu.Lock()
	if !m.unmappedNamed[relation] {
		if m.unmappedNamed == nil {
			m.unmappedNamed = map[string]bool{}
		}
		if len(m.unmappedNamed) < MaxUnmappedRelations {
			m.unmappedNamed[relation] = true
		} else {
			relation = UnmappedOthers
		}
	}
	m.unmappedMu.Unlock()
	m.unmapped.WithLabelValues(relation).Inc()
}

// Parked counts one event of source sent to its parked topic, with keys
// parked now.
func (m *Metrics) Parked(source string, keys int) {
	m.parkedEvents.WithLabelValues(source).Inc()
	m.ParkedKeys.Set(float64(keys))
}

// TableRenamed sets whether table's relation has another name than the
// configuration's.
func (m *Metrics) TableRenamed(table string, renamed bool) {
	v := 0.0
	if renamed {
		v = 1
	}
	m.tableRenamed.WithLabelValues(table).Set(v)
}

// RetentionDeleted counts n rows retention deleted from table.
func (m *Metrics) RetentionDeleted(table string, n int64) {
	m.retentionDeleted.WithLabelValues(table).Add(float64(n))
}

// RetentionDropped counts one partition of table retention dropped.
func (m *Metrics) RetentionDropped(table string) { m.retentionDropped.WithLabelValues(table).Inc() }

// RetentionRan records a sweep of table that ended without an error at.
func (m *Metrics) RetentionRan(table string, at time.Time) {
	m.retentionLastRun.WithLabelValues(table).Set(float64(at.Unix()))
}

// RetentionError counts a failed sweep of table.
func (m *Metrics) RetentionError(table string) { m.retentionErrors.WithLabelValues(table).Inc() }

// TableRepaired counts one repair of table.
func (m *Metrics) TableRepaired(table string) { m.tableRepairs.WithLabelValues(table).Inc() }

// TableMissing sets cdc_table_missing for table.
func (m *Metrics) TableMissing(table string, missing bool) {
	v := 0.0
	if missing {
		v = 1
	}
	m.tableMissing.WithLabelValues(table).Set(v)
}

// SetWALStatus sets cdc_slot_wal_status to status.
func (m *Metrics) SetWALStatus(status string) {
	for _, s := range WALStatuses {
		v := 0.0
		if s == status {
			v = 1
		}
		m.slotWALStatus.WithLabelValues(s).Set(v)
	}
}

// KafkaHook is a franz-go hook (kgo.WithHooks) that counts produce
// requests in cdc_kafka_produce_requests_total.
func (m *Metrics) KafkaHook() kgo.Hook { return produceRequestHook{m.ProduceRequests} }

type produceRequestHook struct{ c prometheus.Counter }

// OnBrokerWrite implements kgo.HookBrokerWrite.
func (h produceRequestHook) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == 0 && err == nil { // 0: Produce
		h.c.Inc()
	}
}
