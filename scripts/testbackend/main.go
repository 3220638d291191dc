// Command testbackend prints which Postgres and Kafka the integration tests
// will use, from the same chooser they call (internal/testenv), so that a
// test run says which path it took. It starts nothing.
package main

import (
	"fmt"

	"github.com/outboxcdc/cdc/internal/testenv"
)

func main() {
	pg, kafka := testenv.Describe()
	fmt.Printf("integration tests: postgres via %s; kafka via %s\n", pg, kafka)
}
