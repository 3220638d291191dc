package pipeline_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/opt"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/setup"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestCheckKafkaTopics: check looks at the checkpoint topic (it must
// compact) and at every topic that is not a template (it must exist when
// the connector may not create it), and lists each problem; once fixed,
// check passes. A creatable topic passes: the brokers validate its
// creation without creating it.
func TestCheckKafkaTopics(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Kafka.CreateTopics, e.cfg.Kafka.AllowAutoTopicCreation = opt.Set(false), opt.Set(false)
	static := e.kafka.Prefix + "orders.static"
	e.cfg.Tables[0].Topic = static
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.kafka.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx := context.Background()
	if _, err := adm.CreateTopic(ctx, 1, -1, map[string]*string{"cleanup.policy": kadm.StringPtr("delete")}, e.kafka.CheckpointTopic()); err != nil {
		t.Fatal(err)
	}

	check := func() error {
		t.Helper()
		p, err := pipeline.New(e.cfg, hclog.NewNullLogger(), pipeline.Options{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.Ops().Check(ctx)
		return err
	}
	err = check()
	var ce *setup.CheckError
	if !errors.As(err, &ce) || len(ce.Problems) != 2 ||
		!strings.Contains(ce.Problems[0], "kafka: topic \""+e.kafka.CheckpointTopic()+"\" has cleanup.policy=delete") ||
		!strings.Contains(ce.Problems[1], "kafka: topic \""+static+"\" does not exist, and the connector may not create it") {
		t.Fatalf("err = %v; want the checkpoint topic's policy and the missing topic", err)
	}
	if _, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "cleanup.policy", Value: kadm.StringPtr("compact")}}, e.kafka.CheckpointTopic()); err != nil {
		t.Fatal(err)
	}
	e.cfg.Kafka.CreateTopics = opt.Set(true)
	if err := check(); err != nil {
		t.Fatalf("a compacted checkpoint topic and a topic the connector may create: %v", err)
	}
	if topics, _ := adm.ListTopics(ctx, static); topics.Has(static) {
		t.Fatalf("check created %s; it must only validate", static)
	}
}
