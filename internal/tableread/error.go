package tableread

import (
	"errors"
	"fmt"

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
// (backfill's jobEnding).
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
