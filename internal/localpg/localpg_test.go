package localpg

import (
	"context"
	"net"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestStartPicksAnotherPort: a port taken between FreePort and the bind, as
// when two suites run side by side, is picked again instead of failing the
// start.
func TestStartPicksAnotherPort(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	busy := taken.Addr().(*net.TCPAddr).Port
	firstPort = func() (int, error) { return busy, nil }
	defer func() { firstPort = FreePort }()

	p, err := Start()
	if err != nil {
		t.Fatalf("start with port %d taken: %v", busy, err)
	}
	defer p.Stop()
	if p.Port == busy {
		t.Fatalf("listens on %d, the taken port", busy)
	}
	conn, err := pgx.Connect(context.Background(), p.URL)
	if err != nil {
		t.Fatalf("connect to %s: %v", p.URL, err)
	}
	defer conn.Close(context.Background())
	var port int
	if err := conn.QueryRow(context.Background(), "SELECT current_setting('port')::int").Scan(&port); err != nil || port != p.Port {
		t.Fatalf("the server says port %d (%v); Start said %d", port, err, p.Port)
	}
}
