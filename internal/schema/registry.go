package schema

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/metrics"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/secret"
)

// Header names of the schema ids with schema.id_in: header.
const (
	HeaderSchemaID    = "schema_id"
	HeaderKeySchemaID = "key_schema_id"
)

// contentType is the media type of a value in format, where it is no
// longer JSON.
var contentType = map[string][]byte{
	outbox.SchemaAvro:     []byte("application/avro"),
	outbox.SchemaProtobuf: []byte("application/x-protobuf"),
}

// entry is one subject's schema, as cached.
type entry struct {
	subject string
	version int // the registry's version
	id      int
	idText  []byte // id in decimal, for the header
	codec   codec
	// fresh: read from the registry for the event at hand, and not used
	// since. An event that does not fit a schema that is not fresh makes
	// the latest be read again before the event is judged.
	fresh bool
}

// sourceCache is one source's entries: value entries by topic ("" with the
// record strategy) and event type ("" with the topic strategy), key
// entries by topic. Keyed so that a lookup builds no string.
type sourceCache struct {
	value   map[string]map[string]*entry
	key     map[string]*entry
	entries int // entries stored, at most maxCachedSubjects
}

// maxCachedSubjects bounds a source's cache, as route bounds its topics.
const maxCachedSubjects = 4096

// Registry encodes payloads against the registry's schemas. Encode and
// Resolve are called from the replication loop, one at a time; the
// registry's metrics may be read concurrently.
type Registry struct {
	cfg     Config
	cl      *sr.Client
	log     hclog.Logger
	lookups [5]prometheus
	invalid func(source string)

	mu      sync.Mutex // guards sources against cdc check's Check
	sources map[*outbox.Source]*sourceCache
	codecs  map[codecKey]codec // by id: subjects that share a schema share its codec
	// missing is when the registry first said each subject does not
	// exist, for MissingAfter; a subject it gives is forgotten.
	missing map[string]time.Time
}

type codecKey struct {
	id      int
	format  string
	message string
}

// prometheus is the one method of a counter used here.
type prometheus interface{ Inc() }

// New returns a Registry for cfg (validated), counting into m (nil: not
// counted) and logging to log.
func New(cfg Config, m *metrics.Metrics, log hclog.Logger) (*Registry, error) {
	opts := []sr.ClientOpt{sr.URLs(cfg.URL), sr.UserAgent("outbox-cdc"), sr.PreReq(cfg.authorize)}
	hc := &http.Client{Timeout: cfg.Timeout}
	if cfg.TLS.Enabled {
		tc, err := cfg.TLS.Build("schema_registry.tls")
		if err != nil {
			return nil, err
		}
		hc.Transport = &http.Transport{TLSClientConfig: tc, Proxy: http.ProxyFromEnvironment}
	}
	opts = append(opts, sr.HTTPClient(hc))
	cl, err := sr.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("schema_registry: %v", err)
	}
	if log == nil {
		log = hclog.NewNullLogger()
	}
	r := &Registry{cfg: cfg, cl: cl, log: log, sources: map[*outbox.Source]*sourceCache{}, codecs: map[codecKey]codec{}, invalid: func(string) {}, missing: map[string]time.Time{}}
	for i := range r.lookups {
		r.lookups[i] = nop{}
	}
	if m != nil {
		for i, res := range metrics.SchemaResults {
			r.lookups[i] = m.SchemaLookups.WithLabelValues(res)
		}
		r.invalid = m.SchemaInvalid
	}
	return r, nil
}

type nop struct{}

func (nop) Inc() {}

// The indexes of metrics.SchemaResults.
const (
	resCached = iota
	resFetched
	resRegistered
	resNotFound
	resError
)

// authorize sets the request's credentials, read from their files now, so
// that a rotated secret is used without a restart.
func (c Config) authorize(req *http.Request) error {
	switch {
	case c.TokenFile != "":
		tok, err := secret.Read(c.TokenFile)
		if err != nil {
			return fmt.Errorf("schema_registry.token_file: %v", err)
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	case c.Username != "":
		pass := c.Password
		if c.PasswordFile != "" {
			p, err := secret.Read(c.PasswordFile)
			if err != nil {
				return fmt.Errorf("schema_registry.basic_auth.password_file: %v", err)
			}
			pass = p
		}
		req.SetBasicAuth(c.Username, pass)
	}
	return nil
}

// Miss says that Encode needs a schema it has not cached, or wants the
// latest one re-read before judging an event. Resolve fetches it.
type Miss struct {
	table   *outbox.Source
	subject string
	topic   string
	typ     string // event type, for the record strategies
	key     bool
	recheck *entry // the entry the event did not fit
}

func (m *Miss) Error() string {
	return fmt.Sprintf("schema of subject %q not cached", m.subject)
}

// Encode checks rec's value (and, with schema.key, its key) against ev's
// schema and replaces it with its wire form. It returns a *Miss when a
// schema must be fetched first, and an *outbox.EventError when the payload
// does not match. Sources without a registry schema pass untouched.
func (r *Registry) Encode(rec *kgo.Record, ev *outbox.Event) error {
	sc := &ev.Source.Schema
	if r == nil || !sc.Registered() {
		return nil
	}
	if rec.Value == nil {
		return nil // a tombstone: nothing to encode
	}
	var typ []byte
	if sc.Subject != outbox.SubjectTopic {
		if typ = ev.Fields[outbox.FieldEventType].B; len(typ) == 0 {
			return outbox.Invalid(ev, "schema.subject %s names the subject after the event type, which is empty", sc.Subject)
		}
	}
	r.mu.Lock()
	sch := r.sources[ev.Source]
	var e, ke *entry
	if sch != nil {
		e = sch.value[valueTopic(sc, rec.Topic)][string(typ)]
		if sc.Key {
			ke = sch.key[rec.Topic]
		}
	}
	r.mu.Unlock()
	if e == nil {
		return &Miss{table: ev.Source, subject: subject(sc, rec.Topic, string(typ), false), topic: rec.Topic, typ: string(typ)}
	}
	if sc.Key && ke == nil {
		return &Miss{table: ev.Source, subject: subject(sc, rec.Topic, "", true), topic: rec.Topic, key: true}
	}
	value, err := r.frame(e, sc, rec.Value)
	if err != nil {
		return r.mismatch(e, ev, rec.Topic, string(typ), false, err)
	}
	var key []byte
	if ke != nil {
		doc, _ := json.Marshal(string(rec.Key))
		if sc.IDIn == outbox.IDInHeader {
			err = ke.codec.check(doc)
			key = rec.Key
		} else {
			key, err = r.frame(ke, sc, doc)
		}
		if err != nil {
			return r.mismatch(ke, ev, rec.Topic, "", true, err)
		}
	}
	rec.Value = value
	e.fresh = false
	if ct := contentType[sc.Format]; ct != nil && ev.Source.Format == outbox.FormatCloudEventsBinary {
		for i := range rec.Headers {
			if rec.Headers[i].Key == "content-type" {
				rec.Headers[i].Value = ct // CloudEvents' datacontenttype: what data now is
			}
		}
	}
	if sc.IDIn == outbox.IDInHeader {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: HeaderSchemaID, Value: e.idText})
	}
	if ke != nil {
		rec.Key = key
		ke.fresh = false
		if sc.IDIn == outbox.IDInHeader {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: HeaderKeySchemaID, Value: ke.idText})
		}
	}
	r.lookups[resCached].Inc()
	return nil
}

// frame is doc in e's wire form: with the id in a prefix, Confluent's
// framing (a zero byte, the id big-endian, and protobuf's message
// indexes) before the encoded bytes; with the id in a header, doc as
// written, once checked.
func (r *Registry) frame(e *entry, sc *outbox.Schema, doc []byte) ([]byte, error) {
	if sc.IDIn == outbox.IDInHeader {
		return doc, e.codec.check(doc)
	}
	var h sr.ConfluentHeader
	b, err := h.AppendEncode(make([]byte, 0, 5+8+len(doc)), e.id, e.codec.index())
	if err != nil {
		return nil, err
	}
	return e.codec.append(b, doc)
}

// mismatch is what an event whose value (or key) does not fit e gets: a
// re-read of the latest schema first, if e may be stale (keys always take
// the latest); else the invalid event's error.
func (r *Registry) mismatch(e *entry, ev *outbox.Event, topic, typ string, key bool, err error) error {
	what := "payload"
	if key {
		what = "key"
	}
	if (ev.Source.Schema.Version == 0 || key) && !e.fresh {
		return &Miss{table: ev.Source, subject: e.subject, topic: topic, typ: typ, key: key, recheck: e}
	}
	e.fresh = false
	r.invalid(ev.Source.String())
	return outbox.Invalid(ev, "its %s does not match schema subject %q version %d (id %d): %s", what, e.subject, e.version, e.id, errtext.OneLine(err))
}

// valueTopic is the topic part of a value entry's cache key.
func valueTopic(sc *outbox.Schema, topic string) string {
	if sc.Subject == outbox.SubjectRecord {
		return ""
	}
	return topic
}

// subject names the subject by sc's strategy. Keys always follow the
// topic strategy.
func subject(sc *outbox.Schema, topic, typ string, key bool) string {
	switch {
	case key:
		return topic + "-key"
	case sc.Subject == outbox.SubjectRecord:
		return typ
	case sc.Subject == outbox.SubjectTopicRecord:
		return topic + "-" + typ
	}
	return topic + "-value"
}

// LookupError is a schema the registry could not give: it is down, or
// has no such subject, or holds a schema that does not compile. The
// session retries it; nothing is dead-lettered for it.
type LookupError struct {
	Subject string
	Msg     string
	Err     error
}

func (e *LookupError) Error() string { return e.Msg }
func (e *LookupError) Unwrap() error { return e.Err }

// RefusedError is the registry refusing the connector rather than failing
// it: its credentials (401, 403), or the schema auto_register offers
// (422 invalid, 409 incompatible). Waiting does not change it: the
// connector stops with what to fix.
type RefusedError struct{ Msg string }

func (e *RefusedError) Error() string { return e.Msg }

// missingError is a subject the registry has said it does not have for
// longer than MissingAfter: Apply makes the event invalid.
type missingError struct {
	subject string
	since   time.Duration
	err     error
}

func (e *missingError) Error() string { return e.err.Error() }

// Resolve fetches what m misses and caches it. It may block on the
// registry for up to schema_registry.timeout.
func (r *Registry) Resolve(ctx context.Context, m *Miss) error {
	sc := &m.table.Schema
	e, err := r.fetch(ctx, sc, m.subject, m.key, true)
	if err != nil {
		// Also on a recheck: the registry cannot say whether a newer
		// schema exists, so the event can be judged neither valid nor
		// invalid. It waits.
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	sch := r.sources[m.table]
	if sch == nil || sch.entries >= maxCachedSubjects {
		// Topics and event types come from the rows: a source whose
		// subjects keep changing starts its cache over rather than grow
		// it without bound (the registry is asked again on a miss).
		sch = &sourceCache{value: map[string]map[string]*entry{}, key: map[string]*entry{}}
		r.sources[m.table] = sch
	}
	sch.entries++
	if m.key {
		sch.key[m.topic] = e
		return nil
	}
	vt := valueTopic(sc, m.topic)
	if sch.value[vt] == nil {
		sch.value[vt] = map[string]*entry{}
	}
	sch.value[vt][m.typ] = e
	return nil
}

var errNotFound = errors.New("not found")

// fetch reads subject's schema (sc's pinned version, or the latest) and
// compiles it; with auto_register (and register), it registers
// schema.file under a subject that has none.
func (r *Registry) fetch(ctx context.Context, sc *outbox.Schema, subject string, key, register bool) (*entry, error) {
	version := sc.Version
	if version == 0 || key {
		version = -1
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	ss, err := r.cl.SchemaByVersion(ctx, subject, version)
	res := resFetched
	var re *sr.ResponseError
	if errors.As(err, &re) && sr.IsNotFoundError(re.ErrorCode) && r.cfg.AutoRegister && sc.File != "" && !key && register {
		text, rerr := os.ReadFile(sc.File)
		if rerr != nil {
			return nil, &LookupError{Subject: subject, Msg: fmt.Sprintf("schema registry has no subject %q, and tables[].schema.file cannot be read to register it: %v", subject, rerr), Err: rerr}
		}
		ss, err = r.cl.CreateSchema(ctx, subject, sr.Schema{Schema: string(text), Type: registryType(sc.Format)})
		res = resRegistered
	}
	if err != nil {
		if errors.As(err, &re) && (re.StatusCode == http.StatusUnauthorized || re.StatusCode == http.StatusForbidden) {
			r.lookups[resError].Inc()
			return nil, &RefusedError{Msg: fmt.Sprintf("schema registry %s refuses the connector's credentials (HTTP %d, error code %d: %s) looking up subject %q; fix schema_registry.basic_auth or token_file, and its rights on the subject",
				r.cfg.URL, re.StatusCode, re.ErrorCode, errtext.OneLine(re), subject)}
		}
		if errors.As(err, &re) && res == resRegistered && (re.StatusCode == http.StatusConflict || re.StatusCode == http.StatusUnprocessableEntity) {
			r.lookups[resError].Inc()
			why := "is not a valid schema to it"
			if re.StatusCode == http.StatusConflict {
				why = "is incompatible with the subject's compatibility level"
			}
			return nil, &RefusedError{Msg: fmt.Sprintf("schema registry %s refuses to register tables[].schema.file %s under subject %q: it %s (HTTP %d, error code %d: %s); fix the file, or register the schema yourself",
				r.cfg.URL, sc.File, subject, why, re.StatusCode, re.ErrorCode, errtext.OneLine(re))}
		}
		if errors.As(err, &re) && sr.IsNotFoundError(re.ErrorCode) {
			r.lookups[resNotFound].Inc()
			what := fmt.Sprintf("schema registry has no subject %q", subject)
			if version > 0 {
				what = fmt.Sprintf("schema registry has no version %d of subject %q", version, subject)
			}
			return nil, &LookupError{Subject: subject, Err: errNotFound, Msg: fmt.Sprintf("%s (%s); register the schema under it (or set schema_registry.auto_register and tables[].schema.file)", what, errtext.OneLine(err))}
		}
		r.lookups[resError].Inc()
		cause := err
		var ue *url.Error
		if errors.As(err, &ue) {
			cause = ue.Err // the URL is said once, below
		}
		return nil, &LookupError{Subject: subject, Err: err, Msg: fmt.Sprintf("schema registry %s: look up subject %q: %s", r.cfg.URL, subject, errtext.OneLine(cause))}
	}
	if got, want := ss.Type, registryType(sc.Format); got != want {
		r.lookups[resError].Inc()
		return nil, &LookupError{Subject: subject, Msg: fmt.Sprintf("schema registry: subject %q version %d is a %s schema, and the table's schema is %s; register a %s schema under it, or change tables[].schema", subject, ss.Version, got, sc.Format, want)}
	}
	if len(ss.References) > 0 {
		r.lookups[resError].Inc()
		return nil, &LookupError{Subject: subject, Msg: fmt.Sprintf("schema registry: subject %q version %d references other schemas, which the connector does not resolve yet; register it self-contained", subject, ss.Version)}
	}
	message := sc.Message
	if key {
		message = ""
	}
	ck := codecKey{id: ss.ID, format: sc.Format, message: message}
	r.mu.Lock()
	c := r.codecs[ck]
	r.mu.Unlock()
	if c == nil {
		if c, err = compile(sc.Format, ss.Schema.Schema, message); err != nil {
			r.lookups[resError].Inc()
			return nil, &LookupError{Subject: subject, Err: err, Msg: fmt.Sprintf("schema registry: subject %q version %d (id %d) does not compile as %s: %s; fix it in the registry", subject, ss.Version, ss.ID, sc.Format, errtext.OneLine(err))}
		}
		r.mu.Lock()
		if len(r.codecs) >= maxCachedSubjects {
			clear(r.codecs) // compiled again on their next fetch
		}
		r.codecs[ck] = c
		r.mu.Unlock()
	}
	r.lookups[res].Inc()
	return &entry{subject: subject, version: ss.Version, id: ss.ID, idText: strconv.AppendInt(nil, int64(ss.ID), 10), codec: c, fresh: true}, nil
}

// Apply is Encode with its misses resolved: each through wait (the
// session's blocking path, which keeps the slot's lease), then Encode
// again. A lookup that fails is retried there, with a backoff, until it
// succeeds or ctx ends: the event waits, the transaction it is in stays
// open, so nothing past it is confirmed, and nothing is dead-lettered for
// the registry.
func (r *Registry) Apply(ctx context.Context, rec *kgo.Record, ev *outbox.Event, wait func(func() error) error) error {
	err := r.Encode(rec, ev)
	if err == nil {
		return nil // the per-event path: nothing escapes, nothing allocated
	}
	for range 4 { // a value, a key, and a recheck of each
		m, ok := err.(*Miss)
		if !ok {
			return err
		}
		if err := wait(func() error { return r.resolveRetrying(ctx, m) }); err != nil {
			var me *missingError
			if errors.As(err, &me) {
				r.invalid(ev.Source.String())
				return outbox.Invalid(ev, "%s, for %s now (schema_registry.missing_subject_after %s): register the subject, and the next such event goes through", errtext.OneLine(me.err), me.since.Round(time.Second), r.cfg.MissingAfter)
			}
			return err
		}
		err = r.Encode(rec, ev)
	}
	return err
}

// Backoff of resolveRetrying.
const (
	retryFirst = 100 * time.Millisecond
	retryMax   = 5 * time.Second
	// retryLogEvery is how often a lookup still failing is logged again.
	retryLogEvery = time.Minute
)

func (r *Registry) resolveRetrying(ctx context.Context, m *Miss) error {
	var since, logged time.Time
	for delay := retryFirst; ; delay = min(2*delay, retryMax) {
		err := r.Resolve(ctx, m)
		if err == nil {
			r.mu.Lock()
			delete(r.missing, m.subject)
			r.mu.Unlock()
			if !since.IsZero() {
				r.log.Info("schema registry answered; streaming again", "subject", m.subject, "waited", time.Since(since).Round(time.Millisecond).String())
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.As(err, new(*RefusedError)) {
			return err
		}
		now := time.Now()
		if since.IsZero() {
			since = now
		}
		if errors.Is(err, errNotFound) {
			// The registry answers, and says the subject does not
			// exist: for longer than MissingAfter that is this event's
			// problem, not a reason to hold every table.
			r.mu.Lock()
			first, ok := r.missing[m.subject]
			if !ok {
				if len(r.missing) >= maxCachedSubjects {
					clear(r.missing)
				}
				first = now
				r.missing[m.subject] = now
			}
			r.mu.Unlock()
			if d := now.Sub(first); d >= r.cfg.MissingAfter {
				return &missingError{subject: m.subject, since: d, err: err}
			}
		}
		if r.cfg.WaitLimit > 0 && now.Sub(since) >= r.cfg.WaitLimit {
			return err // the session ends and a new one waits again
		}
		if now.Sub(logged) >= retryLogEvery {
			logged = now
			r.log.Warn("waiting for the schema registry; nothing past this event is sent or confirmed until it answers", "subject", m.subject, "error", err.Error())
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Check looks up, for cdc check, every subject tables name without an
// event: a table's literal topic with the topic strategy (and its key
// subject with schema.key). It changes nothing in the registry: a subject
// auto_register would fill is reported only when schema.file does not
// compile. It returns one line per problem.
func (r *Registry) Check(ctx context.Context, tables []*outbox.Source) []string {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	if _, err := r.cl.Subjects(ctx); err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return []string{fmt.Sprintf("schema registry %s: %s; check schema_registry.url and its credentials", r.cfg.URL, errtext.OneLine(err))}
	}
	var probs []string
	for _, t := range tables {
		sc := &t.Schema
		topic := t.LiteralTopic()
		if !sc.Registered() || topic == "" || sc.Subject != outbox.SubjectTopic {
			continue
		}
		for _, key := range []bool{false, true} {
			if key && !sc.Key {
				continue
			}
			subj := subject(sc, topic, "", key)
			_, err := r.fetch(ctx, sc, subj, key, false)
			var le *LookupError
			if errors.As(err, &le) && errors.Is(err, errNotFound) && r.cfg.AutoRegister && sc.File != "" && !key {
				err = CheckFile(sc)
			}
			if err != nil {
				probs = append(probs, fmt.Sprintf("%s: %s", t, errtext.OneLine(err)))
			}
		}
	}
	return probs
}

// CheckFile says whether schema.file, which auto_register registers,
// compiles as the table's format.
func CheckFile(sc *outbox.Schema) error {
	text, err := os.ReadFile(sc.File)
	if err != nil {
		return fmt.Errorf("tables[].schema.file: %v", err)
	}
	if _, err := compile(sc.Format, string(text), sc.Message); err != nil {
		return fmt.Errorf("tables[].schema.file %s does not compile as %s: %s", sc.File, sc.Format, errtext.OneLine(err))
	}
	return nil
}
