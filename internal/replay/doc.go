// Package replay is what cdc replay and cdc rewind need of the replay
// window: the window itself (Window: a second slot kept replay.window
// behind the main one), where a range of commit LSNs or times starts in it
// (WindowStart), and which transactions and events a replay re-sends
// (Filter). The pipeline streams a temporary copy of the replay slot
// through its session, with a Filter; the operations package rewinds the
// main slot with WindowStart.
//
// Invariants (docs/design.md, "Replay needs WAL kept on purpose"):
//   - The window a checkpoint claims is written before the replay slot is
//     advanced to it, so the slot never holds less than a checkpoint says,
//     and a replay that trusts the checkpoint never starts past the slot.
//   - A range that reaches before the window is refused with an
//     *OutsideWindowError naming the window's first position and time;
//     nothing is sent.
//   - A replay ends at the WAL end it saw when it started (or ToLSN), and
//     reads on Skew past ToTime, since commit times follow commit LSNs only
//     roughly.
//   - A field filter on a field none of the replayed sources maps is
//     refused before anything is read (TestReplayFilterNeedsAMappedField).
package replay
