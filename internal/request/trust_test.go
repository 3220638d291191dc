package request_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/request"
)

// backfillKind is how the session reads a backfill request
// (backfill.RequestKind).
var backfillKind = request.Kind[checkpoint.Request]{Name: "backfill", Parse: checkpoint.ParseRequest}

// TestForgedAnnouncementOfAnotherKindCancelsNothing pins that refusals are
// remembered by kind and id: any role may announce the id of the
// operator's signed redrive as a backfill; that is refused (it is no
// backfill), and the operator's own announcement of it as a redrive, a
// moment later, is still admitted, not passed over as "refused before".
func TestForgedAnnouncementOfAnotherKindCancelsNothing(t *testing.T) {
	now := time.Now()
	f := &follower{values: map[string][]byte{}, read: map[string]bool{}}
	op := signed("redrive-op", now, key, "slot/1")
	b, _ := json.Marshal(op)
	f.values[op.ID], f.read[op.ID] = b, true

	var g request.Gate
	// The forger's message: the redrive's id, announced as a backfill.
	_, err := request.Admit(context.Background(), &g, f, backfillKind, admission(op.ID, now, nil))
	var refused *request.Refused
	if !errors.As(err, &refused) {
		t.Fatalf("the redrive's id announced as a backfill: %v, want refused", err)
	}
	// The operator's own announcement, a moment later.
	req, err := request.Admit(context.Background(), &g, f, redrive, admission(op.ID, now.Add(time.Millisecond), nil))
	if err != nil || req.ID != op.ID {
		t.Fatalf("the operator's signed redrive, announced as a redrive after a forged announcement of its id as a backfill: %v; want it admitted (a forged announcement must be harmless)", err)
	}
}
