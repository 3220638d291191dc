// Package ops is the operator commands that act on a pipeline without
// streaming it: cdc check (Check), cdc status (Status), cdc rewind
// (Rewind) and cdc reset --accept-gap (AcceptGap). Each takes the
// validated config (pipeline.Pipeline.Ops builds an Ops), connects for
// itself, and reads the checkpoint from the checkpoint topic.
//
// Invariants:
//   - Check and Status change nothing: Check lists every problem it finds
//     (a missing privilege, a topic that cannot be created, a backfill
//     condition that does not parse) in one error; Status reports a Kafka
//     it cannot reach in CheckpointError and goes on.
//   - Rewind and AcceptGap refuse a slot in use, and record what they did
//     in the checkpoint's history, so that the next cdc run starts from there
//     and cdc status says why (docs/design.md, "The slot is not the connector's
//     memory", "An LSN means something only within its WAL history").
//   - Rewind only goes back, and never past the replay window
//     (replay.WindowStart).
//   - AcceptGap changes nothing without a gap; after a restore it starts a
//     new WAL history at the slot, so that commits reusing old positions
//     are not skipped as delivered.
package ops
