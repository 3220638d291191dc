// Command kafkawait waits until a Kafka broker answers a metadata request
// with at least one broker, so scripts never sleep for readiness.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func main() {
	brokers := flag.String("brokers", "", "comma-separated bootstrap brokers")
	timeout := flag.Duration("timeout", time.Minute, "give up after this long")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	for {
		if err := ready(ctx, strings.Split(*brokers, ",")); err == nil {
			return
		} else if ctx.Err() != nil {
			fmt.Fprintf(os.Stderr, "kafkawait: %s not ready after %s: %v\n", *brokers, *timeout, err)
			os.Exit(1)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func ready(ctx context.Context, brokers []string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RetryTimeout(time.Second))
	if err != nil {
		return err
	}
	defer cl.Close()
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := kmsg.NewPtrMetadataRequest().RequestWith(rctx, cl)
	if err != nil {
		return err
	}
	if len(resp.Brokers) == 0 {
		return fmt.Errorf("metadata lists no brokers")
	}
	return nil
}
