package main

import (
	"bufio"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// dropStartPages gives back the pages of the executable that only starting
// touched. A Go binary's code and read-only data (about 30 MB for cdc) are
// mapped from its file, and every page the process has touched counts in
// its RSS until the kernel needs the memory: the 233 packages' init
// functions, the config's parsing and a session's connect and checkpoint
// read touch about 25 MB of them (the kernel maps 64 KB around each page
// faulted in), most of which a stream never runs again. Dropping the
// mappings' pages (MADV_DONTNEED) takes them out of the RSS at once; the
// ones the stream uses come back on first use as minor faults from the page
// cache, which still holds them: no I/O, and about 300 faults for the
// 19 MB a drain brings back (docs/benchmarks.md, "The binary's start pages
// given back"; the CPU per event did not move). It changes the process's
// RSS, not the page cache: a cgroup that charged the file's pages on first
// read still does.
//
// Only mappings whose every page is the file's are dropped: read-only, and
// with no private copy of a page (smaps' Anonymous 0). A page the dynamic
// loader relocated and then made read-only (RELRO, in a binary linked
// externally) is such a copy, and dropping it would bring back the file's
// bytes in its place. Errors leave the pages where they are: this is an
// economy, never a reason to stop.
func dropStartPages() {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return
	}
	spans, err := startPages(f, exe)
	f.Close()
	if err != nil {
		return
	}
	for _, m := range spans {
		syscall.Syscall(syscall.SYS_MADVISE, m.lo, m.hi-m.lo, syscall.MADV_DONTNEED)
	}
}

// span is a mapping's addresses, [lo, hi).
type span struct{ lo, hi uintptr }

// startPages reads smaps (proc(5)) and returns the mappings of exe that
// may be dropped: read-only, and holding no private copy of a page.
func startPages(smaps io.Reader, exe string) ([]span, error) {
	var drop []span
	var cur *span // exe's read-only mapping being read, until its Anonymous line
	s := bufio.NewScanner(smaps)
	for s.Scan() {
		line := s.Text()
		if k, v, ok := strings.Cut(line, ":"); ok && !strings.Contains(k, " ") {
			// A field of the mapping above: "Anonymous:   0 kB".
			if k == "Anonymous" && cur != nil {
				if strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")) == "0" {
					drop = append(drop, *cur)
				}
				cur = nil
			}
			continue
		}
		// A mapping's header: "lo-hi perms offset dev inode path".
		cur = nil
		fields := strings.Fields(line)
		if len(fields) != 6 || fields[5] != exe || strings.Contains(fields[1], "w") {
			continue
		}
		lo, hi, _ := strings.Cut(fields[0], "-")
		a, err1 := strconv.ParseUint(lo, 16, 64)
		b, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || b <= a {
			continue
		}
		cur = &span{uintptr(a), uintptr(b)}
	}
	return drop, s.Err()
}
