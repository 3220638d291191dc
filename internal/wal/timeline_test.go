package wal

import (
	"testing"

	"github.com/jackc/pglogrepl"
)

func TestTimelineEnd(t *testing.T) {
	const history = "1\t0/3000158\tno recovery target specified\n\n2\t0/5000A28\tat restore point \"x\"\n"
	for _, tt := range []struct {
		tli  int32
		want pglogrepl.LSN
		ok   bool
	}{
		{1, 0x3000158, true},
		{2, 0x5000A28, true},
		{3, 0, false},
	} {
		got, ok := timelineEnd(history, tt.tli)
		if got != tt.want || ok != tt.ok {
			t.Errorf("timelineEnd(%d) = %s, %v; want %s, %v", tt.tli, got, ok, tt.want, tt.ok)
		}
	}
}
