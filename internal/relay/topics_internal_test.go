package relay

import (
	"errors"
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outboxcdc/cdc/internal/sink"
)

// TestRefusedTopicsBounded: a refusal of the topic itself is kept and
// ends the session only; another error, or one past MaxRefusedTopics, is
// the error it was (a stop, as before the set).
func TestRefusedTopicsBounded(t *testing.T) {
	var r RefusedTopics
	other := &sink.ProduceError{Topic: "x", Err: kerr.MessageTooLarge}
	if err := r.note("x", other); err != other || r.why("x") != "" {
		t.Fatalf("a record too large: %v, kept %q; want the error itself, nothing kept", err, r.why("x"))
	}
	for i := 0; i < MaxRefusedTopics; i++ {
		topic := fmt.Sprint("t", i)
		err := r.note(topic, &sink.ProduceError{Topic: topic, Err: kerr.TopicAuthorizationFailed})
		if !errors.As(err, new(*TopicRefusedLaterError)) || r.why(topic) == "" {
			t.Fatalf("refusal %d: %v, kept %q; want it kept and the session ended", i, err, r.why(topic))
		}
	}
	past := &sink.ProduceError{Topic: "one-more", Err: kerr.TopicAuthorizationFailed}
	if err := r.note("one-more", past); err != past || r.why("one-more") != "" {
		t.Fatalf("past the bound: %v; want the error itself", err)
	}
	again := &sink.ProduceError{Topic: "t1", Err: kerr.PolicyViolation}
	if err := r.note("t1", again); !errors.As(err, new(*TopicRefusedLaterError)) {
		t.Fatalf("a kept topic refused again: %v; want the session ended", err)
	}
}
