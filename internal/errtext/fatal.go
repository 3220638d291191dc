package errtext

import "fmt"

// Fatal is what only an operator can fix: a precondition, a privilege, a
// lost slot, a setting. Reconnecting cannot help, so the connector stops
// with Msg, which says what is wrong and what to do next, on one line.
// Every package returns it for such errors, and the pipeline and the
// commands tell it from a retryable error with errors.As.
type Fatal struct {
	Msg string
	Err error // what it wraps, for errors.Is (postgres.ErrSlotLost, ...), or nil
}

func (e *Fatal) Error() string { return e.Msg }
func (e *Fatal) Unwrap() error { return e.Err }

// Fatalf is a *Fatal with a formatted message.
func Fatalf(format string, args ...any) error {
	return &Fatal{Msg: fmt.Sprintf(format, args...)}
}
