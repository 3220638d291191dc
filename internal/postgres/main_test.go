package postgres_test

import (
	"testing"

	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/testenv"
)

var pg *testenv.Postgres

func TestMain(m *testing.M) { testenv.Main(m, &pg) }

func cfg(url string) postgres.Config {
	c := postgres.Config{URL: url}
	if err := c.Validate(); err != nil {
		panic(err)
	}
	return c
}
