// Package request is the one way in for an operator's request to a
// running pipeline (docs/security.md, "Requests"): cdc backfill and cdc
// redrive write a signed request into the checkpoint topic and announce
// its ID in the WAL with pg_logical_emit_message, which any database role
// can write; Gate.Admit is the only code that turns an announced ID into
// a request that runs, for both kinds.
//
// Invariants:
//   - A request runs only when the checkpoint topic holds it under the
//     pipeline's key, its signature verifies with a key of
//     checkpoint.signing_key_file for that pipeline, and it is announced
//     (or, for a redrive the stream cannot reach, taken at a session's
//     start) within checkpoint.RequestMaxAge of being made.
//   - A request runs once: the caller says which IDs the checkpoint
//     remembers as taken (checkpoint.Record.Used, a backfill's jobs), and
//     Admit refuses those. The Ledger never forgets a request taken
//     within LedgerKeeps (it could be announced again and admitted): when
//     it has no room for another without that, Admit refuses the new one
//     (Admission.Room).
//   - What a request acts on is what the operator saw when making it,
//     named in the signed request (a redrive's parkings and episodes), not
//     a selector evaluated later: the kind's runner checks it.
//   - An announcement of one kind decides nothing of another: a refusal
//     is remembered by kind and ID, so an operator's ID announced as
//     another kind (which any role may do) is refused as that kind only.
//   - An announcement costs bounded work however many come, in any order
//     or form: an ID longer than MaxIDBytes is refused quietly and not
//     remembered; an ID refused once is remembered (at most MaxRefused,
//     within MaxRefusedBytes) and passed over at once while the follower
//     has not read it (a refusal for the budget or a look's time is not
//     remembered; one the follower has read is checked again, without a
//     look, so that an ID someone announced first is still the
//     command's), and an ID the
//     follower has not read costs a look at the checkpoint topic's end
//     only within a budget (LookupsPerSecond), charged for the time each
//     look takes too, so that looks hold the replication loop at most
//     half the time; the rest are refused without a look. A look that
//     does not answer within lookupTimeout is a refusal, not an error
//     that ends the session.
package request
