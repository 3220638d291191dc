package postgres

import (
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/pgident"
)

var (
	// ErrSlotLost means Postgres invalidated the slot (wal_status = lost):
	// it removed WAL the slot still needed, the slot sat idle too long, or
	// on a standby the primary removed rows it needed. *SlotLost says
	// which.
	ErrSlotLost = errors.New("replication slot is lost")
	// ErrSlotVanished means the slot existed earlier in this process and no
	// longer does: it was dropped, or Postgres failed over to a standby
	// without failover slots.
	ErrSlotVanished = errors.New("replication slot vanished")
)

// SlotInUseError means another connection streams from the slot: a second
// connector instance, or a walsender left behind by a dropped connection
// that Postgres ends after wal_sender_timeout. Retry with backoff.
type SlotInUseError struct {
	Slot string
	Err  error
}

func (e *SlotInUseError) Error() string {
	return fmt.Sprintf("replication slot %q is in use (%v); another instance holds it, or Postgres has not yet noticed a dropped connection (up to wal_sender_timeout)", e.Slot, e.Err)
}
func (e *SlotInUseError) Unwrap() error { return e.Err }

// AuthError means Postgres refused the connector itself: a wrong password,
// no pg_hba.conf entry, a role that may not log in or replicate, a database
// that does not exist. Retrying cannot fix it, so a connector that never
// streamed stops at once; one that streamed before retries a few times, in
// case of a password rotation in progress (docs/operations.md).
type AuthError struct {
	Msg string
	Err error
}

func (e *AuthError) Error() string { return e.Msg }
func (e *AuthError) Unwrap() error { return e.Err }

// ConnectError describes a failed connection in one line. pgconn's own
// message spans lines (one per address and TLS attempt, tab-indented) and
// repeats the fallback attempts; the server's refusal is what matters.
// Neither quotes the password.
func ConnectError(err error, pc *pgconn.Config, what string) error {
	where := fmt.Sprintf("%s:%d", pc.Host, pc.Port)
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "28P01": // invalid_password
			return &AuthError{Err: err, Msg: fmt.Sprintf("postgres at %s rejected the password of role %q (SQLSTATE 28P01): fix the password in postgres.url or postgres.password_file", where, pc.User)}
		case "28000": // invalid_authorization_specification: pg_hba.conf, or a role that may not log in
			return &AuthError{Err: err, Msg: fmt.Sprintf("postgres at %s refused role %q: %s (SQLSTATE 28000): allow it in pg_hba.conf, or fix postgres.url's user", where, pc.User, pe.Message)}
		case "3D000": // invalid_catalog_name
			return &AuthError{Err: err, Msg: fmt.Sprintf("postgres at %s: %s (SQLSTATE 3D000): fix the database in postgres.url", where, pe.Message)}
		case "42501": // insufficient_privilege: "must be superuser or replication role to start walsender"
			return &AuthError{Err: err, Msg: fmt.Sprintf("postgres at %s: role %q may not open a %s: %s (SQLSTATE 42501): ALTER ROLE %s REPLICATION", where, pc.User, what, pe.Message, pgident.Quote(pc.User))}
		}
	}
	var unknownCA x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	var host x509.HostnameError
	if errors.As(err, &unknownCA) || errors.As(err, &invalid) || errors.As(err, &host) {
		return &TLSError{Err: err, Msg: fmt.Sprintf("postgres at %s: the server's certificate does not verify (%s): set sslrootcert in postgres.url to the CA that signed it, and connect by the name the certificate holds (sslmode=verify-full checks both)", where, certProblem(err))}
	}
	return fmt.Errorf("open %s to postgres at %s: %s", what, where, errtext.OneLine(err))
}

// TLSError means the server's certificate did not verify. At start it is
// fatal, as a wrong Kafka CA is: retrying cannot fix a configuration.
// Once the connector has streamed, it is retried like other connection
// errors, since the certificate may be being rotated.
type TLSError struct {
	Msg string
	Err error
}

func (e *TLSError) Error() string { return e.Msg }
func (e *TLSError) Unwrap() error { return e.Err }

// certProblem is the x509 error's own words, without pgconn's wrapping.
func certProblem(err error) string {
	var unknownCA x509.UnknownAuthorityError
	if errors.As(err, &unknownCA) {
		return unknownCA.Error()
	}
	var invalid x509.CertificateInvalidError
	if errors.As(err, &invalid) {
		return invalid.Error()
	}
	var host x509.HostnameError
	if errors.As(err, &host) {
		return host.Error()
	}
	return errtext.OneLine(err)
}
