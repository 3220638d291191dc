// Package endpoint serves the connector's HTTP endpoint: Prometheus metrics
// at /metrics, and /healthz and /readyz for probes.
//
// Invariants:
//   - /metrics requires "Authorization: Bearer <token>" when a token is set;
//     /healthz and /readyz stay open, because probes carry no credentials.
//   - The token is compared in constant time and never logged.
//   - /readyz answers 200 only while this instance holds the slot and
//     streams; a standby, a reconnecting or a stopped instance answers 503
//     and says which in the body. The error it retries after, which can
//     name hosts and roles, is in the body only for a request with the
//     token.
//   - Every connection is bounded: header, read, write and idle timeouts,
//     and a header size limit.
package endpoint

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/outboxcdc/cdc/internal/secret"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Source is what the probes ask about.
type Source interface {
	// Healthy is nil while the process's loops are alive.
	Healthy() error
	// Ready reports whether this instance streams, and what it does.
	Ready() (bool, string)
	// Why is the error it retries after, or "".
	Why() string
}

// Config configures the endpoint.
type Config struct {
	// Listen is host:port; "" turns the endpoint off.
	Listen string
	// Token, when set, is required as a bearer token on /metrics.
	Token string
	// TokenFile, when set, holds the token instead; it is read again when
	// it changes, so a rotated token needs no restart.
	TokenFile string
}

// Weaknesses lists what leaves the endpoint open to the network: a
// listen address that is not loopback, without a token, serves /metrics
// (which names the tables and topics) and the reasons /readyz gives to
// anyone who can reach it.
func (c Config) Weaknesses() []string {
	if c.Listen == "" || c.Token != "" || c.TokenFile != "" {
		return nil
	}
	host, _, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return nil
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return nil
	}
	return []string{fmt.Sprintf("http.listen %s serves /metrics (which names tables and topics) beyond this host without a token: set http.token_file, or restrict who reaches the port (the Helm chart's NetworkPolicy does)", c.Listen)}
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
	tok := &tokenSource{token: cfg.Token, file: cfg.TokenFile}
	mux.Handle("/metrics", requireToken(tok, metrics))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := src.Healthy(); err != nil {
			http.Error(w, "unhealthy: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		ready, detail := src.Ready()
		if !ready {
			if why := src.Why(); why != "" && tok.authorized(r) {
				detail += ": " + why
			}
			http.Error(w, "not ready: "+detail, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready: "+detail)
	})
	s := &Server{srv: &http.Server{Handler: mux,
		ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second,
		IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10}, addr: ln.Addr(), done: make(chan struct{})}
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

// tokenSource is the bearer token: Config.Token, or Config.TokenFile's
// content, read again whenever the file's modification time or size
// changes.
type tokenSource struct {
	token, file string

	mu      sync.Mutex
	mod     time.Time
	size    int64
	current string
}

// get returns the token, "" when none is set (or the file is empty or
// gone: then /metrics refuses every request rather than open up).
func (t *tokenSource) get() (token string, set bool) {
	if t.file == "" {
		return t.token, t.token != ""
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if fi, err := os.Stat(t.file); err != nil {
		t.current = ""
	} else if !fi.ModTime().Equal(t.mod) || fi.Size() != t.size {
		tok, _ := secret.Read(t.file) // "" while missing or empty: nobody is let in
		t.current, t.mod, t.size = tok, fi.ModTime(), fi.Size()
	}
	return t.current, true
}

// authorized reports whether r carries the token (false when none is set).
func (t *tokenSource) authorized(r *http.Request) bool {
	token, set := t.get()
	return set && token != "" && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte("Bearer "+token)) == 1
}

func requireToken(tok *tokenSource, next http.Handler) http.Handler {
	if _, set := tok.get(); !set {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !tok.authorized(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="outbox-cdc"`)
			http.Error(w, "unauthorized: send Authorization: Bearer <http.token>", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
