// Package endpoint serves the connector's HTTP endpoint: Prometheus metrics
// at /metrics, and /healthz and /readyz for probes.
//
// Invariants:
//   - /metrics requires "Authorization: Bearer <token>" when a token is set;
//     /healthz and /readyz stay open, because probes carry no credentials.
//   - The token is compared in constant time and never logged.
//   - /readyz answers 200 only while this instance holds the slot and
//     streams; a standby, a reconnecting or a stopped instance answers 503
//     and says which in the body.
package endpoint

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Source is what the probes ask about.
type Source interface {
	// Healthy is nil while the process's loops are alive.
	Healthy() error
	// Ready reports whether this instance streams, and what it does.
	Ready() (bool, string)
}

// Config configures the endpoint.
type Config struct {
	// Listen is host:port; "" turns the endpoint off.
	Listen string
	// Token, when set, is required as a bearer token on /metrics.
	Token string
}

// Server is a running endpoint.
type Server struct {
	srv  *http.Server
	addr net.Addr
	done chan struct{}
}

// Start listens on cfg.Listen and serves until Close. The address is bound
// before Start returns, so a port in use is an error here, not later.
func Start(cfg Config, reg *prometheus.Registry, src Source) (*Server, error) {
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("http.listen %s: %v; set another address in http.listen (or CDC_HTTP_LISTEN), or an empty one to turn the endpoint off", cfg.Listen, err)
	}
	mux := http.NewServeMux()
	metrics := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	mux.Handle("/metrics", requireToken(cfg.Token, metrics))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := src.Healthy(); err != nil {
			http.Error(w, "unhealthy: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		ready, detail := src.Ready()
		if !ready {
			http.Error(w, "not ready: "+detail, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready: "+detail)
	})
	s := &Server{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, addr: ln.Addr(), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = err // the listener failed after start; the probes will notice
		}
	}()
	return s, nil
}

// Addr is the bound address (useful with port 0).
func (s *Server) Addr() string { return s.addr.String() }

// Close stops serving, waiting up to five seconds for requests in progress.
func (s *Server) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.srv.Shutdown(ctx)
	<-s.done
}

func requireToken(token string, next http.Handler) http.Handler {
	if token == "" {
		return next
	}
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="outbox-cdc"`)
			http.Error(w, "unauthorized: send Authorization: Bearer <http.token>", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
