package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestPostgresTLS streams from a Postgres with ssl=on that only accepts the
// connector over TLS: with sslmode=verify-full and a password from
// postgres.password_file, and with a client certificate. A plaintext
// connection and a wrong CA are refused.
func TestPostgresTLS(t *testing.T) {
	testenv.Require(t, pg)
	certs := testenv.NewCerts(t)
	srv := testenv.TLSPostgres(t, certs, `local all all trust
hostnossl all postgres 127.0.0.1/32 trust
hostssl all cdc_pw 127.0.0.1/32 scram-sha-256
hostssl all cdc 127.0.0.1/32 cert
`)
	admin := srv.URL
	testenv.Exec(t, admin, schema,
		`CREATE ROLE cdc_pw LOGIN REPLICATION PASSWORD 'tls-secret'`, `CREATE ROLE cdc LOGIN REPLICATION`,
		`GRANT SELECT ON outbox TO cdc_pw, cdc`, `CREATE PUBLICATION outbox_cdc FOR TABLE outbox WITH (publish = 'insert')`)
	pwFile := filepath.Join(t.TempDir(), "pgpass")
	if err := os.WriteFile(pwFile, []byte("tls-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf("postgres://%%s@localhost:%d/postgres?sslmode=verify-full&sslrootcert=%s", srv.Port, certs.CAFile)
	byPassword := fmt.Sprintf(base, "cdc_pw")
	byCert := fmt.Sprintf(base, "cdc") + "&sslcert=" + certs.ClientCert + "&sslkey=" + certs.ClientKey

	ctx := context.Background()
	if _, err := postgres.ConnectSQL(ctx, postgres.Config{URL: strings.Replace(byPassword, "verify-full", "disable", 1), PasswordFile: pwFile}); err == nil ||
		!strings.Contains(err.Error(), "no pg_hba.conf entry") {
		t.Fatalf("a plaintext connection: %v; want it refused", err)
	}
	other := testenv.NewCerts(t)
	if _, err := postgres.ConnectSQL(ctx, postgres.Config{URL: strings.Replace(byPassword, certs.CAFile, other.CAFile, 1), PasswordFile: pwFile}); err == nil ||
		!strings.Contains(err.Error(), "certificate") {
		t.Fatalf("an untrusted server certificate: %v; want it refused", err)
	}

	// The connector itself, with the wrong CA, stops at once with one
	// line naming sslrootcert (it used to retry for ever).
	k := testenv.NewKafka(t)
	e := &env{db: admin, kafka: k, cfg: newEnvConfig(admin, k)}
	e.cfg.Postgres = postgres.Config{URL: strings.Replace(byPassword, certs.CAFile, other.CAFile, 1), PasswordFile: pwFile, Slot: "tls_wrong_ca"}
	e.logLevel = hclog.Trace
	// The error is returned, not logged: it is checked below.
	r := e.launch(t, sweptLog(t, 0, "tls-secret"))
	err := waitFatal(t, r)
	var tlsErr *postgres.TLSError
	if !errors.As(err, &tlsErr) || !strings.Contains(err.Error(), "sslrootcert") || strings.Contains(err.Error(), "\n") || strings.Contains(err.Error(), "tls-secret") {
		t.Fatalf("a wrong CA: %v; want a fatal one-line error naming sslrootcert", err)
	}
	// At once: the first session's failure, not one after retries.
	if n := counterValue(r.p.Metrics().Restarts); n != 0 {
		t.Errorf("a wrong CA stopped the connector after %v sessions retried; want at once", n)
	}

	for i, tc := range []struct {
		name string
		cfg  postgres.Config
	}{
		{"verify-full and a password file", postgres.Config{URL: byPassword, PasswordFile: pwFile}},
		{"a client certificate", postgres.Config{URL: byCert}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := testenv.NewKafka(t)
			e := &env{db: admin, kafka: k, cfg: newEnvConfig(admin, k)}
			e.cfg.Postgres = tc.cfg
			e.cfg.Postgres.Slot = fmt.Sprintf("tls_%d", i)
			e.cfg.Postgres.StatusInterval = 50 * time.Millisecond
			e.logLevel, e.logOut = hclog.Trace, sweptLog(t, 5, "tls-secret")
			e.start(t)
			id := insertEvent(t, testenv.Connect(t, admin), fmt.Sprintf("tls-%d", i), "OverTLS")
			c := k.NewConsumer(t, k.AllTopics())
			c.WaitFor(t, time.Minute, "the event", func(recs []*kgo.Record) bool { return ids(recs)[id] > 0 })
			var ssl bool
			testenv.QueryRow(t, admin, `SELECT bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_replication r USING (pid) WHERE r.application_name = 'outbox-cdc'`, nil, &ssl)
			if !ssl {
				t.Fatal("the replication connection is not encrypted")
			}
		})
	}
}
