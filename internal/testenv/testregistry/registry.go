package testregistry

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/bufbuild/protocompile"
	"github.com/linkedin/goavro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/outboxcdc/cdc/internal/testenv"
)

// Registry is a Confluent-compatible Schema Registry for the tests.
//
// New gives the real one CDC_TEST_REGISTRY_URL names, when it is
// set, and otherwise franz-go's in-memory srfake served over HTTP on a port
// of its own, so that the connector talks to it as to a real one.
// NewFake always gives srfake: the tests that take the registry
// down and bring it back on the same address (Stop, Start), answer in its
// place (Answer), or need its authentication or TLS, use it.
//
// A real registry is shared by every test of the run, and outlives it: a
// test names its subjects after Prefix (or after its Kafka topics, which
// carry testenv.Kafka's prefix), and takes the ids the registry gives
// instead of counting from 1.
//
// No real registry comes with the project's machines: Apicurio Registry
// cannot be assembled from the package registries they reach (the modules
// its application jar needs are not served; docs/config.md, "Apicurio
// Registry"), Karapace is not on PyPI, and Confluent's is on neither.
// CDC_TEST_REGISTRY_URL points the suite at one run elsewhere (make
// test-registry).
type Registry struct {
	URL string
	// Prefix is unique to the test: subjects the test names start with it.
	Prefix string

	fake *srfake.Registry // nil: the real registry at URL
	cl   *sr.Client

	t    testing.TB
	addr string
	tls  *tls.Config // nil: plain HTTP
	mu   sync.Mutex
	srv  *http.Server
	// answer, when set, answers a request in srfake's place: a real
	// registry's error responses, for the conformance table.
	answer func(*http.Request) (status int, body string, ok bool)
}

// New returns the real registry of CDC_TEST_REGISTRY_URL, or
// starts srfake when it is not set. A real one that does not answer fails
// the test: it was asked for.
func New(t testing.TB) *Registry {
	t.Helper()
	u := os.Getenv("CDC_TEST_REGISTRY_URL")
	if u == "" {
		return newFakeRegistry(t, nil)
	}
	cl, err := sr.NewClient(sr.URLs(u))
	if err != nil {
		t.Fatalf("schema registry CDC_TEST_REGISTRY_URL=%s: %v", u, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cl.Subjects(ctx); err != nil {
		t.Fatalf("schema registry CDC_TEST_REGISTRY_URL=%s does not answer: %v; start one (make test-registry says how) or unset it", u, err)
	}
	return &Registry{URL: u, Prefix: testenv.UniquePrefix(), cl: cl, t: t}
}

// NewFake always starts srfake, for the tests that inject faults;
// opts are srfake's (WithAuth).
func NewFake(t testing.TB, opts ...srfake.Option) *Registry {
	t.Helper()
	return newFakeRegistry(t, nil, opts...)
}

// NewFakeTLS starts srfake serving HTTPS with tc (which may
// require client certificates).
func NewFakeTLS(t testing.TB, tc *tls.Config, opts ...srfake.Option) *Registry {
	t.Helper()
	return newFakeRegistry(t, tc, opts...)
}

func newFakeRegistry(t testing.TB, tc *tls.Config, opts ...srfake.Option) *Registry {
	r := &Registry{fake: srfake.NewRegistry(opts...), t: t, addr: "127.0.0.1:0", tls: tc, Prefix: testenv.UniquePrefix()}
	r.Start()
	r.URL = "http://" + r.addr
	if tc != nil {
		r.URL = "https://" + r.addr
	}
	t.Cleanup(r.Stop)
	return r
}

// RegisterSchema registers s under subject, as a team does before the
// connector reads it, and returns its id and version. srfake registers it
// in-process, so that it can while it is stopped.
func (r *Registry) RegisterSchema(subject string, s sr.Schema) (id, version int, err error) {
	if r.fake != nil {
		return r.fake.RegisterSchema(subject, s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ss, err := r.cl.CreateSchema(ctx, subject, s)
	return ss.ID, ss.Version, err
}

// GetSchema returns subject's version (-1: the latest), if it has one.
func (r *Registry) GetSchema(subject string, version int) (sr.SubjectSchema, bool) {
	if r.fake != nil {
		return r.fake.GetSchema(subject, version)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ss, err := r.cl.SchemaByVersion(ctx, subject, version)
	if err != nil {
		var re *sr.ResponseError
		if !errors.As(err, &re) || !sr.IsNotFoundError(re.ErrorCode) {
			r.t.Fatalf("schema registry %s: subject %q version %d: %v", r.URL, subject, version, err)
		}
		return sr.SubjectSchema{}, false
	}
	return ss, true
}

// SubjectExists reports whether subject has a schema.
func (r *Registry) SubjectExists(subject string) bool {
	if r.fake != nil {
		return r.fake.SubjectExists(subject)
	}
	_, ok := r.GetSchema(subject, -1)
	return ok
}

// mustFake fails a test that would inject a fault into a real registry.
func (r *Registry) mustFake(what string) {
	if r.fake == nil {
		r.t.Helper()
		r.t.Fatalf("schema registry: %s needs srfake (testregistry.NewFake), not the real registry at %s", what, r.URL)
	}
}

// Answer has fn answer the requests it wants to (ok), with a status and a
// JSON body as a real registry writes them ({"error_code": 40401,
// "message": "..."}), and srfake the others; nil: srfake all.
func (r *Registry) Answer(fn func(req *http.Request) (status int, body string, ok bool)) {
	r.mustFake("Answer")
	r.mu.Lock()
	r.answer = fn
	r.mu.Unlock()
}

// Start serves the registry (again) on its address.
func (r *Registry) Start() {
	r.t.Helper()
	r.mustFake("Start")
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.srv != nil {
		return
	}
	ln, err := net.Listen("tcp", r.addr)
	if err != nil {
		r.t.Fatalf("schema registry: listen on %s: %v", r.addr, err)
	}
	r.addr = ln.Addr().String()
	if r.tls != nil {
		ln = tls.NewListener(ln, r.tls)
	}
	fake := r.fake.Handler()
	handler := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		answer := r.answer
		r.mu.Unlock()
		if answer != nil {
			if status, body, ok := answer(req); ok {
				w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
				w.WriteHeader(status)
				io.WriteString(w, body)
				return
			}
		}
		fake.ServeHTTP(w, req)
	})
	srv := &http.Server{Handler: handler, ErrorLog: log.New(io.Discard, "", 0)}
	r.srv = srv
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			r.t.Errorf("schema registry: %v", err)
		}
	}()
}

// Stop takes the registry down: its port refuses connections until
// Start. The schemas stay.
func (r *Registry) Stop() {
	r.mustFake("Stop")
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.srv != nil {
		_ = r.srv.Close()
		r.srv = nil
	}
}

// Decode reads a value the connector encoded against the registry, as a
// registry-aware consumer does: the schema id from Confluent's prefix (or,
// with id_in: header, from the schema_id header), the schema by id. It
// returns the id and the value as JSON: Avro's JSON encoding, protojson
// for protobuf, the bytes as written for JSON Schema.
func (r *Registry) Decode(t testing.TB, rec *kgo.Record) (int, string) {
	t.Helper()
	var h sr.ConfluentHeader
	id, rest, err := h.DecodeID(rec.Value)
	if err != nil {
		for _, hd := range rec.Headers {
			if hd.Key == "schema_id" {
				n, err := strconv.Atoi(string(hd.Value))
				if err != nil {
					t.Fatalf("schema_id header %q", hd.Value)
				}
				return n, string(rec.Value)
			}
		}
		t.Fatalf("value %q carries no schema id: %v", rec.Value, err)
	}
	cl, err := sr.NewClient(sr.URLs(r.URL))
	if err != nil {
		t.Fatal(err)
	}
	s, err := cl.SchemaByID(context.Background(), id)
	if err != nil {
		t.Fatalf("schema id %d: %v", id, err)
	}
	switch s.Type {
	case sr.TypeAvro:
		c, err := goavro.NewCodec(s.Schema)
		if err != nil {
			t.Fatal(err)
		}
		native, tail, err := c.NativeFromBinary(rest)
		if err != nil || len(tail) > 0 {
			t.Fatalf("decode %x with schema id %d: %v (%d bytes left)", rest, id, err, len(tail))
		}
		text, err := c.TextualFromNative(nil, native)
		if err != nil {
			t.Fatal(err)
		}
		return id, string(text)
	case sr.TypeProtobuf:
		index, rest, err := h.DecodeIndex(rest, 16)
		if err != nil {
			t.Fatal(err)
		}
		comp := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
			Accessor: protocompile.SourceAccessorFromMap(map[string]string{"s.proto": s.Schema}),
		})}
		files, err := comp.Compile(context.Background(), "s.proto")
		if err != nil {
			t.Fatal(err)
		}
		md := files[0].Messages().Get(index[0])
		for _, i := range index[1:] {
			md = md.Messages().Get(i)
		}
		m := dynamicpb.NewMessage(md)
		if err := proto.Unmarshal(rest, m); err != nil {
			t.Fatalf("decode %x as %s: %v", rest, md.FullName(), err)
		}
		text, err := protojson.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return id, string(text)
	}
	return id, string(rest)
}
