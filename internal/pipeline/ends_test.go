package pipeline

import (
	"testing"
	"time"
)

// TestEnderStopsAtABoundary pins when a stop asked for ends the stream:
// at once between two transactions, at the open one's COMMIT, before the
// next one's BEGIN, and after the grace when the COMMIT does not come.
func TestEnderStopsAtABoundary(t *testing.T) {
	const grace = 50 * time.Millisecond
	stopped := func() (func(), <-chan struct{}) {
		ch := make(chan struct{})
		return func() { close(ch) }, ch
	}
	isStopped := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}

	t.Run("between transactions", func(t *testing.T) {
		var e ender
		if !e.begin() || !e.commit() {
			t.Fatal("a transaction without a stop asked for must go on")
		}
		stop, ch := stopped()
		e.ask(stop, time.Hour)
		if !isStopped(ch) {
			t.Fatal("a stop between two transactions must end the stream at once")
		}
		if e.begin() {
			t.Fatal("the next transaction began after the stop")
		}
	})
	t.Run("inside a transaction", func(t *testing.T) {
		var e ender
		e.begin()
		stop, ch := stopped()
		e.ask(stop, time.Hour)
		defer e.stopTimer()
		if isStopped(ch) {
			t.Fatal("a stop inside a transaction ended the stream before its COMMIT")
		}
		if e.commit() {
			t.Fatal("the stream went on past the COMMIT of the transaction the stop came in")
		}
	})
	t.Run("a COMMIT that does not come in time", func(t *testing.T) {
		var e ender
		e.begin()
		stop, ch := stopped()
		start := time.Now()
		e.ask(stop, grace)
		select {
		case <-ch:
			if d := time.Since(start); d < grace {
				t.Fatalf("stopped after %s, before the grace of %s", d, grace)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the stream was not stopped after the grace")
		}
	})
	t.Run("asked twice", func(t *testing.T) {
		var e ender
		stop, _ := stopped()
		e.ask(stop, grace)
		e.ask(stop, grace) // a second close would panic
		if at := e.asked(); time.Since(at) > time.Minute {
			t.Fatalf("asked at %s", at)
		}
	})
}
