package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/localpg"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestPostgresRefusalIsFatal: Postgres refusing the connector (a wrong
// password, no pg_hba.conf entry) stops it at start with one line that
// names the setting and never the password. Once it has streamed, a
// refusal is retried a bounded number of times (a password rotation),
// then it stops.
func TestPostgresRefusalIsFatal(t *testing.T) {
	testenv.Require(t, pg)
	srv, err := localpg.StartWith(localpg.Options{
		Settings: []string{"password_encryption=scram-sha-256"},
		HBA: `local all all trust
host all postgres 127.0.0.1/32 trust
host all cdc_pw 127.0.0.1/32 scram-sha-256
`,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	admin := srv.URL
	testenv.Exec(t, admin, schema,
		`CREATE ROLE cdc_pw LOGIN REPLICATION PASSWORD 'right-secret'`, `CREATE ROLE cdc_nohba LOGIN REPLICATION PASSWORD 'nohba-secret'`,
		`GRANT SELECT ON outbox TO cdc_pw`, `CREATE PUBLICATION outbox_cdc FOR TABLE outbox WITH (publish = 'insert')`)
	url := func(user, password string) string {
		return fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/postgres?sslmode=disable", user, password, srv.Port)
	}

	for _, tc := range []struct {
		name, user, password, want string
	}{
		{"wrong password", "cdc_pw", "wrong-secret", `rejected the password of role "cdc_pw" (SQLSTATE 28P01): fix the password in postgres.url or postgres.password_file`},
		{"no pg_hba.conf entry", "cdc_nohba", "nohba-secret", `refused role "cdc_nohba": no pg_hba.conf entry`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := testenv.NewKafka(t)
			e := &env{db: admin, kafka: k, cfg: newEnvConfig(admin, k)}
			e.cfg.Postgres.URL = url(tc.user, tc.password)
			r := e.launch(t, &testenv.Buffer{})
			var err error
			select {
			case err = <-r.done:
				close(r.done)
			case <-time.After(time.Minute):
				t.Fatal("the connector is still retrying after a minute; want it to stop at once")
			}
			var auth *postgres.AuthError
			if !errors.As(err, &auth) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v; want an AuthError saying %q", err, tc.want)
			}
			if msg := err.Error(); strings.Contains(msg, "\n") || strings.Contains(msg, tc.password) {
				t.Fatalf("err = %q: want one line, without the password", msg)
			}
		})
	}

	t.Run("after streaming, bounded", func(t *testing.T) {
		k := testenv.NewKafka(t)
		e := &env{db: admin, kafka: k, cfg: newEnvConfig(admin, k)}
		e.cfg.Postgres.URL = url("cdc_pw", "right-secret")
		e.cfg.Postgres.Slot = "auth_rotation"
		p, err := pipeline.New(e.cfg, hclog.NewNullLogger(), pipeline.Options{})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() { done <- p.Run(ctx) }()
		testenv.Eventually(t, time.Minute, "the connector to stream", func() bool { return p.State().Streaming })
		id := insertEvent(t, testenv.Connect(t, admin), "rot-1", "BeforeRotation")
		c := k.NewConsumer(t, k.AllTopics())
		c.WaitFor(t, time.Minute, "the event", func(recs []*kgo.Record) bool { return ids(recs)[id] > 0 })

		// The password changes under it, and its session ends.
		testenv.Exec(t, admin, `ALTER ROLE cdc_pw PASSWORD 'rotated'`,
			`SELECT pg_terminate_backend(pid) FROM pg_stat_replication WHERE usename = 'cdc_pw'`)
		select {
		case err = <-done:
		case <-time.After(2 * time.Minute):
			t.Fatal("the connector still retries refused credentials after two minutes")
		}
		if !strings.Contains(err.Error(), "rejected the password") || !strings.Contains(err.Error(), "refused 6 times in a row") {
			t.Fatalf("err = %v; want the refusal, after 6 tries", err)
		}
	})
}

// TestStopDuringBackoffSaysStopped: a SIGTERM while the connector waits to
// reconnect still ends with the stopped line, as a shutdown after a
// session does.
func TestStopDuringBackoffSaysStopped(t *testing.T) {
	k := testenv.NewKafka(t)
	e := &env{kafka: k, cfg: newEnvConfig("postgres://cdc@127.0.0.1:1/app?sslmode=disable&connect_timeout=5", k)}
	e.cfg.RetryBackoff, e.cfg.RetryBackoffMax = time.Hour, time.Hour
	e.logLevel = hclog.Info
	logs := &testenv.Buffer{}
	r := e.launch(t, logs)
	testenv.Eventually(t, time.Minute, "the connector to wait before reconnecting", func() bool {
		return strings.Contains(logs.String(), "session failed; reconnecting")
	})
	if err := r.stop(t); err != nil {
		t.Fatalf("Run returned %v on shutdown, want nil", err)
	}
	if !strings.Contains(logs.String(), "[INFO]  TestStopDuringBackoffSaysStopped: stopped: slot=outbox_cdc") {
		t.Fatalf("no stopped line after a shutdown during backoff:\n%s", logs.String())
	}
}
