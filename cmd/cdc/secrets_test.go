package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/outboxcdc/cdc/internal/sink"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestNoSecretInLogs runs the cdc binary with every secret it can hold, at
// trace level with franz-go's wire log on, against a Postgres that takes
// the role's password over verify-full TLS only and a Kafka that takes
// SCRAM over TLS only: check, run (an event, a signed backfill, the HTTP
// endpoint with and without the token), status, and the failures a secret
// causes (a wrong Kafka password, a wrong Postgres password, a password in
// a malformed URL). No line of any of them holds a secret, right or wrong.
func TestNoSecretInLogs(t *testing.T) {
	testenv.Require(t, pg)
	const (
		pgSecret, pgWrong       = "pgSecret-7f3a1c", "pgWrong-0b9d44"
		kafkaSecret, kafkaWrong = "kafkaSecret-91c2e7", "kafkaWrong-55e1aa"
		signingKey              = "signingKey-3d6f0c2b8a9e4d1f7c5b9a"
		token, tokenWrong       = "httpToken-a41b9c", "httpWrong-2e7d30"
	)
	secrets := []string{pgSecret, pgWrong, kafkaSecret, kafkaWrong, signingKey, token, tokenWrong}

	certs := testenv.NewCerts(t)
	srv := testenv.TLSPostgres(t, certs, `local all all trust
hostnossl all postgres 127.0.0.1/32 trust
hostssl all cdc_sec 127.0.0.1/32 scram-sha-256
`)
	testenv.Exec(t, srv.URL, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`,
		`INSERT INTO outbox (aggregatetype, aggregateid, type, payload) SELECT 'order', 'before-' || s, 'Placed', '{}' FROM generate_series(1, 20) s`,
		`CREATE ROLE cdc_sec LOGIN REPLICATION PASSWORD '`+pgSecret+`'`, `GRANT SELECT ON outbox TO cdc_sec`, `GRANT pg_read_all_stats TO cdc_sec`,
		`CREATE PUBLICATION outbox_cdc FOR TABLE outbox WITH (publish = 'insert')`)

	kafka := testenv.NewFakeKafka(t, kfake.EnableSASL(), kfake.Superuser(sink.SASLScram512, "cdc", kafkaSecret), kfake.TLS(certs.ServerTLS(t)))
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pgURL := fmt.Sprintf("postgres://cdc_sec@localhost:%d/postgres?sslmode=verify-full&sslrootcert=%s", srv.Port, certs.CAFile)
	pgPass, pgPassWrong := file("pg.pass", pgSecret), file("pg.wrong", pgWrong)
	kafkaPass, kafkaPassWrong := file("kafka.pass", kafkaSecret), file("kafka.wrong", kafkaWrong)
	keyFile, tokenFile := file("signing.key", signingKey), file("http.token", token)
	config := func(name, pgFields, kafkaPassFile string) string {
		return file(name, fmt.Sprintf(`
postgres: {%s, status_interval: 50ms}
kafka:
  brokers: [%s]
  tls: {ca_file: %s}
  sasl: {mechanism: SCRAM-SHA-512, username: cdc, password_file: %s}
tables: [{name: outbox, topic: %q}]
checkpoint: {topic: %s, signing_key_file: %s}
http: {listen: "127.0.0.1:0", token_file: %s}
log: {level: trace, kafka: debug}
`, pgFields, strings.Join(kafka.Brokers, ", "), certs.CAFile, kafkaPassFile,
			kafka.Prefix+"outbox.event.{aggregate_type}", kafka.CheckpointTopic(), keyFile, tokenFile))
	}
	good := config("good.yaml", fmt.Sprintf("url: %q, password_file: %s", pgURL, pgPass), kafkaPass)

	var outputs []*proc
	// finish runs a command to its end and keeps its output for the sweep.
	finish := func(wantOK bool, args ...string) *proc {
		t.Helper()
		p := startCmd(t, args...)
		done := make(chan error, 1)
		go func() { done <- p.cmd.Wait() }()
		var err error
		select {
		case err = <-done:
		case <-time.After(time.Minute):
			p.cmd.Process.Kill()
			<-done
			t.Fatalf("cdc %s did not end within a minute:\n%s", strings.Join(args, " "), p.out)
		}
		if (err == nil) != wantOK {
			t.Fatalf("cdc %s: %v (want success %v):\n%s", strings.Join(args, " "), err, wantOK, p.out)
		}
		outputs = append(outputs, p)
		return p
	}

	finish(true, "check", "--config", good)

	run := startProc(t, good)
	outputs = append(outputs, run)
	base := endpointOf(t, run)
	testenv.Eventually(t, time.Minute, "the connector to stream", func() bool {
		return strings.Contains(run.out.String(), "streaming from replication slot")
	})
	testenv.Exec(t, srv.URL, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'after-1', 'Placed', '{}')`)
	for _, tok := range []string{"", tokenWrong, token} {
		testenv.Get(t, base+"/readyz", tok)
		testenv.Get(t, base+"/metrics", tok)
	}
	finish(true, "backfill", "--config", good, "--table", "outbox", "--no-wait")

	// Everything arrived, read over SCRAM and TLS: 20 backfilled rows and
	// the event, so the run did the work whose logs are swept.
	pool := x509.NewCertPool()
	ca, err := os.ReadFile(certs.CAFile)
	if err != nil || !pool.AppendCertsFromPEM(ca) {
		t.Fatalf("read the CA: %v", err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.Brokers...), kgo.ConsumeRegex(), kgo.ConsumeTopics(kafka.AllTopics()),
		kgo.DialTLSConfig(&tls.Config{RootCAs: pool}), kgo.MetadataMinAge(100*time.Millisecond), kgo.MetadataMaxAge(time.Second),
		kgo.SASL(scram.Auth{User: "cdc", Pass: kafkaSecret}.AsSha512Mechanism()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	keys := map[string]bool{}
	deadline := time.Now().Add(time.Minute)
	for len(keys) < 21 && time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachError(func(topic string, _ int32, err error) { t.Logf("consume %s: %v", topic, err) })
		fs.EachRecord(func(r *kgo.Record) { keys[string(r.Key)] = true })
	}
	if len(keys) != 21 || !keys["after-1"] || !keys["before-20"] {
		t.Fatalf("read %d distinct keys over SCRAM and TLS; want the 20 backfilled rows and the event", len(keys))
	}
	finish(true, "status", "--config", good)
	run.cmd.Process.Signal(syscall.SIGTERM)
	if err := run.cmd.Wait(); err != nil {
		t.Fatalf("cdc run after SIGTERM: %v:\n%s", err, run.out)
	}

	// The failures a secret causes, each ending with one line.
	wrongKafka := config("wrong-kafka.yaml", fmt.Sprintf("url: %q, password_file: %s", pgURL, pgPass), kafkaPassWrong)
	wrongPG := config("wrong-pg.yaml", fmt.Sprintf("url: %q, password_file: %s", pgURL, pgPassWrong), kafkaPass)
	inURL := config("in-url.yaml", fmt.Sprintf("url: %q", strings.Replace(pgURL, "cdc_sec@", "cdc_sec:"+pgWrong+"@", 1)), kafkaPass)
	malformed := config("malformed.yaml", fmt.Sprintf("url: %q", "postgres://cdc_sec:"+pgSecret+"@localhost:port/postgres"), kafkaPass)
	for _, cfg := range []string{wrongKafka, wrongPG, inURL, malformed} {
		finish(false, "check", "--config", cfg)
	}
	finish(false, "run", "--config", wrongPG)
	finish(false, "run", "--config", malformed)
	// kfake drops the connection on a wrong password where Apache Kafka
	// answers SASL_AUTHENTICATION_FAILED (TestRealSecuredKafka pins that it
	// is fatal there), so here the connector retries: sweep its first
	// failure and stop it.
	retrying := startProc(t, wrongKafka)
	outputs = append(outputs, retrying)
	testenv.Eventually(t, time.Minute, "the wrong Kafka password to fail a session", func() bool {
		return strings.Contains(retrying.out.String(), "session failed")
	})
	retrying.cmd.Process.Signal(syscall.SIGTERM)
	retrying.cmd.Wait()

	for _, p := range outputs {
		out := p.out.String()
		for i, line := range strings.Split(out, "\n") {
			for _, s := range secrets {
				if strings.Contains(line, s) {
					t.Errorf("cdc %s, line %d, shows a secret: %s", strings.Join(p.cmd.Args[1:], " "), i+1, line)
				}
			}
		}
	}
	// The sweep read what it should: trace lines, franz-go's wire log and
	// the failures' own lines.
	all := ""
	for _, p := range outputs {
		all += p.out.String()
	}
	for _, want := range []string{"[TRACE]", "SASL", "SQLSTATE 28P01", "postgres.url does not parse", "kafka.sasl"} {
		if !strings.Contains(all, want) {
			t.Errorf("no output says %q: the sweep did not read what it meant to", want)
		}
	}
	if t.Failed() {
		t.Logf("outputs:\n%s", all)
	}
}
