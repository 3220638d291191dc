package signing

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"testing"
)

// TestVerifyMACWithAnyKey: a MAC made by the second key verifies, one
// made by a key not in the list, a short one or one not hex does not.
func TestVerifyMACWithAnyKey(t *testing.T) {
	a, b, c := []byte("key-a-0123456789abcdef0123456789"), []byte("key-b-0123456789abcdef0123456789"), []byte("key-c-0123456789abcdef0123456789")
	sum := func(s []byte) []byte { h := hmac.New(sha256.New, s); h.Write([]byte("msg")); return h.Sum(nil) }
	byB := hex.EncodeToString(sum(b))
	for _, tc := range []struct {
		mac  string
		keys [][]byte
		want bool
	}{{byB, [][]byte{a, b}, true}, {byB, [][]byte{a, c}, false}, {byB[:10], [][]byte{b}, false}, {"zz" + byB[2:], [][]byte{b}, false}, {byB, nil, false}} {
		if got := VerifyMAC(tc.mac, tc.keys, sum); got != tc.want {
			t.Errorf("VerifyMAC(%.12s..., %d keys) = %v, want %v", tc.mac, len(tc.keys), got, tc.want)
		}
	}
	if ID(a) == ID(b) || len(ID(a)) != 12 || !Has([][]byte{b, a}, ID(a)) || Has([][]byte{b}, ID(a)) {
		t.Errorf("ID and Has: %s %s", ID(a), ID(b))
	}
}
