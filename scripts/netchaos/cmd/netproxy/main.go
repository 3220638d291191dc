// Command netproxy is a TCP proxy that adds latency each way, for make
// bench-network: the connector reaches the broker through it, so that a
// benchmark sees what a network between them costs. It is toxiproxy
// (github.com/Shopify/toxiproxy/v2) in process, with one latency toxic on
// each direction, and runs until it is sent SIGTERM or SIGINT.
//
//	netproxy -listen 127.0.0.1:19092 -to 127.0.0.1:40123 -latency 2ms
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	to := flag.String("to", "", "address to forward to")
	latency := flag.Duration("latency", 0, "latency added each way")
	flag.Parse()
	if *to == "" {
		fmt.Fprintln(os.Stderr, "netproxy: -to is required: the address to forward to")
		os.Exit(2)
	}
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	px := toxiproxy.NewProxy(srv, "link", *listen, *to)
	if err := px.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "netproxy: listen on %s: %v\n", *listen, err)
		os.Exit(1)
	}
	defer px.Stop()
	if *latency > 0 {
		for _, stream := range []string{"upstream", "downstream"} {
			js := fmt.Sprintf(`{"name": "latency_%s", "type": "latency", "stream": %q, "toxicity": 1, "attributes": {"latency": %d}}`,
				stream, stream, latency.Milliseconds())
			if _, err := px.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
				fmt.Fprintf(os.Stderr, "netproxy: add latency: %v\n", err)
				os.Exit(1)
			}
		}
	}
	fmt.Printf("netproxy: %s -> %s, %s each way\n", px.Listen, *to, latency.Round(time.Millisecond))
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}
