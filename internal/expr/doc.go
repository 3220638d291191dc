// Package expr compiles and runs the CEL expressions a table may decide
// each event with (tables[].filter and tables[].expressions; docs/config.md,
// "Expressions"): the variables they read, the types they must give, the
// values they read, made once per event, and the bound on what one
// evaluation may cost. It knows nothing of outbox events: the caller names
// the fields at NewEnv and supplies one event's values through an
// Activation.
//
// Invariants:
//   - An expression reads only its event: the variables are the event's
//     fields, row, payload, commit_lsn and commit_time, and the functions
//     are CEL's standard library, cel-go's strings extension and
//     partitionFor, none of which reads the network, a file, the
//     environment or the clock. Nothing is added here that could.
//   - Whatever an expression may read of the row is known at Compile: the
//     fields it names and the columns it selects from row, each by a name
//     written in the expression (row.col or row["col"]), so the decoder
//     extracts exactly those columns; and whether it reads payload whole
//     or only members of it by name, which are then all that is parsed.
//   - Its cost is bounded twice: at Compile, an expression whose estimated
//     cost on an event of AssumedSize is above MaxEstimatedCost is refused;
//     at run time, an evaluation that reaches CostLimit stops with ErrCost.
//     An evaluation skips counting only on an event no larger than the
//     largest one on which the estimate stays within CostLimit: there the
//     count could not stop it.
//   - A failed evaluation (a missing member, a wrong type, the cost limit)
//     is an error returned to the caller, never a panic and never a
//     default value: the caller makes the event invalid.
package expr
