package sink

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/outboxcdc/cdc/internal/secret"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/aws"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// TLSConfig configures TLS to the brokers.
type TLSConfig struct {
	// Enabled turns TLS on. Setting any file below turns it on too.
	Enabled bool `yaml:"enabled"`
	// CAFile is a PEM file of the CAs that sign the brokers' certificates.
	// Default: the system's roots.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are a PEM client certificate and its key, for
	// brokers that authenticate clients by certificate (mTLS).
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName overrides the name checked in the brokers' certificates.
	// Default: each broker's host.
	ServerName string `yaml:"server_name"`
}

// The SASL mechanisms.
const (
	SASLPlain       = "PLAIN"
	SASLScram256    = "SCRAM-SHA-256"
	SASLScram512    = "SCRAM-SHA-512"
	SASLOAuthBearer = "OAUTHBEARER"
	SASLAWSMSKIAM   = "AWS_MSK_IAM"
)

// SASLConfig configures SASL authentication. Secrets are never logged.
type SASLConfig struct {
	// Mechanism is one of the SASL constants; "" turns SASL off.
	Mechanism string `yaml:"mechanism"`
	// Username and Password authenticate PLAIN and SCRAM. PasswordFile,
	// when set, is read at every authentication instead, so a rotated
	// password is picked up without a restart.
	Username     string `yaml:"username"`
	Password     string `yaml:"password"`
	PasswordFile string `yaml:"password_file"`
	// TokenFile holds the OAUTHBEARER token; it is read at every
	// authentication, so a token refreshed on disk is picked up.
	TokenFile string `yaml:"token_file"`
}

// validateSecurity reports a security configuration error, naming the key to fix.
func (c *Config) validateSecurity() error {
	if err := c.TLS.Check("kafka.tls"); err != nil {
		return err
	}
	s := &c.SASL
	s.Mechanism = strings.ToUpper(s.Mechanism)
	switch s.Mechanism {
	case "":
		if s.Username != "" || s.Password != "" || s.PasswordFile != "" || s.TokenFile != "" {
			return errors.New("kafka.sasl has credentials but no mechanism; set kafka.sasl.mechanism to PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER or AWS_MSK_IAM")
		}
	case SASLPlain, SASLScram256, SASLScram512:
		if s.Username == "" {
			return fmt.Errorf("kafka.sasl.mechanism %s needs kafka.sasl.username", s.Mechanism)
		}
		if s.Password == "" && s.PasswordFile == "" {
			return fmt.Errorf("kafka.sasl.mechanism %s needs a password: kafka.sasl.password_file, or CDC_KAFKA_SASL_PASSWORD", s.Mechanism)
		}
		if s.PasswordFile != "" {
			if _, err := secret.Read(s.PasswordFile); err != nil {
				return fmt.Errorf("kafka.sasl.password_file: %v", err)
			}
		}
	case SASLOAuthBearer:
		if s.TokenFile == "" {
			return errors.New("kafka.sasl.mechanism OAUTHBEARER needs kafka.sasl.token_file, a file holding the token (refreshed on disk by your token agent)")
		}
		if _, err := secret.Read(s.TokenFile); err != nil {
			return fmt.Errorf("kafka.sasl.token_file: %v", err)
		}
	case SASLAWSMSKIAM:
		if s.Username != "" || s.Password != "" || s.PasswordFile != "" {
			return errors.New("kafka.sasl.mechanism AWS_MSK_IAM takes its credentials from the standard AWS chain (AWS_ACCESS_KEY_ID, a profile, the instance or task role); remove kafka.sasl.username and password")
		}
	default:
		return fmt.Errorf("kafka.sasl.mechanism %q: use PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER or AWS_MSK_IAM", s.Mechanism)
	}
	return nil
}

// securityOpts returns the franz-go options for TLS and SASL.
func securityOpts(cfg Config) ([]kgo.Opt, error) {
	var opts []kgo.Opt
	if cfg.TLS.Enabled {
		tc, err := cfg.TLS.Build("kafka.tls")
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	if m := saslMechanism(cfg.SASL); m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}

// Check turns TLS on when any of its settings is set, and reports a
// certificate without its key (or the reverse) or a file that cannot be
// read; key is where c sits in the config file ("kafka.tls").
func (c *TLSConfig) Check(key string) error {
	if c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" || c.ServerName != "" {
		c.Enabled = true
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return fmt.Errorf("%s.cert_file and %s.key_file go together: set both for a client certificate, or neither", key, key)
	}
	for name, f := range map[string]string{"ca_file": c.CAFile, "cert_file": c.CertFile, "key_file": c.KeyFile} {
		if f != "" {
			if _, err := os.Stat(f); err != nil {
				return fmt.Errorf("%s.%s: %v", key, name, err)
			}
		}
	}
	return nil
}

// Build returns the tls.Config c describes; key is where c sits in the
// config file ("kafka.tls"), for the errors. The schema registry's client
// uses it too.
func (c TLSConfig) Build(key string) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%s.ca_file: %v", key, err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s.ca_file %s holds no PEM certificate", key, c.CAFile)
		}
	}
	if c.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%s.cert_file and key_file: %v", key, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

func saslMechanism(c SASLConfig) sasl.Mechanism {
	password := func() (string, error) {
		if c.PasswordFile != "" {
			p, err := secret.Read(c.PasswordFile)
			if err != nil {
				return "", fmt.Errorf("kafka.sasl.password_file: %v", err)
			}
			return p, nil
		}
		return c.Password, nil
	}
	switch c.Mechanism {
	case SASLPlain:
		return plain.Plain(func(context.Context) (plain.Auth, error) {
			p, err := password()
			return plain.Auth{User: c.Username, Pass: p}, err
		})
	case SASLScram256, SASLScram512:
		fn := func(context.Context) (scram.Auth, error) {
			p, err := password()
			return scram.Auth{User: c.Username, Pass: p}, err
		}
		if c.Mechanism == SASLScram256 {
			return scram.Sha256(fn)
		}
		return scram.Sha512(fn)
	case SASLOAuthBearer:
		return oauth.Oauth(func(context.Context) (oauth.Auth, error) {
			tok, err := secret.Read(c.TokenFile)
			if err != nil {
				return oauth.Auth{}, fmt.Errorf("kafka.sasl.token_file: %v", err)
			}
			return oauth.Auth{Token: tok}, nil
		})
	case SASLAWSMSKIAM:
		return aws.ManagedStreamingIAM(awsCredentials())
	}
	return nil
}

// awsCredentials resolves credentials with the standard AWS chain
// (environment, shared config and profiles, web identity, the ECS task or
// EC2 instance role), loaded once; the SDK's provider caches and refreshes
// them.
func awsCredentials() func(context.Context) (aws.Auth, error) {
	var (
		once     sync.Once
		provider awssdk.CredentialsProvider
		loadErr  error
	)
	return func(ctx context.Context) (aws.Auth, error) {
		once.Do(func() {
			cfg, err := awsconfig.LoadDefaultConfig(ctx)
			provider, loadErr = cfg.Credentials, err
		})
		if loadErr != nil {
			return aws.Auth{}, fmt.Errorf("load the AWS configuration for AWS_MSK_IAM: %v", loadErr)
		}
		v, err := provider.Retrieve(ctx)
		if err != nil {
			return aws.Auth{}, fmt.Errorf("get AWS credentials for AWS_MSK_IAM (environment, profile, or instance or task role): %v", err)
		}
		return aws.Auth{AccessKey: v.AccessKeyID, SecretKey: v.SecretAccessKey, SessionToken: v.SessionToken, UserAgent: "outbox-cdc"}, nil
	}
}

// ConnectError is a failure to reach or authenticate to Kafka that a
// setting must fix: retrying the same settings cannot help. It names the
// setting and never the secret.
type ConnectError struct {
	Msg string
	Err error
}

func (e *ConnectError) Error() string { return e.Msg }
func (e *ConnectError) Unwrap() error { return e.Err }

// classifyConnect turns authentication and certificate failures into a
// *ConnectError that names the setting to fix; other errors are returned
// as they are (a broker down is worth retrying).
func classifyConnect(cfg Config, err error) error {
	if err == nil {
		return nil
	}
	var unknownCA x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	var recordHeader tls.RecordHeaderError
	switch {
	case errors.Is(err, kerr.SaslAuthenticationFailed):
		what := "kafka.sasl.username and kafka.sasl.password (or password_file, CDC_KAFKA_SASL_PASSWORD)"
		switch cfg.SASL.Mechanism {
		case SASLOAuthBearer:
			what = "the token in kafka.sasl.token_file"
		case SASLAWSMSKIAM:
			what = "the AWS credentials (environment, profile or role) and their kafka-cluster IAM policy"
		}
		return &ConnectError{Err: err, Msg: fmt.Sprintf("kafka rejected the SASL %s credentials (SASL_AUTHENTICATION_FAILED): check %s", cfg.SASL.Mechanism, what)}
	case errors.Is(err, kerr.UnsupportedSaslMechanism), errors.Is(err, kerr.IllegalSaslState):
		return &ConnectError{Err: err, Msg: fmt.Sprintf("the brokers do not accept SASL mechanism %s: set kafka.sasl.mechanism to one their listener enables", cfg.SASL.Mechanism)}
	case errors.As(err, &unknownCA):
		where := "the system's roots"
		if cfg.TLS.CAFile != "" {
			where = cfg.TLS.CAFile
		}
		return &ConnectError{Err: err, Msg: fmt.Sprintf("the broker's TLS certificate is signed by an authority not in %s: set kafka.tls.ca_file to the CA that signs the brokers' certificates", where)}
	case errors.As(err, &hostname):
		return &ConnectError{Err: err, Msg: fmt.Sprintf("the broker's TLS certificate does not name the host the connector dialed (%v): fix kafka.brokers, or set kafka.tls.server_name to the name in the certificate", hostname.Host)}
	case errors.As(err, &invalid):
		return &ConnectError{Err: err, Msg: fmt.Sprintf("the broker's TLS certificate is not valid (%v): check it, and kafka.tls.ca_file", invalid.Reason)}
	case errors.As(err, &recordHeader):
		return &ConnectError{Err: err, Msg: "the broker did not answer TLS: it is a plaintext listener; turn kafka.tls off, or point kafka.brokers at the TLS listener"}
	case strings.Contains(err.Error(), "invalid large response size"):
		// franz-go reads the first four bytes of the answer as a Kafka
		// response's length: from an HTTP server, "HTTP" is 1.2 GB.
		return &ConnectError{Err: err, Msg: fmt.Sprintf("the address in kafka.brokers (%s) does not speak the Kafka protocol: something else answered there (an HTTP server, a Schema Registry, a broker's controller or JMX port); point kafka.brokers at the brokers' client listener", strings.Join(cfg.Brokers, ", "))}
	case cfg.SASL.Mechanism == "" && isEOF(err):
		// A SASL listener closes the connection on a client that does not
		// authenticate.
		return fmt.Errorf("%w; if the listener needs SASL, set kafka.sasl", err)
	case isEOF(err):
		// Some brokers close the connection on bad credentials instead of
		// answering SASL_AUTHENTICATION_FAILED. So does a broker that is
		// restarting, so this one is retried.
		return fmt.Errorf("%w; if this repeats, the brokers may be rejecting the kafka.sasl credentials", err)
	}
	return err
}

func isEOF(err error) bool {
	var op *net.OpError
	return strings.Contains(err.Error(), "EOF") || errors.As(err, &op) && strings.Contains(op.Err.Error(), "reset")
}

// Weaknesses lists what in the Kafka settings sends a secret in clear
// text, one line each, for the start-up log and cdc check: SASL PLAIN's
// password or an OAUTHBEARER token without TLS.
func (c Config) Weaknesses() []string {
	tlsOn := c.TLS.Enabled || c.TLS.CAFile != "" || c.TLS.CertFile != ""
	switch m := c.SASL.Mechanism; {
	case tlsOn:
		return nil
	case m == SASLPlain:
		return []string{"kafka.sasl.mechanism PLAIN without kafka.tls: the password crosses the network in clear text; turn on kafka.tls (or use SCRAM)"}
	case m == SASLOAuthBearer:
		return []string{"kafka.sasl.mechanism OAUTHBEARER without kafka.tls: the token crosses the network in clear text; turn on kafka.tls"}
	}
	return nil
}
