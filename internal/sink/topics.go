package sink

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TopicDefaults are the settings of the topics the connector creates.
type TopicDefaults struct {
	// Partitions of a new topic; -1 (the default) is the broker's
	// num.partitions.
	Partitions int32 `yaml:"partitions"`
	// ReplicationFactor of a new topic; -1 (the default) is the broker's
	// default.replication.factor.
	ReplicationFactor int16 `yaml:"replication_factor"`
	// Configs are topic configs, e.g. retention.ms, min.insync.replicas.
	Configs map[string]string `yaml:"configs"`
}

// topicState is what the producer knows of one topic.
type topicState int

const (
	topicUnknown topicState = iota
	topicReady              // exists, or created by us
	topicBroker             // may not create it ourselves; the broker may auto-create it
	topicRefused            // the brokers refuse its name (TopicRefusedError)
)

// TopicRefusedError is a topic whose name the brokers refuse: one that
// collides with an existing topic once '.' and '_' are taken as the same,
// or that breaks a rule of theirs. A row's fields chose it (a template),
// so it is that event's problem, not the stream's: the pipeline applies
// the table's on_invalid policy to it.
type TopicRefusedError struct {
	Topic string
	Err   error
}

func (e *TopicRefusedError) Error() string {
	return fmt.Sprintf("the brokers refuse topic %q: %v", e.Topic, e.Err)
}
func (e *TopicRefusedError) Unwrap() error { return e.Err }

// EnsureTopic makes sure topic exists before its first record is produced:
// it creates it through the admin API with TopicDefaults, unless
// CreateTopics is off. Where the connector may not create topics it relies
// on the broker's auto-creation, when AllowAutoTopicCreation allows. A topic
// that is missing and that neither may create is a *ProduceError that says
// so (permanent); a broker that does not answer is a transient error.
//
// It runs on the replication loop's goroutine and blocks it for the admin
// call, once per topic per session: bounded by a timeout, well inside
// wal_sender_timeout.
func (k *Kafka) EnsureTopic(ctx context.Context, topic string) error {
	switch k.topics[topic] {
	case topicUnknown:
	case topicRefused:
		return &TopicRefusedError{Topic: topic, Err: kerr.InvalidTopicException}
	default:
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	state, err := k.ensureTopic(ctx, topic)
	var refused *TopicRefusedError
	if errors.As(err, &refused) {
		k.topics[topic] = topicRefused // asked once, not at every event
	}
	if err != nil {
		return err
	}
	k.topics[topic] = state
	return nil
}

// TopicKnown reports whether EnsureTopic has nothing to do for topic: it
// is cheap, and tells the caller whether the call may block.
func (k *Kafka) TopicKnown(topic string) bool { return k.topics[topic] != topicUnknown }

func (k *Kafka) ensureTopic(ctx context.Context, topic string) (topicState, error) {
	adm := kadm.NewClient(k.cl)
	if k.cfg.Creates() {
		d := k.cfg.TopicDefaults
		configs := map[string]*string{}
		for key, v := range d.Configs {
			configs[key] = kadm.StringPtr(v)
		}
		for key, v := range k.cfg.TopicConfigs[topic] {
			configs[key] = kadm.StringPtr(v)
		}
		if k.larger(topic) && configs["max.message.bytes"] == nil {
			// A dead-letter or parked topic takes records larger than the
			// others.
			configs["max.message.bytes"] = kadm.StringPtr(strconv.Itoa(int(k.maxOf(topic))))
		}
		resp, err := adm.CreateTopic(ctx, d.Partitions, d.ReplicationFactor, configs, topic)
		if err == nil {
			err = resp.Err
		}
		var refused *kerr.Error
		switch {
		case err == nil:
			k.log.Info("created topic", "topic", topic, "partitions", resp.NumPartitions, "replication_factor", resp.ReplicationFactor)
			return topicReady, nil
		case errors.Is(err, kerr.TopicAlreadyExists):
			return topicReady, nil
		case errors.Is(err, kerr.InvalidReplicationFactor), errors.Is(err, kerr.InvalidPartitions), errors.Is(err, kerr.InvalidConfig):
			return 0, &ProduceError{Topic: topic, Err: err, permanent: true,
				advice: "the brokers refuse kafka.topic_defaults (partitions, replication_factor or configs) for a new topic: fix them"}
		case errors.Is(err, kerr.InvalidTopicException):
			return 0, &TopicRefusedError{Topic: topic, Err: err}
		case errors.As(err, &refused):
			// Not allowed to create (ACLs, a policy): the topic may exist
			// anyway, or the broker may create it.
			k.log.Debug("may not create topic; relying on it existing or on broker auto-creation", "topic", topic, "error", err)
		default:
			return 0, fmt.Errorf("create topic %q: %w", topic, err)
		}
	}
	listed, err := adm.ListTopics(ctx, topic)
	if err != nil {
		return 0, fmt.Errorf("look up topic %q: %w", topic, err)
	}
	if listed.Has(topic) && listed[topic].Err == nil {
		return topicReady, nil
	}
	if k.cfg.AutoCreate() {
		// The broker creates it at the first record, and fails the
		// record (and the stream with it) if it refuses the name: ask
		// it now, so that a name it refuses is the event's problem.
		resp, err := adm.ValidateCreateTopics(ctx, k.cfg.TopicDefaults.Partitions, k.cfg.TopicDefaults.ReplicationFactor, nil, topic)
		if err == nil {
			err = resp.Error()
		}
		if errors.Is(err, kerr.InvalidTopicException) {
			return 0, &TopicRefusedError{Topic: topic, Err: err}
		}
		// Have the broker create it now: its answer says whether it
		// will, where the first record would only find it missing,
		// again and again (kgo.UnknownTopicRetries in New).
		will, err := autoCreate(ctx, k.cl, topic)
		if err != nil {
			return 0, err
		}
		if will {
			return topicBroker, nil
		}
	}
	how := "set kafka.create_topics: true (and grant the connector CREATE on it)"
	if k.cfg.Creates() {
		how = "grant the connector CREATE on it"
	}
	auto := "allow broker auto-creation (kafka.allow_auto_topic_creation: true and auto.create.topics.enable=true)"
	if k.cfg.AutoCreate() {
		auto = "turn on auto.create.topics.enable on the brokers (they do not auto-create it)"
	}
	return 0, &ProduceError{Topic: topic, Err: kerr.UnknownTopicOrPartition, permanent: true,
		advice: fmt.Sprintf("the topic does not exist, and the connector may not create it: create it (kafka-topics.sh --create --topic %s), %s, or %s", topic, how, auto)}
}

// autoCreate asks the brokers for topic's metadata with auto-creation
// allowed, and reports whether they have it or are creating it. A broker
// with auto.create.topics.enable off answers UNKNOWN_TOPIC_OR_PARTITION;
// so may one while a creation of the topic is already under way, so that
// answer counts only once it has come five times, a fifth of a second
// apart.
func autoCreate(ctx context.Context, cl *kgo.Client, topic string) (bool, error) {
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	req.AllowAutoTopicCreation = true
	for try := 1; ; try++ {
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			return false, fmt.Errorf("have the brokers auto-create topic %q: %w", topic, err)
		}
		i := slices.IndexFunc(resp.Topics, func(t kmsg.MetadataResponseTopic) bool { return t.Topic != nil && *t.Topic == topic })
		if i < 0 {
			return false, fmt.Errorf("have the brokers auto-create topic %q: their metadata answer leaves it out", topic)
		}
		err = kerr.ErrorForCode(resp.Topics[i].ErrorCode)
		switch {
		case errors.Is(err, kerr.InvalidTopicException):
			return false, &TopicRefusedError{Topic: topic, Err: err}
		case !errors.Is(err, kerr.UnknownTopicOrPartition):
			return true, nil // there, or LEADER_NOT_AVAILABLE: being created
		case try == 5:
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// CheckTopic reports what would stop the connector from producing to
// topic, without creating anything: a topic that is missing and that it
// may not create (mayCreate: it would try; the broker is asked to validate
// the creation, which also tests the connector's CREATE right), or, with
// compact, one whose cleanup.policy would delete records.
func (k *Kafka) CheckTopic(ctx context.Context, topic string, mayCreate, compact bool) error {
	// A client of its own: the producer's asks the brokers to auto-create
	// the topics it looks up (kafka.allow_auto_topic_creation), and a
	// check must not create anything.
	cl, err := kgo.NewClient(ClientOpts(k.cfg, k.log)...)
	if err != nil {
		return fmt.Errorf("create kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	listed, err := adm.ListTopics(ctx, topic)
	if err != nil {
		return fmt.Errorf("look up topic %q: %w", topic, err)
	}
	// A topic just made may have no leader yet: it exists all the same.
	if d, ok := listed[topic]; ok && (d.Err == nil || errors.Is(d.Err, kerr.LeaderNotAvailable)) {
		if !compact {
			return nil
		}
		described, err := adm.DescribeTopicConfigs(ctx, topic)
		if err != nil {
			return fmt.Errorf("describe topic %q: %w", topic, err)
		}
		rc, err := described.On(topic, nil)
		if err != nil || rc.Err != nil {
			return fmt.Errorf("describe topic %q: %v; grant the connector DESCRIBE_CONFIGS on it", topic, errors.Join(err, rc.Err))
		}
		for _, c := range rc.Configs {
			if c.Key == "cleanup.policy" && c.Value != nil && !strings.Contains(*c.Value, "compact") {
				return fmt.Errorf("topic %q has cleanup.policy=%s, so Kafka would delete the checkpoint; set cleanup.policy=compact on it", topic, *c.Value)
			}
		}
		return nil
	}
	if !mayCreate {
		if k.cfg.AutoCreate() {
			return nil // the broker may create it on the first record
		}
		return fmt.Errorf("topic %q does not exist, and the connector may not create it: create it, or set kafka.create_topics: true", topic)
	}
	d := k.cfg.TopicDefaults
	resp, err := adm.ValidateCreateTopics(ctx, d.Partitions, d.ReplicationFactor, nil, topic)
	if err == nil {
		err = resp.Error()
	}
	switch {
	case err == nil, errors.Is(err, kerr.TopicAlreadyExists):
		return nil
	case errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.ClusterAuthorizationFailed):
		return fmt.Errorf("topic %q does not exist, and the brokers refuse the connector's CREATE on it (%v): create it, or grant CREATE", topic, err)
	default:
		return fmt.Errorf("topic %q does not exist, and creating it would fail: %v", topic, err)
	}
}

// TimedTopic is a topic whose records the brokers delete after Ms.
type TimedTopic struct {
	Topic string
	Ms    int64
}

// Timed is the topics of topics that exist and delete records after a
// time (a parked topic must not: a parked event lives there until it is
// redriven).
func (k *Kafka) Timed(ctx context.Context, topics []string) []TimedTopic {
	var out []TimedTopic
	for _, t := range topics {
		if ms, ok := k.Retention(ctx, t); ok && ms >= 0 {
			out = append(out, TimedTopic{t, ms})
		}
	}
	return out
}

// Retention is topic's retention.ms as the brokers have it: -1 keeps
// records for ever. ok is false when it cannot be read (no DescribeConfigs
// right, no such topic yet).
func (k *Kafka) Retention(ctx context.Context, topic string) (ms int64, ok bool) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rcs, err := kadm.NewClient(k.cl).DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return 0, false
	}
	rc, err := rcs.On(topic, nil)
	if err != nil || rc.Err != nil {
		return 0, false
	}
	for _, c := range rc.Configs {
		if c.Key == "retention.ms" && c.Value != nil {
			v, err := strconv.ParseInt(*c.Value, 10, 64)
			return v, err == nil
		}
	}
	return 0, false
}

// Squatted returns, for each of topics that another topic keeps from
// being created (SameTopic, not equal), that topic; nil when the topics
// could not be listed (the check is the start's, a help, not a gate: the
// gate keeps rows out of such names).
func (k *Kafka) Squatted(ctx context.Context, topics []string) map[string]string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	listed, err := kadm.NewClient(k.cl).ListTopics(ctx)
	if err != nil {
		return nil
	}
	out := map[string]string{}
	for _, t := range topics {
		if listed.Has(t) {
			continue
		}
		for name := range listed {
			if name != t && SameTopic(name, t) {
				out[t] = name
			}
		}
	}
	return out
}

// SameTopic reports whether Kafka takes a and b for the same topic name:
// equal once every '.' is read as '_' (Kafka refuses to create a topic
// whose name collides so with an existing one). It allocates nothing (it runs for
// every record).
func SameTopic(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if x == '.' {
			x = '_'
		}
		if y == '.' {
			y = '_'
		}
		if x != y {
			return false
		}
	}
	return true
}
