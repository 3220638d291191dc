package checkpoint

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

func TestDecide(t *testing.T) {
	ours := Record{Slot: "s", SystemID: "1", Timeline: 1, Confirmed: 100}
	other := Record{Slot: "s", SystemID: "2", Confirmed: 100}
	otherHere := Record{Slot: "s", SystemID: "2", Confirmed: 100, Address: "db:5432/app"}
	unrelated := Record{Slot: "t", SystemID: "2", Confirmed: 100}
	recs := func(rs ...Record) map[string]Record {
		m := map[string]Record{}
		for _, r := range rs {
			m[r.Key()] = r
		}
		return m
	}
	tests := []struct {
		name    string
		slot    SlotInfo
		records map[string]Record
		want    Start
		gap     GapKind
	}{
		{"first start", SlotInfo{}, recs(unrelated), StartCreate, 0},
		{"slot without checkpoint", SlotInfo{Exists: true, Confirmed: 50}, recs(), StartAdopt, 0},
		{"resume behind the checkpoint", SlotInfo{Exists: true, Confirmed: 90}, recs(ours), StartResume, 0},
		{"resume at the checkpoint", SlotInfo{Exists: true, Confirmed: 100}, recs(ours, other), StartResume, 0},
		{"slot dropped", SlotInfo{}, recs(ours), 0, GapSlotMissing},
		{"slot ahead", SlotInfo{Exists: true, Confirmed: 101}, recs(ours), 0, GapSlotAhead},
		{"another system, no slot", SlotInfo{}, recs(other), 0, GapOtherSystem},
		{"another system, a slot", SlotInfo{Exists: true, Confirmed: 1}, recs(other), 0, GapOtherSystem},
		{"another system at this address", SlotInfo{Address: "db:5432/app"}, recs(otherHere), 0, GapOtherSystem},
		{"another deployment sharing the topic", SlotInfo{Address: "db2:5432/app"}, recs(otherHere), StartCreate, 0},
		{"WAL behind the checkpoint: a restore", SlotInfo{Exists: true, Confirmed: 90, WALEnd: 95, Timeline: 1}, recs(ours), 0, GapHistory},
		{"WAL past the checkpoint", SlotInfo{Exists: true, Confirmed: 90, WALEnd: 100, Timeline: 1}, recs(ours), StartResume, 0},
		{"WAL behind, on another timeline", SlotInfo{Exists: true, Confirmed: 90, WALEnd: 95, Timeline: 2}, recs(ours), StartResume, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start, rec, err := Decide("s", "1", tt.slot, tt.records)
			var gap *GapError
			if tt.gap != 0 {
				if !errors.As(err, &gap) || gap.Kind != tt.gap {
					t.Fatalf("Decide = %v, %v; want a gap of kind %d", start, err, tt.gap)
				}
				return
			}
			if err != nil || start != tt.want || (start == StartResume) != (rec != nil) {
				t.Fatalf("Decide = %v, %v, %v; want %v", start, rec, err, tt.want)
			}
		})
	}
}

func TestMarks(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	var ms Marks
	for i := 0; i < 100; i++ {
		ms = ms.Add(Mark{LSN: pglogrepl.LSN(1000 + i), Time: t0.Add(time.Duration(i) * time.Second)}, 10*time.Second, t0.Add(50*time.Second))
	}
	// One mark every 10s, and of those older than 50s only the newest.
	if len(ms) != 6 || ms[0].Time != t0.Add(40*time.Second) || ms[len(ms)-1].Time != t0.Add(90*time.Second) {
		t.Fatalf("marks = %v", ms)
	}
	if m, ok := ms.Before(t0.Add(75 * time.Second)); !ok || m.Time != t0.Add(70*time.Second) {
		t.Fatalf("Before(75s) = %v, %v; want the 70s mark (75s minus the skew)", m, ok)
	}
	if m, ok := ms.Before(t0.Add(71 * time.Second)); !ok || m.Time != t0.Add(60*time.Second) {
		t.Fatalf("Before(71s) = %v, %v; want the 60s mark: the 70s one is within the skew", m, ok)
	}
	if _, ok := ms.Before(t0.Add(41 * time.Second)); ok {
		t.Fatal("Before found a mark older than every mark")
	}
	if again := ms.Add(Mark{LSN: 5, Time: t0.Add(200 * time.Second)}, time.Second, t0); len(again) != len(ms) {
		t.Fatal("a mark going back in the WAL was added")
	}
}
