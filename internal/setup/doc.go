// Package setup is what the PostgreSQL server must have before the
// connector streams: Check reports every missing piece without creating
// anything (cdc check), and Prepare checks the same and makes the
// publication, reads the catalog the table changes are checked against,
// and reads the slot's state.
//
// Invariants (docs/design.md, "Position rules" and "Table changes"):
//   - Prepare never creates a slot: whether a missing slot is a first
//     start or a gap is the pipeline's decision, against its checkpoint.
//     A lost slot is a *errtext.Fatal.
//   - A standby's publication is made on its primary and waited for until
//     the standby has replayed it; without a primary the statement to run
//     there is the error.
//   - A problem an operator must fix is a *errtext.Fatal that says how.
package setup
