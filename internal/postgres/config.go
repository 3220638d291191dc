package postgres

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/outboxcdc/cdc/internal/opt"
	"github.com/outboxcdc/cdc/internal/secret"
)

// Config configures the replication connection. Its YAML keys are the
// config file's postgres section (docs/config.md).
type Config struct {
	// URL is a libpq connection string or URL for the database that holds
	// the outbox tables. Required. It is never logged. TLS is set in it the
	// libpq way: sslmode=verify-full, sslrootcert, sslcert, sslkey.
	URL string `yaml:"url"`
	// PasswordFile, when set, holds the password; it is read at every
	// connection, so a rotated password is picked up without a restart.
	// It overrides a password in URL (and in PrimaryURL).
	PasswordFile string `yaml:"password_file"`
	// PrimaryURL is the primary of the hot standby URL reaches, when it
	// is one (PostgreSQL 16+): what a standby cannot write goes there
	// (standby.go). Optional; never logged.
	PrimaryURL string `yaml:"primary_url"`
	// Slot is the logical replication slot. Default DefaultSlot.
	Slot string `yaml:"slot"`
	// Publication is the publication the slot streams. Default
	// DefaultPublication.
	Publication string `yaml:"publication"`
	// StatusInterval is how often a standby status update goes out when
	// nothing new is confirmed: the keepalive period. Default
	// DefaultStatusInterval; from 10ms to 30s.
	StatusInterval time.Duration `yaml:"status_interval"`
	// ConfirmInterval is the least time between two status updates that
	// confirm new events: once Kafka has acked, the confirm follows within
	// about this. Default DefaultConfirmInterval; at most StatusInterval.
	ConfirmInterval time.Duration `yaml:"confirm_interval"`
	// ReadBatch is how long a busy stream waits after a read that
	// drained the socket before it reads again (coalescingConn), at most
	// 10ms. Default DefaultReadBatch; 0 reads at once. Read it with
	// ReadBatchDelay.
	ReadBatch opt.Value[time.Duration] `yaml:"read_batch"`
	// OnLive, when set, is told on the stream's goroutine each time the
	// stream turns live or falls behind (coalescingConn's liveAge), and
	// false when a session that was live ends. It is the program's, not
	// the config file's: cdc run sets its GOMAXPROCS with it. Read
	// batching off (ReadBatch 0) turns it off too.
	OnLive func(live bool) `yaml:"-"`
	// ReceiveTimeout is how long the stream may hear nothing from the
	// walsender, while it reads, before it takes the connection for dead
	// and starts a new session: a network that drops packets without a
	// reset (a black hole) looks like a quiet database otherwise. From
	// half of it on, each status update asks the walsender to answer.
	// Default DefaultReceiveTimeout; at least three StatusIntervals.
	ReceiveTimeout time.Duration `yaml:"receive_timeout"`
	// ConnectTimeout bounds opening a connection, when postgres.url sets
	// no connect_timeout: through a black hole a connect would wait for
	// ever. Not a file key; DefaultConnectTimeout.
	ConnectTimeout time.Duration `yaml:"-"`
	// CatalogCheckInterval is how often a session looks in the catalog
	// for a configured table that was dropped and created again, left
	// the publication or vanished (docs/design.md, "Table changes").
	// Default DefaultCatalogCheckInterval.
	CatalogCheckInterval time.Duration `yaml:"catalog_check_interval"`
	// Messages asks pgoutput for logical decoding messages
	// (pg_logical_emit_message); set when a message source is configured.
	Messages bool `yaml:"-"`

	// rowsTimeout is ConnectRows' statement timeout.
	rowsTimeout time.Duration
}

// DefaultSlot and DefaultPublication are Slot's and Publication's
// defaults.
const (
	DefaultSlot        = "outbox_cdc"
	DefaultPublication = "outbox_cdc"
)

// DefaultStatusInterval is StatusInterval's default: well below
// wal_sender_timeout (60 s by default), and often enough for a standby to
// tell a live holder from a frozen one within seconds.
const DefaultStatusInterval = time.Second

// DefaultConfirmInterval is ConfirmInterval's default: short enough that a
// drain ends at Kafka's pace, long enough that a busy stream confirms (and
// writes checkpoints) at most 50 times a second.
const DefaultConfirmInterval = 20 * time.Millisecond

// DefaultReceiveTimeout is ReceiveTimeout's default: half of Postgres'
// default wal_sender_timeout, so the connector notices a dead link before
// the server does.
const DefaultReceiveTimeout = 30 * time.Second

// DefaultConnectTimeout is ConnectTimeout's default.
const DefaultConnectTimeout = 15 * time.Second

// DefaultCatalogCheckInterval is CatalogCheckInterval's default: a
// recreated table is published again within seconds, for one cheap query.
const DefaultCatalogCheckInterval = 5 * time.Second

// DefaultReadBatch is ReadBatch's default: a small part of a busy
// stream's latency, and reads of tens of messages instead of one each.
const DefaultReadBatch = time.Millisecond

var nameRE = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// Validate reports a configuration error and fills defaults.
func (c *Config) Validate() error {
	if c.URL == "" {
		return errors.New("postgres.url is empty; set it in the config file or in CDC_POSTGRES_URL")
	}
	if _, err := c.ConnConfig(); err != nil {
		return err
	}
	if c.PrimaryURL != "" {
		if _, err := pgconn.ParseConfig(c.PrimaryURL); err != nil {
			return fmt.Errorf("postgres.primary_url does not parse: %s", redact(err))
		}
	}
	if c.Slot == "" {
		c.Slot = DefaultSlot
	}
	if c.Publication == "" {
		c.Publication = DefaultPublication
	}
	if !nameRE.MatchString(c.Slot) {
		return fmt.Errorf("postgres.slot %q: use 1 to 63 lower-case letters, digits and underscores", c.Slot)
	}
	if !nameRE.MatchString(c.Publication) {
		return fmt.Errorf("postgres.publication %q: use 1 to 63 lower-case letters, digits and underscores", c.Publication)
	}
	if c.StatusInterval == 0 {
		c.StatusInterval = DefaultStatusInterval
	}
	if c.StatusInterval < 10*time.Millisecond || c.StatusInterval > 30*time.Second {
		return fmt.Errorf("postgres.status_interval %s: use a value from 10ms to 30s (wal_sender_timeout is 60s by default)", c.StatusInterval)
	}
	if c.ConfirmInterval == 0 {
		c.ConfirmInterval = min(DefaultConfirmInterval, c.StatusInterval)
	}
	if c.ConfirmInterval < time.Millisecond || c.ConfirmInterval > c.StatusInterval {
		return fmt.Errorf("postgres.confirm_interval %s: use a value from 1ms to postgres.status_interval (%s)", c.ConfirmInterval, c.StatusInterval)
	}
	if c.ReceiveTimeout == 0 {
		c.ReceiveTimeout = max(DefaultReceiveTimeout, 3*c.StatusInterval)
	}
	if c.ReceiveTimeout < 3*c.StatusInterval {
		return fmt.Errorf("postgres.receive_timeout %s: use at least three postgres.status_interval (%s)", c.ReceiveTimeout, c.StatusInterval)
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.CatalogCheckInterval == 0 {
		c.CatalogCheckInterval = DefaultCatalogCheckInterval
	}
	if c.CatalogCheckInterval < 10*time.Millisecond || c.CatalogCheckInterval > 5*time.Minute {
		return fmt.Errorf("postgres.catalog_check_interval %s: use a value from 10ms to 5m", c.CatalogCheckInterval)
	}
	if d := c.ReadBatchDelay(); d > 10*time.Millisecond || d < 0 {
		return fmt.Errorf("postgres.read_batch %s: use a value from 0 (read at once) to 10ms", d)
	}
	return nil
}

// ReadBatchDelay is ReadBatch, its default applied: 0 reads at once.
func (c Config) ReadBatchDelay() time.Duration { return c.ReadBatch.Or(DefaultReadBatch) }

// ConnConfig parses URL and applies PasswordFile: what every connection,
// the replication one too, starts from.
func (c Config) ConnConfig() (*pgconn.Config, error) {
	pc, err := pgconn.ParseConfig(c.URL)
	if err != nil {
		return nil, fmt.Errorf("postgres.url does not parse: %s", redact(err))
	}
	if c.PasswordFile != "" {
		pw, err := secret.Read(c.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("postgres.password_file: %v", err)
		}
		pc.Password = pw
	}
	if pc.ConnectTimeout == 0 {
		pc.ConnectTimeout = c.ConnectTimeout
	}
	return pc, nil
}

// ConnectSQL opens an ordinary (not replication) connection with cfg's URL,
// TLS settings and password.
func ConnectSQL(ctx context.Context, cfg Config) (*pgx.Conn, error) {
	return connectSQL(ctx, cfg, false)
}

// ConnectRows opens a connection for reading outbox rows as text: with the
// output formats a replication connection has, so that a row read here
// decodes to the same bytes as its INSERT streamed. Every statement on it
// is cancelled after statementTimeout (0: the server's setting): a
// backfill's condition is the operator's, and must not run for ever as a
// role that can read every table.
func ConnectRows(ctx context.Context, cfg Config, statementTimeout time.Duration) (*pgx.Conn, error) {
	cfg.rowsTimeout = statementTimeout
	return connectSQL(ctx, cfg, true)
}

func connectSQL(ctx context.Context, cfg Config, pinned bool) (*pgx.Conn, error) {
	pc, err := pgx.ParseConfig(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("postgres.url does not parse: %s", redact(err))
	}
	withPassword, err := cfg.ConnConfig()
	if err != nil {
		return nil, err
	}
	pc.Password = withPassword.Password
	pc.ConnectTimeout = withPassword.ConnectTimeout
	if pinned {
		PinFormats(pc.RuntimeParams)
		if pc.RuntimeParams["application_name"] == "" {
			pc.RuntimeParams["application_name"] = "outbox-cdc-backfill"
		}
		// Names in a backfill's condition resolve in pg_catalog, not in
		// a schema an application role may create functions in
		// (CVE-2018-1058's lesson); a condition names its own objects
		// with their schema.
		pc.RuntimeParams["search_path"] = "pg_catalog, pg_temp"
		// A backfill's watermarks must reach the walsender at once: it
		// sends only flushed WAL, and with synchronous_commit off a
		// commit waits for the WAL writer (up to wal_writer_delay).
		pc.RuntimeParams["synchronous_commit"] = "local"
		// A backfill's reads are scans and sorts, whose expressions JIT
		// compiles for longer than it saves: 0.5 s of a 3.5 s read of a
		// million rows in commit order, and half of a count's time
		// (docs/benchmarks.md, "Backfill").
		pc.RuntimeParams["jit"] = "off"
		if cfg.rowsTimeout > 0 {
			pc.RuntimeParams["statement_timeout"] = strconv.FormatInt(cfg.rowsTimeout.Milliseconds(), 10)
		}
	}
	conn, err := pgx.ConnectConfig(ctx, pc)
	if err == nil && pinned && PinEncoding(conn.PgConn(), pc.RuntimeParams) {
		conn.Close(context.WithoutCancel(ctx))
		conn, err = pgx.ConnectConfig(ctx, pc)
	}
	if err != nil {
		return nil, ConnectError(err, &pc.Config, "connection")
	}
	return conn, nil
}

// PinEncoding reports whether conn's client_encoding is one that can
// hide a backslash in a character's second byte (SJIS, SHIFT_JIS_2004,
// BIG5, GBK, GB18030, UHC, JOHAB: client-only encodings, which a
// database's or a role's default may set), which COPY's text does not
// escape (TestCopyUnderAnotherClientEncoding), having set params' to the
// database's own, for the caller to connect again with params: the rows
// and the walsender's text then come in the database's encoding, both
// alike. Any other client_encoding is kept, the one postgres.url asks for
// included: converting all to UTF-8 would fail on a SQL_ASCII database's
// other bytes, and change the keys of a LATIN1 one's aggregates from what
// they were (TestEncodingsReadAlike).
func PinEncoding(conn *pgconn.PgConn, params map[string]string) bool {
	server := conn.ParameterStatus("server_encoding")
	switch conn.ParameterStatus("client_encoding") {
	case "SJIS", "SHIFT_JIS_2004", "BIG5", "GBK", "GB18030", "UHC", "JOHAB":
		if server != "" {
			params["client_encoding"] = server
			return true
		}
	}
	return false
}

// redact drops anything that could hold a password from a parse error:
// pgconn's ParseConfig errors quote the connection string.
func redact(err error) string {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return err.Error()
	}
	// "cannot parse `<the string>`: what (why)": keep what and why, which
	// say what is wrong, drop the string, and scrub any password that
	// could still appear in them.
	msg := pe.Error()
	if i := strings.Index(msg, "`: "); strings.HasPrefix(msg, "cannot parse `") && i > 0 {
		msg = msg[i+3:]
	}
	var secrets []string
	if u, err := url.Parse(pe.ConnString); err == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok {
			secrets = append(secrets, pw)
		}
	}
	for _, m := range passwordKV.FindAllStringSubmatch(pe.ConnString, -1) {
		secrets = append(secrets, m[1])
	}
	for _, s := range secrets {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, "xxxxx")
		}
	}
	return msg
}

// passwordKV finds password=... in a key=value connection string.
var passwordKV = regexp.MustCompile(`password\s*=\s*'?([^'\s]+)`)

// Weaknesses lists what in the connection settings leaves the connection
// open to a network attacker, one line each, for the start-up log and cdc
// check: an sslmode that may fall back to plaintext (unset, prefer, allow),
// that does not encrypt (disable), or that does not check the server's
// certificate (require). A Unix socket is not on the network.
func (c Config) Weaknesses() []string {
	pc, err := pgconn.ParseConfig(c.URL)
	if err != nil || local(pc.Host) {
		return nil
	}
	plaintext := pc.TLSConfig == nil
	for _, f := range pc.Fallbacks {
		if f.TLSConfig == nil && !local(f.Host) {
			plaintext = true
		}
	}
	switch {
	case pc.TLSConfig == nil:
		return []string{"postgres.url: sslmode=disable or allow: the connection, its password and every event cross the network unencrypted; use sslmode=verify-full with sslrootcert"}
	case plaintext:
		return []string{"postgres.url: sslmode is unset, prefer or allow, so the connection falls back to plaintext if TLS fails, and an attacker can make it fail; use sslmode=verify-full with sslrootcert"}
	case pc.TLSConfig.InsecureSkipVerify && pc.TLSConfig.VerifyPeerCertificate == nil:
		return []string{"postgres.url: sslmode=require encrypts but does not check the server's certificate, so anyone on the path can pose as the server; use sslmode=verify-full with sslrootcert"}
	}
	return nil
}

// local reports whether host is on this machine: a Unix socket or a
// loopback address, where nothing crosses a network to read or tamper.
func local(host string) bool {
	if strings.HasPrefix(host, "/") || host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Every runs fn on an ordinary connection of its own every interval until
// ctx ends, first at once when now is set. A failure to connect, or an
// error from fn, goes to failed (not once ctx ended), and the connection
// is opened again at the next turn: the pipeline's side loops (the slot
// metrics, the replay window) outlive a Postgres restart that way.
func Every(ctx context.Context, cfg Config, interval time.Duration, now bool, fn func(context.Context, *pgx.Conn) error, failed func(error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.WithoutCancel(ctx))
		}
	}()
	for {
		if !now {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
		now = false
		var err error
		if conn == nil {
			conn, err = ConnectSQL(ctx, cfg)
		}
		if err == nil {
			if err = fn(ctx, conn); err != nil {
				conn.Close(context.WithoutCancel(ctx))
				conn = nil
			}
		}
		if err != nil && ctx.Err() == nil {
			failed(err)
		}
	}
}

// PinFormats sets the output formats the decoder and router read: pgoutput
// renders column values with the walsender's settings, and a backfill
// reads rows as text with its session's, which must be the same.
func PinFormats(params map[string]string) {
	params["TimeZone"] = "UTC"
	params["DateStyle"] = "ISO, YMD"
	params["bytea_output"] = "hex"
	params["extra_float_digits"] = "3"
}
