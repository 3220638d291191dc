// Package copyread reads a query's rows by COPY (query) TO STDOUT, in
// text format, as a stream: Postgres sends every row without waiting for
// a FETCH, sorts with parallel workers where it can, and keeps no
// scrollable copy of the result. A backfill's first start reads a table
// alone in the order of the commits this way (package backfill,
// docs/benchmarks.md, "A copy for the first start").
//
// Invariants:
//
//   - The rows come out in the order the server sent them, each once,
//     with every value as the text format gives it (a query's text
//     result, value for value: COPY's escapes undone), nil for NULL: the
//     same rows a cursor of the query reads.
//
//   - Memory is bounded as a cursor's chunks are: the rows are handed out
//     in batches of at most Options.Rows rows, each ending at the row that
//     reaches Options.Budget bytes of values (a row's bytes are sized to
//     its values unescaped, not to COPY's text, which doubles a
//     backslash), and the reader fills one batch while the last one
//     handed out is held: the copy waits (and, through TCP, the server
//     with it) until Next takes a batch. A full batch is held until the
//     row after it is read, which Peek then shows: a backfill saved after
//     the batch knows whether it ended a commit.
//
//   - The connection's client_encoding must not be one whose characters
//     hold a backslash byte (SJIS, BIG5, GBK, ...), which COPY does not
//     escape: postgres.PinEncoding pins the database's own.
//
//   - With Options.Flagged, each row ends in a flag the rows handed out
//     do not hold: the rows end before the first true one (ErrFlagged,
//     the flagged row shown by Peek), the server is asked to end the copy
//     and what it sends until then is dropped. The copy runs in a
//     savepoint the caller rolls back to, so that the transaction, and
//     its snapshot, go on for a cursor to read on from there. The cancel
//     request is answered before the copy ends for the caller, and on a
//     direct connection the server signals the backend before it
//     answers, so it cannot cancel a later statement; one not answered
//     within its wait (10 s) could, and ends the read with an error.
//
//   - The last batch says so; a row cut short, a row of the wrong width,
//     a bad escape or the server's error is an error where the rows would
//     have gone on, after every row before it. Nothing is dropped.
//
//   - Stop ends the copy and waits for it: once it returns, no goroutine
//     uses the connection. A copy stopped before its end leaves the
//     connection closed (pgconn closes it), which a backfill that stops
//     on an error gives up anyway.
package copyread
