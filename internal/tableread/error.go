package tableread

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxcdc/cdc/internal/errtext"
)

// Error is a problem with a read's configuration or condition that the
// operator must fix: the condition does not parse, a column does not
// exist, the table has no usable key, or backfill.reader_role does not
// work. A retry would meet it again: a backfill beside the stream ends on
// one, and anywhere else one stops the connector (fault.Permanent).
type Error struct{ Msg string }

func (e *Error) Error() string { return e.Msg }

// errorf is an Error of the formatted message.
func errorf(format string, args ...any) error { return &Error{Msg: fmt.Sprintf(format, args...)} }

// statementError is a failed statement: what was done, and the server's
// message on one line. The server's error stays reachable (errors.As), for
// the SQLSTATE: a backfill ends on one that a retry would meet again
// (Lasting).
func statementError(what string, err error) error {
	return &stmtError{msg: what + ": " + pgMessage(err), err: err}
}

type stmtError struct {
	msg string
	err error
}

func (e *stmtError) Error() string { return e.msg }
func (e *stmtError) Unwrap() error { return e.err }

// pgMessage is a server error's message (with its position's hint), or
// err's text, on one line.
func pgMessage(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		msg := pe.Message
		if pe.Hint != "" {
			msg += " (" + pe.Hint + ")"
		}
		return msg
	}
	return errtext.OneLine(err)
}

// Lasting reports whether err is a server error that reading again would
// meet again (a backfill job it ends): the condition's own (a data exception, class 22;
// a statement refused, class 42; a write in the read-only transaction,
// 25006) or backfill.statement_timeout (57014). Connection errors and the
// like are retried.
func Lasting(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	return strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "42") || pe.Code == "25006" || pe.Code == "57014"
}

// Redacted is what may be kept of err, why a read ended, where the log's
// readers are not the only ones (a job's checkpoint): the
// SQLSTATE of a server error and what its class means, never the server's
// message, which may quote data the condition read (a value cast to
// regclass is named in "relation ... does not exist"), and the checkpoint
// topic is readable by principals the database is not. The log has the
// whole error.
func Redacted(err error) string {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		var bad *Error
		if errors.As(err, &bad) {
			return errtext.OneLine(err) // the plan's: names and the condition, no rows
		}
		return "the backfill failed (the connector's log has the error)"
	}
	what := "the statement failed"
	switch {
	case pe.Code == "57014":
		what = "cancelled after backfill.statement_timeout"
	case pe.Code == "25006":
		what = "the condition tried to write in its read-only transaction"
	case pe.Code == "42501":
		what = "permission denied"
	case strings.HasPrefix(pe.Code, "42"):
		what = "the condition does not work (a name or a type in it)"
	case strings.HasPrefix(pe.Code, "22"):
		what = "a value the condition met does not convert"
	}
	return fmt.Sprintf("SQLSTATE %s: %s (the connector's log has the message)", pe.Code, what)
}
