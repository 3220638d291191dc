package wal

import (
	"fmt"
	"time"
)

// DeadConnError is a replication connection the walsender has said
// nothing on for longer than ReceiveTimeout, though asked to answer: the
// network drops what crosses it, or the server froze. A new session
// starts, from the slot's confirmed position.
type DeadConnError struct {
	Slot   string
	Silent time.Duration
}

func (e *DeadConnError) Error() string {
	return fmt.Sprintf("replication slot %q: no message from Postgres for %s though asked to answer (postgres.receive_timeout): the connection is taken for dead (the network drops packets, or the server froze); starting a new session",
		e.Slot, e.Silent.Round(time.Second))
}
