// Package exprcost bounds what an expression's functions cost (package
// expr compiles and runs the expressions; docs/config.md, "Expressions"):
// it declares the functions an expression may call beside CEL's standard
// library, ours in place of those of cel-go that are not bounded
// (Functions), refuses what no estimate bounds (Check), estimates an
// expression's cost on an event of a given size for the checker
// (Estimator), and plans a program that counts its cost and stops at a
// limit (Counted), or one that does not (Uncounted). It knows nothing of
// outbox events, nor of the limits: the caller gives an event's size, its
// variables' names and the limit.
//
// Invariants:
//   - Every function in an environment of Functions is bounded by
//     construction, each overload listed in bounds.go with how: its
//     estimate, on an event of a given size, bounds both what the count
//     charges it and the size of what it gives, on any event no larger
//     (only a value read from the event is taken as no larger than the
//     event; what a call computes has its model's size, or none, and is
//     unbounded); and the count charges it at least a tenth of a unit for
//     each character it writes and a unit for each element, and in
//     proportion to its time (a comparison as deep as the shallower
//     operand, a call on dyn operands as the overload they select, a match
//     as its pattern's compiled instructions times the string's
//     characters). So an evaluation within its limit builds no string
//     longer than the event and 10 times the limit characters. A function
//     without an entry fails TestEveryFunctionIsBounded; FuzzEval checks
//     the bounds on expressions made of every function.
//   - What no estimate bounds, Check refuses: matches() of a pattern that
//     is not a literal (a literal one is compiled once, when the program
//     is planned), and, in a comprehension's loop, an index or a map
//     literal whose key is computed and may be a string (check.go).
//   - No call runs that would take a counted evaluation past its limit:
//     each is checked before it runs against the least it will be charged
//     (guard.go), a lower bound of its charge (TestLeastChargeIsExact), so
//     that an evaluation stopped at the limit has done and built no more
//     than the limit allows, however large its event, and none the count
//     would let finish is stopped. The exceptions cost no more than their
//     operands' size: == and != (as deep as the shallower), &&, || and ?:,
//     and an index, whose key is hashed once (outside a loop, by Check).
//   - Nothing here changes what an evaluation gives: the check only stops
//     one, and a counted evaluation that does not stop gives what an
//     Uncounted one does (FuzzEval), so that skipping the count where the
//     estimate cannot reach the limit skips nothing.
//   - No function reads the network, the clock, or a file or the
//     environment but the time-zone database that a zone named in
//     getHours("Europe/Paris") and its kin is read from (time.LoadLocation:
//     $ZONEINFO, the system's zoneinfo, Go's zoneinfo.zip), only for a
//     name shaped as the database names zones (zoneShaped: no path out of
//     it, no name with a '.' such as tzdata.zi, not Local), and once: what
//     a load gave is kept, at most 2048 zones and 1024 names of none, and
//     a call costs tzCost, what a load does. An offset ("+02:00") reads
//     nothing. Nothing is added to Functions that could.
package exprcost
