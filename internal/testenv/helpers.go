package testenv

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/localpg"
)

// Buffer is output a test reads while a process or a logger writes it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Connect opens a SQL connection to db, closed when the test ends.
func Connect(t testing.TB, db string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// Get fetches url, with a bearer token unless it is "", and returns the
// status and the body.
func Get(t testing.TB, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TLSPostgres starts a Postgres of its own with ssl=on, certs' server
// certificate and CA, scram-sha-256 passwords and hba as its pg_hba.conf,
// stopped when the test ends.
func TLSPostgres(t testing.TB, certs *Certs, hba string) *localpg.Server {
	t.Helper()
	srv, err := localpg.StartWith(localpg.Options{
		Settings: []string{"ssl=on", "ssl_cert_file=server.pem", "ssl_key_file=server-key.pem", "ssl_ca_file=ca.pem", "password_encryption=scram-sha-256"},
		Files:    []string{certs.ServerCert, certs.ServerKey, certs.CAFile},
		HBA:      hba,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	return srv
}

// PeakRSS is process pid's peak resident set size (VmHWM), in MB.
func PeakRSS(t testing.TB, pid int) float64 {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			var kb int
			fmt.Sscanf(strings.TrimSpace(v), "%d", &kb)
			return float64(kb) / 1024
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}
