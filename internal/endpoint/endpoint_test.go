package endpoint

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxcdc/cdc/internal/testenv"
	"github.com/prometheus/client_golang/prometheus"
)

type fakeSource struct{}

func (fakeSource) Healthy() error        { return nil }
func (fakeSource) Ready() (bool, string) { return false, "reconnecting after an error" }
func (fakeSource) Why() string {
	return `open replication connection to postgres at db.internal:5432: role "cdc" refused`
}

// TestTokenFileAndReadyz (issue 24): the token file is read again when it
// changes; /readyz names hosts and roles only to a request with the token;
// the server bounds headers and times.
func TestTokenFileAndReadyz(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("first-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Start(Config{Listen: "127.0.0.1:0", TokenFile: file}, prometheus.NewRegistry(), fakeSource{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	base := "http://" + s.Addr()
	if code, _ := testenv.Get(t, base+"/metrics", ""); code != http.StatusUnauthorized {
		t.Errorf("/metrics without the token: %d, want 401", code)
	}
	if code, _ := testenv.Get(t, base+"/metrics", "first-token"); code != http.StatusOK {
		t.Errorf("/metrics with the token: %d, want 200", code)
	}
	// Rotated: a later modification time, another size.
	if err := os.WriteFile(file, []byte("the-second-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Second)
	os.Chtimes(file, later, later)
	if code, _ := testenv.Get(t, base+"/metrics", "first-token"); code != http.StatusUnauthorized {
		t.Errorf("/metrics with the old token after rotation: %d, want 401", code)
	}
	if code, _ := testenv.Get(t, base+"/metrics", "the-second-token"); code != http.StatusOK {
		t.Errorf("/metrics with the new token: %d, want 200", code)
	}
	code, body := testenv.Get(t, base+"/readyz", "")
	if code != http.StatusServiceUnavailable || strings.Contains(body, "db.internal") || strings.Contains(body, "cdc") || !strings.Contains(body, "reconnecting") {
		t.Errorf("/readyz without the token: %d %q; want 503 saying it reconnects, naming no host or role", code, body)
	}
	if _, body := testenv.Get(t, base+"/readyz", "the-second-token"); !strings.Contains(body, "db.internal:5432") {
		t.Errorf("/readyz with the token: %q; want the reason", body)
	}
	if s.srv.ReadTimeout == 0 || s.srv.WriteTimeout == 0 || s.srv.IdleTimeout == 0 || s.srv.MaxHeaderBytes == 0 {
		t.Errorf("server limits: %+v", s.srv)
	}
	req, _ := http.NewRequest("GET", base+"/healthz", nil)
	req.Header.Set("X-Big", strings.Repeat("x", 64<<10))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("a 64 KB header: %d, want 431", resp.StatusCode)
		}
	}
}

// TestWeaknesses (issue 37): an endpoint bound beyond loopback without a
// token is named a weakness; on loopback, or with a token, it is not.
func TestWeaknesses(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		weak bool
	}{
		{Config{Listen: "0.0.0.0:9187"}, true},
		{Config{Listen: ":9187"}, true},
		{Config{Listen: "10.0.0.5:9187"}, true},
		{Config{Listen: "0.0.0.0:9187", TokenFile: "/etc/cdc/token"}, false},
		{Config{Listen: "127.0.0.1:9187"}, false},
		{Config{Listen: "[::1]:9187"}, false},
		{Config{Listen: "localhost:9187"}, false},
		{Config{Listen: ""}, false},
	} {
		if got := len(tc.cfg.Weaknesses()) > 0; got != tc.weak {
			t.Errorf("%+v: weak %v, want %v", tc.cfg, got, tc.weak)
		}
	}
}
