//go:build race

package relay

// raceEnabled: the race detector's instrumentation makes the compiler keep
// some values on the heap it otherwise keeps on the stack, so allocation
// budgets measured under -race (make test) allow for that.
const raceEnabled = true
