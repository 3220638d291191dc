// Package signing is what the connector does with the keys of
// checkpoint.signing_key_file beside making a MAC: checking one against
// every key in constant time (VerifyMAC), and naming a key without
// showing it (ID), so that a parking can say which key sealed its
// records and a redrive can tell a rotated key from records gone
// (docs/security.md, "Secrets and what each protects").
//
// Invariants:
//   - A MAC verifies when any key of the file made it: the first line
//     signs, every line verifies, so a key is rotated in by putting the new
//     one first and keeping the old one after it.
//   - An ID is a hash of the key under a label of its own: it names the
//     key in checkpoints and logs, and tells nothing that helps forge a MAC.
package signing
