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
//     are CEL's standard library and package exprcost's (cel-go's strings
//     extension and partitionFor), none of which reads the network, the
//     clock, or a file or the environment but the time-zone database, from
//     which a zone named in getHours("Europe/Paris") and its kin is read,
//     once, and only for a name shaped as the database names zones.
//     Nothing is added here that could: NewEnv declares no function but
//     exprcost's, and both of an expression's programs are planned as
//     exprcost plans them (Counted, Uncounted).
//   - Whatever an expression may read of the row is known at Compile: the
//     fields it names and the columns it selects from row, each by a name
//     written in the expression (row.col or row["col"]), so the decoder
//     extracts exactly those columns; and whether it reads payload whole
//     or only members of it by name, which are then all that is parsed.
//   - Its cost is bounded twice: at Compile, an expression that no
//     estimate bounds is refused (exprcost.Check: a match of a pattern not
//     written in it, a key computed from the event in a comprehension's
//     loop), and so is one whose estimated cost on an event of
//     AssumedSize is above MaxEstimatedCost; at run time, an evaluation
//     that reaches CostLimit stops with ErrCost. An evaluation skips
//     counting only on an event no larger than the largest one on which
//     the estimate stays within CostLimit: there the count could not stop
//     it.
//   - Every function is bounded by construction, and no call runs that
//     would take a counted evaluation past CostLimit (package exprcost
//     says how): so the estimate bounds what a counted evaluation is
//     charged, an evaluation within CostLimit builds no string longer than
//     the event and 10 times CostLimit characters, and one stopped with
//     ErrCost has done and built no more than CostLimit allows, however
//     large its event.
//   - A number is an int when it is an integer that fits 64 bits and a
//     double when a double holds it (Number), and never its text: JSON (a
//     payload, a json column) that holds one past a double's range is
//     refused, whether parsed whole or by member, and a numeric column
//     that holds one is an error an expression reading it fails on.
//   - The payload is read as the whole parse reads it: Object.ReadJSON
//     accepts exactly what JSON, the whole parse, takes for an object
//     (what encoding/json.Valid takes, whose every number a double holds),
//     the members it skips unread checked byte by byte as the whole parse
//     checks them, and what it reads of a member is what the whole parse
//     gives (FuzzReadJSON holds it to both).
//   - A failed evaluation (a missing member, a wrong type, a number past a
//     double, the cost limit) is an error returned to the caller, never a
//     panic and never a default value: the caller makes the event invalid.
package expr
