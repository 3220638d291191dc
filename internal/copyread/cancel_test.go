package copyread_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/outboxcdc/cdc/internal/copyread"
	"github.com/outboxcdc/cdc/internal/postgres"
)

// holdingCancels is db's URL through a proxy that passes connections
// through, but takes a cancel request and never answers it: a network cut
// after the cancel's handshake, or a pooler that holds it. It says on
// the channel when it holds one.
func holdingCancels(t *testing.T, db string) (string, <-chan struct{}) {
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	target := u.Host
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	held, holds := make(chan struct{}), make(chan struct{}, 16)
	t.Cleanup(func() { close(held); ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				head := make([]byte, 8)
				if _, err := io.ReadFull(c, head); err != nil {
					return
				}
				if binary.BigEndian.Uint32(head[0:4]) == 16 && binary.BigEndian.Uint32(head[4:8]) == 80877102 { // CancelRequest
					holds <- struct{}{}
					<-held
					return
				}
				s, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer s.Close()
				s.Write(head)
				go func() { io.Copy(s, c); s.Close() }()
				io.Copy(c, s)
			}(c)
		}
	}()
	u.Host = ln.Addr().String()
	return u.String(), holds
}

// TestCopyCancelUnanswered: the request to end a copy at a flagged row
// that the server never answers may still land, later, on any statement:
// the read ends with an error that says so, within the wait, instead of
// ErrFlagged, and Stop ends a read that waits for the answer at once.
// Found by the second attack on the flag: Next and Stop waited for ever.
func TestCopyCancelUnanswered(t *testing.T) {
	plain := pg.NewDatabase(t)
	ctx := context.Background()
	// start begins the copy through a proxy of its own.
	start := func(t *testing.T) (*copyread.Reader, <-chan struct{}) {
		db, holds := holdingCancels(t, plain)
		conn, err := postgres.ConnectRows(ctx, postgres.Config{URL: db}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(ctx) })
		if _, err := conn.Exec(ctx, "BEGIN; SAVEPOINT copy"); err != nil {
			t.Fatal(err)
		}
		return copyread.Start(ctx, conn.PgConn(), `COPY (SELECT i, i = 3 FROM generate_series(1, 5) i) TO STDOUT`, copyread.Options{Width: 1, Rows: 10, Flagged: true}), holds
	}
	t.Run("no answer in the wait", func(t *testing.T) {
		defer copyread.SetCancelWait(300 * time.Millisecond)()
		r, _ := start(t)
		defer r.Stop()
		began := time.Now()
		var err error
		for err == nil {
			var last bool
			if _, last, err = r.Next(); last {
				t.Fatal("the copy ended as though no row was flagged")
			}
		}
		if !strings.Contains(err.Error(), "did not answer the request to end the copy") || strings.Contains(err.Error(), "\n") {
			t.Fatalf("a cancel request with no answer: %v; want one line that says so", err)
		}
		if took := time.Since(began); took > 5*time.Second {
			t.Fatalf("the read ended %s after it began, past the 300 ms wait", took.Round(time.Millisecond))
		}
	})
	t.Run("stopped while it waits", func(t *testing.T) {
		defer copyread.SetCancelWait(time.Hour)()
		r, holds := start(t)
		next := make(chan error, 1)
		go func() {
			for {
				if _, last, err := r.Next(); err != nil || last {
					next <- err
					return
				}
			}
		}()
		select {
		case <-holds:
		case <-time.After(10 * time.Second):
			t.Fatal("no cancel request reached the proxy")
		}
		stopped := make(chan struct{})
		go func() { r.Stop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			t.Fatal("Stop still waits 10 s later, for the cancel request's answer")
		}
		if err := <-next; err == nil {
			t.Fatal("a read stopped before its end returned no error")
		}
	})
}

// TestCancelMeetsNoLaterStatement: on a direct connection, the request to
// end a copy flagged at one of its last rows, which may come after the
// copy ended on its own, never cancels the statements after it (the
// rollback to the copy's savepoint, a cursor's MOVE and FETCH, a query,
// the commit): the server signals the backend before it answers the
// request, and a backend waiting for its next statement drops the
// signal. 200 rounds (without the wait for the answer, one
// in a hundred or so fails), found to hold by the second attack on the flag.
func TestCancelMeetsNoLaterStatement(t *testing.T) {
	ctx := context.Background()
	conn, err := postgres.ConnectRows(ctx, postgres.Config{URL: pg.NewDatabase(t)}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for i := range 200 {
		if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ; DECLARE c SCROLL CURSOR FOR SELECT i FROM generate_series(1, 5) i; SAVEPOINT copy"); err != nil {
			t.Fatal(err)
		}
		r := copyread.Start(ctx, conn.PgConn(), fmt.Sprintf(`COPY (SELECT i, i = %d FROM generate_series(1, 5) i) TO STDOUT`, 5-i%2), copyread.Options{Width: 1, Rows: 10, Flagged: true})
		for {
			_, last, err := r.Next()
			if errors.Is(err, copyread.ErrFlagged) {
				break
			}
			if err != nil || last {
				t.Fatalf("round %d: last %v, err %v; want ErrFlagged", i, last, err)
			}
		}
		r.Stop()
		for _, q := range []string{"ROLLBACK TO SAVEPOINT copy", "MOVE ABSOLUTE 4 IN c", "FETCH 1 FROM c", "SELECT pg_sleep(0.001)", "COMMIT"} {
			if _, err := conn.Exec(ctx, q); err != nil {
				t.Fatalf("round %d: %s, after the copy ended at its flag: %v", i, q, err)
			}
		}
	}
}
