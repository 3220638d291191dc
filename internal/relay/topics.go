package relay

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outboxcdc/cdc/internal/sink"
)

// The topics a row may not choose (docs/security.md, "One gate"): Kafka's
// own (named "__..."), the checkpoint topic, a parked topic, a dead-letter
// topic, and any name Kafka takes for one of those (sink.SameTopic): a
// row that made "outbox_dead-letter" first would keep "outbox.dead-letter"
// from being created.

// sameAsOne reports whether topic is, to Kafka, one of topics, or one of
// them with suffix (a replay's, which every topic it produces to has).
func sameAsOne(topic string, topics map[string]bool, suffix string) bool {
	for t := range topics {
		if sink.SameTopic(topic, t) || (suffix != "" && len(topic) == len(t)+len(suffix) && sink.SameTopic(topic, t+suffix)) {
			return true
		}
	}
	return false
}

// kafkaInternal reports whether topic is named as Kafka names its own
// (__consumer_offsets, __transaction_state, ...): the brokers refuse a
// producer's records to those, at the record, after the topic was looked
// up, which would otherwise stop every table.
func kafkaInternal(topic string) bool { return strings.HasPrefix(topic, "__") }

// RefusedTopics are the topics the brokers refused an event's record for
// (no WRITE for the connector's principal, a topic they keep for
// themselves, a policy), across a pipeline's sessions: the record's
// refusal ends its session (its transaction cannot commit around it),
// and from the next session on the gate makes each event routed there
// its table's on_invalid, as it does a name the brokers refuse to create.
// A row's fields choose the topic, so one row cannot stop every table.
// It is kept for the pipeline's life (a grant takes effect when the
// connector starts again: then a redrive of the keys parked for it) and
// holds at most
// MaxRefusedTopics; past that a refusal stops the connector, as it did
// before there was a set. Safe for concurrent use: the producer's
// goroutine adds, the stream's reads.
type RefusedTopics struct {
	n      atomic.Int32 // len(topics): the stream's look costs a load while none is
	mu     sync.Mutex
	topics map[string]string // topic → the brokers' answer
}

// MaxRefusedTopics bounds RefusedTopics.
const MaxRefusedTopics = 1024

// why is the brokers' answer for topic, or "".
func (r *RefusedTopics) why(topic string) string {
	if r == nil || r.n.Load() == 0 {
		return ""
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.topics[topic]
}

// note takes err, the brokers' answer to an event's record for topic:
// a refusal of the topic itself becomes a *TopicRefusedLaterError, which
// ends the session without stopping the connector, once it is kept.
// Anything else is err.
func (r *RefusedTopics) note(topic string, err error) error {
	var prod *sink.ProduceError
	if r == nil || !errors.As(err, &prod) || !refusesTopic(prod.Err) {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.topics == nil {
		r.topics = map[string]string{}
	}
	if _, ok := r.topics[topic]; !ok && len(r.topics) >= MaxRefusedTopics {
		return err
	}
	why := prod.Err.Error()
	r.topics[topic] = why
	r.n.Store(int32(len(r.topics)))
	return &TopicRefusedLaterError{Topic: topic, Why: why}
}

// refusesTopic reports whether err, a broker's answer to a record, is
// about its topic rather than the connector or the record: the same
// record to another topic could be taken.
func refusesTopic(err error) bool {
	return errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.InvalidTopicException) || errors.Is(err, kerr.PolicyViolation)
}

// TopicRefusedLaterError is an event's record that the brokers refused
// for its topic. It ends the session, and is not permanent: the next one
// sends again from the confirmed position, and the gate makes that topic's
// events their table's on_invalid (RefusedTopics).
type TopicRefusedLaterError struct {
	Topic, Why string
}

func (e *TopicRefusedLaterError) Error() string {
	return fmt.Sprintf("kafka refused a record to topic %q: %s; the connector starts again from its confirmed position and handles the events routed to that topic by their table's on_invalid", e.Topic, e.Why)
}
