// Package sqlwhere checks a backfill's SQL condition before it reaches
// Postgres: read as PostgreSQL's lexer reads it, it must stay inside its
// WHERE and call no function that acts outside a read-only transaction.
//
// Invariants:
//   - Pure: no I/O, no state; the same condition gets the same answer.
//   - A quote, parenthesis, ';' or comment inside a string constant,
//     quoted identifier or dollar-quoted string is never taken for one
//     outside it, and one outside is never taken for one inside.
package sqlwhere
