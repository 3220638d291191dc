package main

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestStartPagesKeepsPrivateCopies: of the executable's mappings, only the
// read-only ones with no private copy of a page are dropped; a writable
// one, a relocated read-only one (RELRO: Anonymous above 0), another
// file's and a replaced binary's ("(deleted)") stay.
func TestStartPagesKeepsPrivateCopies(t *testing.T) {
	const exe = "/opt/cdc/bin/cdc"
	smaps := `00400000-01330000 r-xp 00000000 fe:00 42 /opt/cdc/bin/cdc
Size:              15552 kB
Rss:                9000 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me
01330000-023b1000 r--p 00f30000 fe:00 42 /opt/cdc/bin/cdc
Rss:                8000 kB
Anonymous:             0 kB
023b1000-02466000 r--p 01fb1000 fe:00 42 /opt/cdc/bin/cdc
Rss:                 700 kB
Anonymous:           696 kB
02466000-02500000 rw-p 02066000 fe:00 42 /opt/cdc/bin/cdc
Anonymous:             0 kB
7f0000000000-7f0000200000 r-xp 00000000 fe:00 7 /usr/lib/x86_64-linux-gnu/libc.so.6
Anonymous:             0 kB
7f0000400000-7f0000500000 r--p 00000000 fe:00 42 /opt/cdc/bin/cdc (deleted)
Anonymous:             0 kB
7f0000600000-7f0000700000 rw-p 00000000 00:00 0
Anonymous:          1024 kB
`
	got, err := startPages(strings.NewReader(smaps), exe)
	if err != nil {
		t.Fatal(err)
	}
	want := []span{{0x400000, 0x1330000}, {0x1330000, 0x23b1000}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("startPages = %x, want %x", got, want)
	}
}

// TestDropStartPages drops this test binary's pages that its start
// touched: the resident part of its file mappings falls, and the code
// that runs next still runs (it faults back in).
func TestDropStartPages(t *testing.T) {
	before := exeResidentKB(t)
	dropStartPages()
	after := exeResidentKB(t)
	t.Logf("the test binary's resident pages: %d kB before, %d kB after", before, after)
	// A test binary's start touches megabytes of it (the packages'
	// inits, the testing package); what runs between the drop and the
	// second reading is the smaps reader, a small part of that.
	if before < 2048 || after > before/2 {
		t.Fatalf("the binary's resident pages went from %d kB to %d kB: want at least 2048 kB before and under half after", before, after)
	}
}

// exeResidentKB sums Rss over this process's mappings of its executable.
func exeResidentKB(t *testing.T) int {
	t.Helper()
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	total, in := 0, false
	for _, l := range strings.Split(string(smaps), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok || strings.Contains(k, " ") {
			f := strings.Fields(l)
			in = len(f) == 6 && f[5] == exe
			continue
		}
		if in && k == "Rss" {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				t.Fatalf("smaps: %q: %v", l, err)
			}
			total += kb
		}
	}
	return total
}
