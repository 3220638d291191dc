package sink

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestSecurityAgainstKfake: SCRAM and PLAIN over TLS reach a kfake cluster
// that requires them; a wrong password and an untrusted certificate give a
// *ConnectError naming the setting, and never the password.
func TestSecurityAgainstKfake(t *testing.T) {
	certs := testenv.NewCerts(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic), kfake.EnableSASL(),
		kfake.Superuser(SASLScram256, "cdc", "s3cret-256"), kfake.Superuser(SASLScram512, "cdc512", "s3cret-512"),
		kfake.Superuser(SASLPlain, "plainuser", "s3cret-plain"), kfake.TLS(certs.ServerTLS(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	pwFile := filepath.Join(t.TempDir(), "pw")
	os.WriteFile(pwFile, []byte("s3cret-512\n"), 0o600)
	tlsOn := TLSConfig{CAFile: certs.CAFile}
	ping := func(cfg Config) error {
		cfg.Brokers = c.ListenAddrs()
		if err := cfg.Validate(); err != nil {
			return err
		}
		k, err := New(cfg, hclog.NewNullLogger(), kgo.RetryTimeout(2*time.Second))
		if err != nil {
			return err
		}
		defer k.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := k.Ping(ctx); err != nil {
			return err
		}
		done := make(chan error, 1)
		k.Produce(&kgo.Record{Topic: topic, Value: []byte("x")}, func(err error) { done <- err })
		return <-done
	}
	// kfake closes the connection on a bad password, where Apache Kafka
	// answers SASL_AUTHENTICATION_FAILED (realkafka_test pins that one).
	if err := ping(Config{TLS: tlsOn, SASL: SASLConfig{Mechanism: SASLScram256, Username: "cdc", Password: "wrong-pw"}}); err == nil ||
		!strings.Contains(err.Error(), "kafka.sasl credentials") || strings.Contains(err.Error(), "wrong-pw") {
		t.Fatalf("wrong password on kfake: %v", err)
	}
	for _, tt := range []struct {
		name string
		cfg  Config
		want string // "" for success
	}{
		{"scram-sha-256", Config{TLS: tlsOn, SASL: SASLConfig{Mechanism: "scram-sha-256", Username: "cdc", Password: "s3cret-256"}}, ""},
		{"scram-sha-512 from a password file", Config{TLS: tlsOn, SASL: SASLConfig{Mechanism: SASLScram512, Username: "cdc512", PasswordFile: pwFile}}, ""},
		{"plain", Config{TLS: tlsOn, SASL: SASLConfig{Mechanism: SASLPlain, Username: "plainuser", Password: "s3cret-plain"}}, ""},
		{"untrusted certificate", Config{TLS: TLSConfig{Enabled: true}, SASL: SASLConfig{Mechanism: SASLScram256, Username: "cdc", Password: "s3cret-256"}}, "set kafka.tls.ca_file to the CA that signs the brokers' certificates"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := ping(tt.cfg)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("err = %v", err)
				}
				return
			}
			var ce *ConnectError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "wrong-pw") || strings.Contains(err.Error(), "\n") {
				t.Fatalf("err = %v; want a one-line *ConnectError saying %q, without the password", err, tt.want)
			}
		})
	}
}

// TestSecurityConfigErrors: each bad setting is named.
func TestSecurityConfigErrors(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tok, []byte("t"), 0o600)
	for _, tt := range []struct {
		cfg  Config
		want string
	}{
		{Config{SASL: SASLConfig{Mechanism: "GSSAPI"}}, `kafka.sasl.mechanism "GSSAPI"`},
		{Config{SASL: SASLConfig{Mechanism: SASLScram256, Password: "p"}}, "needs kafka.sasl.username"},
		{Config{SASL: SASLConfig{Mechanism: SASLPlain, Username: "u"}}, "needs a password"},
		{Config{SASL: SASLConfig{Username: "u", Password: "p"}}, "no mechanism"},
		{Config{SASL: SASLConfig{Mechanism: SASLOAuthBearer}}, "needs kafka.sasl.token_file"},
		{Config{SASL: SASLConfig{Mechanism: SASLOAuthBearer, TokenFile: "/nonexistent"}}, "kafka.sasl.token_file"},
		{Config{SASL: SASLConfig{Mechanism: SASLAWSMSKIAM, Username: "u"}}, "standard AWS chain"},
		{Config{TLS: TLSConfig{CertFile: "x.pem"}}, "go together"},
		{Config{TLS: TLSConfig{CAFile: "/nonexistent/ca.pem"}}, "kafka.tls.ca_file"},
	} {
		tt.cfg.Brokers = []string{"k:9092"}
		if err := tt.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: err = %v, want %q", tt.cfg, err, tt.want)
		}
	}
	ok := Config{Brokers: []string{"k:9092"}, SASL: SASLConfig{Mechanism: SASLOAuthBearer, TokenFile: tok}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestOAuthTokenFileIsReread: the OAUTHBEARER token is read at each
// authentication, so a token refreshed on disk is used by new connections.
func TestOAuthTokenFileIsReread(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tok, []byte("first\n"), 0o600)
	m := saslMechanism(SASLConfig{Mechanism: SASLOAuthBearer, TokenFile: tok})
	first := func() string {
		_, msg, err := m.Authenticate(context.Background(), "k:9092")
		if err != nil {
			t.Fatal(err)
		}
		return string(msg)
	}
	if got := first(); !strings.Contains(got, "auth=Bearer first") {
		t.Fatalf("first auth message %q", got)
	}
	os.WriteFile(tok, []byte("second"), 0o600)
	if got := first(); !strings.Contains(got, "auth=Bearer second") {
		t.Fatalf("after the file changed: %q", got)
	}
	if m.Name() != SASLOAuthBearer {
		t.Fatal(m.Name())
	}
	if aws := saslMechanism(SASLConfig{Mechanism: SASLAWSMSKIAM}); aws.Name() != SASLAWSMSKIAM {
		t.Fatal(aws.Name())
	}
}

// TestWeaknesses (issue 24): SASL PLAIN and OAUTHBEARER without TLS are
// named; SCRAM, or anything over TLS, is not.
func TestWeaknesses(t *testing.T) {
	for _, tt := range []struct {
		cfg  Config
		want string
	}{
		{Config{SASL: SASLConfig{Mechanism: SASLPlain}}, "PLAIN without kafka.tls"},
		{Config{SASL: SASLConfig{Mechanism: SASLOAuthBearer}}, "OAUTHBEARER without kafka.tls"},
		{Config{SASL: SASLConfig{Mechanism: SASLPlain}, TLS: TLSConfig{Enabled: true}}, ""},
		{Config{SASL: SASLConfig{Mechanism: SASLScram512}}, ""},
		{Config{}, ""},
	} {
		got := strings.Join(tt.cfg.Weaknesses(), "; ")
		if tt.want == "" && got != "" || tt.want != "" && !strings.Contains(got, tt.want) {
			t.Errorf("%+v: %q; want %q", tt.cfg.SASL, got, tt.want)
		}
	}
}
