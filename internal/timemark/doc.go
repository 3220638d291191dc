// Package timemark turns a time into a WAL position without decoding: a
// bounded, time-ordered list of samples of the confirmed position (List),
// kept in the checkpoint record for the replay window.
//
// Invariants:
//   - a mark is a position the WAL had reached at its time; the list's
//     positions and times both grow, newest last.
//   - a mark is trusted for a time only Skew after it (Before): every
//     transaction that committed at or after that time has its commit
//     record at or after the mark's position.
package timemark
