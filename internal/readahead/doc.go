// Package readahead hands out a sequence of row reads a piece at a time
// while it reads the next in a goroutine: a backfill's cursor fetches
// several chunks' rows at once, and Postgres sends the next fetch's rows
// while the connector sends the rows of the one before (package backfill,
// docs/benchmarks.md, "Larger reads"). Copy hands out a table's rows
// read by one COPY the same way (a first start's read of a table alone,
// package copyread), the copy itself filling the next chunk.
//
// Invariants:
//
//   - The rows come out in the order the reads return them, each once, a
//     piece of at most Piece rows at a time; the last piece says that no
//     row is left after it, and an empty read that is the last says so
//     too.
//
//   - One read at a time: the next read begins once the one before has
//     returned, and only when its rows are taken (at most one read
//     ahead), so a reader holds at most two reads' rows, the one handed
//     out and the one read ahead; Wait returns once no read runs, so the
//     caller may use the connection again.
//
//   - A read's error is returned by Next where its rows would have come,
//     after every row read before it.
package readahead
