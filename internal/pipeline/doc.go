// Package pipeline does supervision, and where each session starts, and
// nothing else: it runs one replication session after another (package
// session runs each), and keeps what lives across them.
//
// Each session (runSession, sessions.go) connects to Kafka, takes the
// slot's start lock, so that replicas take turns, and decides against the
// checkpoint (start.go) whether it may create the slot or must refuse a
// gap, adopts a slot that has no checkpoint, or resumes; a first start is
// a state that lasts until the slot and its checkpoint exist, whatever
// failed before (docs/design.md, "A first start is a state, not a
// session"). In exactly-once mode it fences any other instance first
// (eos.go). Then session.Run streams, from the position start found, and
// hands back what the session leaves: the position it confirmed, and what
// Kafka acknowledged past its last checkpoint when Postgres ended it (the
// carry, which the next resume checkpoints first). A session ends on
// shutdown, on a fatal error, or on a transient one; transient errors
// start a new session after a backoff, and Postgres re-sends everything
// after the slot's confirmed position. An instance that finds the slot
// held waits as a standby and takes over a silent holder
// (postgres.Takeover). What lives across sessions is the pipeline's: the
// checkpoint store and its progress, the backfill jobs, the operator's
// requests' way in (request.Gate), the carry, and health (Ready, Healthy).
// The operator commands are internal/ops' (Pipeline.Ops); a replay
// (Pipeline.Replay) streams a copy of the replay slot in a session of its
// own (session.Replay).
//
// Invariants:
//   - Fatal and transient errors are told apart in one place (package
//     fault).
//   - Before a session streams, its start compares the slot with the
//     checkpoint (checkpoint.Decide) under the slot's start lock: the slot
//     is created on a first start only, and never moves over a gap an
//     operator has not accepted.
//   - A first start's checkpoint, and an adopted slot's, is saved before
//     the session streams: from then on a missing slot is a gap.
//   - The carry is checkpointed only when the checkpoint is still the one
//     this process saved last: it never overwrites another replica's
//     progress.
//   - In exactly-once mode the session's transactional producer fences
//     every other instance before the checkpoint is read.
//   - The backfill jobs a checkpoint read back carries run only when they
//     are the configuration's or a signed request's (backfill.Trusted).
package pipeline
