package testenv

import (
	"errors"
	"net"
	"net/http"
	"sync"
	"testing"

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
	mu   sync.Mutex
	srv  *http.Server
}

// NewRegistry starts a registry; opts are srfake's (WithAuth).
func NewRegistry(t testing.TB, opts ...srfake.Option) *Registry {
	t.Helper()
	r := &Registry{Registry: srfake.NewRegistry(opts...), t: t, addr: "127.0.0.1:0"}
	r.Start()
	r.URL = "http://" + r.addr
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
	srv := &http.Server{Handler: r.Handler()}
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
