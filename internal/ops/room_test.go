package ops

import (
	"testing"

	"github.com/outboxcdc/cdc/internal/request"
)

// TestRoomForEveryRequest (the second attack on issue 53): cdc redrive
// splits a selection into requests of park.MaxRefs keys, and the
// checkpoint's room must hold every one of them: at the least room for
// one request, two do not fit.
func TestRoomForEveryRequest(t *testing.T) {
	size := 1
	for ; !roomFor(request.Ledger{MaxBytes: size}, 1); size++ {
		if size > 1<<16 {
			t.Fatal("no room for one request in 64 KiB")
		}
	}
	if roomFor(request.Ledger{MaxBytes: size}, 2) {
		t.Fatalf("room for two requests where one just fits (%d bytes)", size)
	}
	if !roomFor(request.Ledger{MaxBytes: 4 * size}, 2) {
		t.Fatalf("no room for two requests in %d bytes", 4*size)
	}
}
