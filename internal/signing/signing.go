package signing

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"slices"
)

// VerifyMAC reports whether mac, hex, is what sum gives with one of
// secrets: the check of every signed request (a backfill's, a redrive's)
// and parked record's seal, in constant time.
func VerifyMAC(mac string, secrets [][]byte, sum func(secret []byte) []byte) bool {
	got, err := hex.DecodeString(mac)
	if err != nil || len(got) != sha256.Size {
		return false
	}
	for _, s := range secrets {
		if hmac.Equal(got, sum(s)) {
			return true
		}
	}
	return false
}

// ID names secret: 12 hex digits of a SHA-256 of it under this package's
// label, never the MAC of anything the connector signs.
func ID(secret []byte) string {
	h := sha256.New()
	h.Write([]byte("outbox-cdc signing key id v1"))
	h.Write([]byte{0})
	h.Write(secret)
	return hex.EncodeToString(h.Sum(nil)[:6])
}

// Has reports whether one of secrets is named id.
func Has(secrets [][]byte, id string) bool {
	return slices.ContainsFunc(secrets, func(s []byte) bool { return ID(s) == id })
}
