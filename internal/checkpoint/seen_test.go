package checkpoint

import "testing"

// TestSeen: a committed transaction's changes are in a snapshot when it
// ended before it: below its xmin, or below its xmax and not running
// then; a 32-bit xid is placed in the epoch nearest the xmax, either side
// of a wrap; one at or past the xmax began after the snapshot.
func TestSeen(t *testing.T) {
	const epoch = 1 << 32
	s := &Seen{Xmin: 5*epoch + 100, Xmax: 5*epoch + 110, Xip: []uint64{5*epoch + 100, 5*epoch + 104}}
	wrap := &Seen{Xmin: 6*epoch - 3, Xmax: 6*epoch + 2, Xip: []uint64{6*epoch - 3, 6*epoch + 1}}
	for _, tc := range []struct {
		name       string
		s          *Seen
		xid        uint32
		sees, past bool
	}{
		{"below the xmin", s, 99, true, false},
		{"long before", s, 7, true, false},
		{"running at the xmin", s, 100, false, false},
		{"ended between", s, 103, true, false},
		{"running between", s, 104, false, false},
		{"at the xmax", s, 110, false, true},
		{"after", s, 200, false, true},
		{"the epoch before the xmax, ended", wrap, 0xFFFFFFFE, true, false},
		{"the epoch before the xmax, running", wrap, 0xFFFFFFFD, false, false},
		{"the xmax's epoch, ended", wrap, 0, true, false},
		{"the xmax's epoch, running", wrap, 1, false, false},
		{"the xmax's epoch, after", wrap, 2, false, true},
	} {
		if got := tc.s.Sees(tc.xid); got != tc.sees {
			t.Errorf("%s: Sees(%d) = %v, want %v", tc.name, tc.xid, got, tc.sees)
		}
		if got := tc.s.Past(tc.xid); got != tc.past {
			t.Errorf("%s: Past(%d) = %v, want %v", tc.name, tc.xid, got, tc.past)
		}
	}
	if (&Seen{Xmin: 10, Xmax: 9}).valid() || (&Seen{Xmin: 10, Xmax: 20, Xip: []uint64{20}}).valid() || !s.valid() {
		t.Error("valid() misjudges a snapshot")
	}
}
