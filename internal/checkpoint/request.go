package checkpoint

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/outboxcdc/cdc/internal/signing"
)

// The backfill protocol's requests (docs/design.md, "Backfill"): cdc
// backfill writes a signed Request into the checkpoint topic, then
// announces its ID in the WAL; the pipeline that meets the announcement
// reads the request (Requests.Request), verifies it (backfill.Jobs.Admit)
// and starts its job.

// Request is what cdc backfill asks a running pipeline to do. It
// is kept in the checkpoint topic, where only the operator's Kafka
// credentials can write: the WAL message that announces it names only its
// ID, since any database role can write logical decoding messages.
//
// Anyone who may produce to the checkpoint topic could write one too, and
// its condition runs as the connector's role: a request carries an HMAC
// (SHA-256) made with a key that cdc backfill and cdc run read from
// checkpoint.signing_key_file, and cdc run takes only requests whose MAC
// verifies (docs/security.md).
type Request struct {
	ID          string    `json:"id"`
	Table       string    `json:"table"`
	Where       string    `json:"where,omitempty"`
	RequestedAt time.Time `json:"requested_at"`
	// MAC is the request's HMAC-SHA256, hex (Sign).
	MAC string `json:"mac,omitempty"`
}

// mac is the request's HMAC for the pipeline with checkpoint key key:
// every field, each ended by a zero byte, so that no two requests share
// the bytes it covers.
func (r Request) mac(secret []byte, key string) []byte {
	h := hmac.New(sha256.New, secret)
	for _, f := range []string{"outbox-cdc backfill request v1", key, r.ID, r.Table, r.Where, r.RequestedAt.UTC().Format(time.RFC3339Nano)} {
		h.Write([]byte(f))
		h.Write([]byte{0})
	}
	return h.Sum(nil)
}

// Sign sets r.MAC with secret, for the pipeline with checkpoint key key.
func (r *Request) Sign(secret []byte, key string) {
	r.MAC = hex.EncodeToString(r.mac(secret, key))
}

// Verify reports whether r.MAC was made by one of secrets for the pipeline
// with checkpoint key key (several: a key being rotated in).
func (r Request) Verify(secrets [][]byte, key string) bool {
	return signing.VerifyMAC(r.MAC, secrets, func(s []byte) []byte { return r.mac(s, key) })
}

// RequestMaxAge is how far apart a backfill request's requested_at and
// the commit of the WAL message that announces it may be: cdc backfill
// writes one and then the other, so more is a request announced again
// (replayed by any role that can write a logical decoding message, which
// every role can), or clocks far apart.
const RequestMaxAge = 10 * time.Minute

// RequestOf is the signed request that started job b, as far as the job
// keeps it.
func RequestOf(b Job) Request {
	return Request{ID: b.ID, Table: b.Table, Where: b.Where, RequestedAt: b.RequestedAt, MAC: b.MAC}
}

// SaveRequest writes req for the pipeline whose checkpoint key is key.
func (s *Store) SaveRequest(ctx context.Context, key string, req Request) error {
	v, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if err := s.Put(ctx, RequestKey(key, req.ID), v); err != nil {
		return fmt.Errorf("write the backfill request: %w", err)
	}
	return nil
}

// Made is when the request was made.
func (r Request) Made() time.Time { return r.RequestedAt }

// ParseRequest reads backfill request id's value from the checkpoint
// topic.
func ParseRequest(id string, v []byte) (Request, error) {
	var req Request
	if err := json.Unmarshal(v, &req); err != nil || req.ID != id {
		return Request{}, fmt.Errorf("backfill request %s does not parse", id)
	}
	return req, nil
}
