package testenv

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log"
	"strconv"

	"net"
	"net/http"
	"sync"
	"testing"

	"github.com/bufbuild/protocompile"
	"github.com/linkedin/goavro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// Registry is a Confluent-compatible Schema Registry for the tests:
// franz-go's in-memory srfake, served over HTTP on a port of its own, so
// that the connector talks to it as to a real one and a test can take it
// down and bring it back on the same address. No real registry runs here:
// Apicurio Registry cannot be assembled from Maven Central (its
// schema-util-provider and app-components modules are not published
// there), Karapace is not on PyPI, and Confluent's is not on either
// (docs/config.md, "Schema Registry").
type Registry struct {
	*srfake.Registry
	URL string

	t    testing.TB
	addr string
	tls  *tls.Config // nil: plain HTTP
	mu   sync.Mutex
	srv  *http.Server
	// answer, when set, answers a request in srfake's place: a real
	// registry's error responses, for the conformance table.
	answer func(*http.Request) (status int, body string, ok bool)
}

// Answer has fn answer the requests it wants to (ok), with a status and a
// JSON body as a real registry writes them ({"error_code": 40401,
// "message": "..."}), and srfake the others; nil: srfake all.
func (r *Registry) Answer(fn func(req *http.Request) (status int, body string, ok bool)) {
	r.mu.Lock()
	r.answer = fn
	r.mu.Unlock()
}

// NewRegistry starts a registry; opts are srfake's (WithAuth).
func NewRegistry(t testing.TB, opts ...srfake.Option) *Registry {
	t.Helper()
	return newRegistry(t, nil, opts...)
}

// NewRegistryTLS starts a registry that serves HTTPS with tc (which may
// require client certificates).
func NewRegistryTLS(t testing.TB, tc *tls.Config, opts ...srfake.Option) *Registry {
	t.Helper()
	return newRegistry(t, tc, opts...)
}

func newRegistry(t testing.TB, tc *tls.Config, opts ...srfake.Option) *Registry {
	r := &Registry{Registry: srfake.NewRegistry(opts...), t: t, addr: "127.0.0.1:0", tls: tc}
	r.Start()
	r.URL = "http://" + r.addr
	if tc != nil {
		r.URL = "https://" + r.addr
	}
	t.Cleanup(r.Stop)
	return r
}

// Start serves the registry (again) on its address.
func (r *Registry) Start() {
	r.t.Helper()
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
	fake := r.Handler()
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
