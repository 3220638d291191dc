package schema

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/outboxcdc/cdc/internal/secret"
	"github.com/outboxcdc/cdc/internal/sink"
)

// Config is schema_registry.
type Config struct {
	// URL is the registry's Confluent-compatible API, e.g.
	// http://registry:8081 or Apicurio's .../apis/ccompat/v7.
	URL string
	// Username with Password or PasswordFile: HTTP basic auth.
	Username, Password, PasswordFile string
	// TokenFile holds a bearer token, read at each request.
	TokenFile string
	TLS       sink.TLSConfig
	// AutoRegister registers tables[].schema.file under a subject that
	// has no schema; off by default.
	AutoRegister bool
	// Timeout bounds one request; DefaultTimeout.
	Timeout time.Duration
	// MissingAfter is how long the registry may keep answering that an
	// event's subject (or pinned version) does not exist before the event
	// is invalid, for its table's on_invalid, rather than waited for: a
	// registry that is down is waited for, however long, but one that
	// answers "no such subject" is the row's problem, which must not hold
	// every table. DefaultMissingAfter.
	MissingAfter time.Duration
	// WaitLimit, when set, is how long an event waits for the registry
	// before the session gives up (and a new one waits again); 0 waits
	// until it answers. Exactly-once sets it below the transaction
	// timeout. Not a file key.
	WaitLimit time.Duration
}

// DefaultTimeout is Config.Timeout's default.
const DefaultTimeout = 10 * time.Second

// DefaultMissingAfter is Config.MissingAfter's default: time to register a
// subject a deploy forgot, short enough that the rest keeps flowing.
const DefaultMissingAfter = time.Minute

// Validate reports a configuration error, naming the key to fix, and fills
// the defaults. needed says whether a table uses the registry.
func (c *Config) Validate(needed bool) error {
	if c.URL == "" {
		if needed {
			return errors.New("a table's schema (json-schema, avro or protobuf) needs schema_registry.url, the registry's Confluent-compatible API")
		}
		return nil
	}
	u, err := url.Parse(c.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("schema_registry.url: use an http:// or https:// URL, such as http://registry:8081")
	}
	if u.User != nil {
		return errors.New("schema_registry.url carries credentials; move them to schema_registry.basic_auth (username and password_file)")
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Timeout < 0 {
		return fmt.Errorf("schema_registry.timeout %s: use a positive duration", c.Timeout)
	}
	if c.MissingAfter == 0 {
		c.MissingAfter = DefaultMissingAfter
	}
	if c.MissingAfter < 100*time.Millisecond {
		return fmt.Errorf("schema_registry.missing_subject_after %s: use at least 100ms (a minute or more in production)", c.MissingAfter)
	}
	if c.Username != "" && c.Password == "" && c.PasswordFile == "" {
		return errors.New("schema_registry.basic_auth.username needs a password: basic_auth.password_file, or CDC_SCHEMA_REGISTRY_BASIC_AUTH_PASSWORD")
	}
	if c.Username == "" && (c.Password != "" || c.PasswordFile != "") {
		return errors.New("schema_registry.basic_auth has a password but no username; set basic_auth.username")
	}
	if c.TokenFile != "" && c.Username != "" {
		return errors.New("schema_registry: set basic_auth or token_file, not both")
	}
	for key, f := range map[string]string{"basic_auth.password_file": c.PasswordFile, "token_file": c.TokenFile} {
		if f != "" {
			if _, err := secret.Read(f); err != nil {
				return fmt.Errorf("schema_registry.%s: %v", key, err)
			}
		}
	}
	return c.TLS.Check("schema_registry.tls")
}

// Weaknesses lists what in the registry's settings sends a secret in clear
// text, for the start-up log: credentials over http://.
func (c Config) Weaknesses() []string {
	if strings.HasPrefix(c.URL, "http://") && (c.Username != "" || c.TokenFile != "") {
		return []string{"schema_registry.url is http:// with credentials: they cross the network in clear text; use https://"}
	}
	return nil
}
