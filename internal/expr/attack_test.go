package expr

import (
	"errors"
	"os"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/interpreter"
)

// What an attack on expressions found unbounded (branch attack-expr), and
// holds now. Each test holds an evaluation to the bound FuzzEval
// (internal/exprcost) holds it to: at most 1 s, a microsecond a unit
// charged and 100 ns a byte of the event in time, and 1 MiB, 128 bytes a
// unit charged and 64 a byte of the event in allocation ("twenty times
// cel-go's calibration of a unit, 50 ns"), an evaluation stopped at the
// limit counted as charged the limit. docs/config.md, "Expressions", and
// internal/exprcost/doc.go: every function is charged "in proportion to
// its time", and "an evaluation's time and what it builds are bounded by
// the limit, not by the event" (guard.go).

// measured evaluates p counted, as the router does on an event larger
// than p.fastUpTo, and gives what the count charged it (the limit, if it
// stopped there), how long it took and what it allocated. On an event of
// at most p.fastUpTo bytes the router evaluates it uncounted, with the
// same work.
func measured(t *testing.T, p *Program, a Activation) (charged uint64, took time.Duration, allocated uint64, stopped bool) {
	t.Helper()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	_, det, err := p.prg.Eval(a)
	took = time.Since(start)
	runtime.ReadMemStats(&after)
	allocated = after.TotalAlloc - before.TotalAlloc
	var cancelled interpreter.EvalCancelledError
	switch {
	case errors.As(err, &cancelled) && cancelled.Cause == interpreter.CostLimitExceeded:
		return CostLimit, took, allocated, true
	case err != nil:
		t.Fatalf("counted: %v", err)
	}
	return *det.ActualCost(), took, allocated, false
}

func mostTime(charged uint64, size int) time.Duration {
	return time.Second + time.Duration(charged)*time.Microsecond + time.Duration(size)*100*time.Nanosecond
}

func mostAlloc(charged uint64, size int) uint64 {
	return 1<<20 + 128*charged + 64*uint64(size)
}

// TestRegexCostFollowsItsProgram: a match is estimated and charged a unit
// for each instruction its pattern compiles to and each character of the
// string, as RE2's time is, not by the pattern's length: "\pL{1000}x", 10
// characters and 1,003 instructions, is refused at Compile on its
// estimate; "\pL{50}x" is taken, and on a 200 KB string the count stops it
// before it runs, where it would run for a second. A pattern the event
// gives (payload.p) is refused at Compile: the event would choose what its
// filter costs.
func TestRegexCostFollowsItsProgram(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct{ text, refused string }{
		{`payload.s.matches(r"\pL{1000}x")`, "its estimated cost"},
		{`matches(payload.s, r"\pL{1000}x")`, "its estimated cost"},
		{`payload.s.matches(payload.p)`, "matches() takes a pattern written in the expression"},
		{`payload.s.matches("(" + payload.p + ")")`, "matches() takes a pattern written in the expression"},
		{`payload.s.matches(r"\pL{50}x")`, ""},
		{`matches(payload.s, r"\pL{50}x")`, ""},
	} {
		t.Run(tc.text, func(t *testing.T) {
			p, err := e.Compile(tc.text, WantBool)
			if tc.refused != "" {
				if err == nil || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("Compile: %v; want it refused: %s", err, tc.refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if least := uint64(53 * (AssumedSize + 1)); p.Cost < least {
				t.Errorf("estimated %d, less than 53 instructions times %d characters", p.Cost, AssumedSize)
			}
			for _, n := range []int{5_000, 200_000} {
				s := strings.Repeat("a", n)
				a := vars(t, map[string]any{Payload: map[string]any{"s": s}})
				size := 64 + n + 20
				charged, took, _, stopped := measured(t, p, a)
				t.Logf("%d characters: charged %d (stopped %v), took %v", n, charged, stopped, took)
				if !stopped && charged < uint64(53*n) {
					t.Errorf("%d characters: charged %d, less than 53 instructions a character", n, charged)
				}
				if n == 200_000 && !stopped {
					t.Errorf("200,000 characters: not stopped at the limit")
				}
				if most := mostTime(charged, size); took > most {
					t.Errorf("took %v for %d units charged, more than %v", took, charged, most)
				}
			}
		})
	}
}

// TestRegexCompilesOnceAtCompile: a pattern is compiled when the
// expression is, not at each call. Five matches of "(?:|a){1000}" (12
// characters that compile to 3,002 instructions, and hundreds of
// kilobytes) allocate, counted or not, within what their charge allows
// (their allocation is the matcher's state, which Go's regexp pools);
// five of a class of 15,000 characters, a program of a few instructions
// that takes most of a megabyte to compile, allocate less than a third of
// one compilation (five, one a call, would be fifteen times that). A pattern that does not compile is refused at Compile, and
// so is one the event gives.
func TestRegexCompilesOnceAtCompile(t *testing.T) {
	e := newEnv(t)
	var class strings.Builder
	for r := rune(0x100); r < 0x100+2*15_000; r += 2 {
		class.WriteRune(r)
	}
	allocated := func(f func()) uint64 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc
	}
	a := vars(t, map[string]any{})
	for _, pattern := range []string{`(?:|a){1000}`, "[" + class.String() + "]"} {
		text := strings.TrimSuffix(strings.Repeat(`("b".matches(r"`+pattern+`") || true) && `, 5), " && ")
		p, err := e.Compile(text, WantBool)
		if err != nil {
			t.Fatal(err)
		}
		if p.fast == nil {
			t.Fatal("no uncounted program")
		}
		compiling := allocated(func() { regexp.MustCompile(pattern) })
		for _, prg := range []cel.Program{p.prg, p.fast} {
			var v ref.Val
			var det *cel.EvalDetails
			n := allocated(func() { v, det, err = prg.Eval(a) })
			var charged uint64
			if det != nil && det.ActualCost() != nil {
				charged = *det.ActualCost()
			}
			t.Logf("%.12s: estimated %d; gave %v, %v, charged %d, allocated %d bytes; compiling it allocates %d", pattern, p.Cost, v, err, charged, n, compiling)
			switch {
			case err != nil || v != types.True:
				t.Errorf("%.12s: gave %v, %v", pattern, v, err)
			case prg == p.prg && n > mostAlloc(charged, 64):
				t.Errorf("%.12s: allocated %d bytes for %d units charged, more than %d", pattern, n, charged, mostAlloc(charged, 64))
			case len(pattern) > 1000 && n > compiling/3:
				t.Errorf("%.12s: allocated %d bytes: the pattern was compiled at a call", pattern, n)
			}
		}
	}
	for _, text := range []string{`"b".matches(r"(?:a")`, `"b".matches(payload.p)`, `["a"].exists(x, "b".matches(x))`} {
		if _, err := e.Compile(text, WantBool); err == nil || !strings.Contains(err.Error(), "matches()") {
			t.Errorf("%s: Compile: %v; want it refused", text, err)
		}
	}
}

// TestComputedKeyInALoopIsRefused: a map hashes a string key at its
// length, at each lookup, and no cost count reaches an index's key or a
// map literal's: inside a comprehension's loop, where it would be hashed
// at each step (a 4 MB key in a 40,000-element loop ran for seconds
// charged a few hundred thousand units), Compile refuses an index or a map
// literal whose key is computed and may be a string. A key written in the
// expression, and a computed one outside a loop (hashed once), are taken;
// so is `k in m` in a loop, which is charged its key's length at each
// step.
func TestComputedKeyInALoopIsRefused(t *testing.T) {
	e := newEnv(t)
	for _, text := range []string{
		`payload.l.all(x, payload.m[payload.k] == 1)`,
		`payload.l.exists(x, payload.m[x] == 1)`,
		`payload.l.map(x, {payload.k: 1}).size() > 0`,
		`payload.l.filter(x, [payload.m][0][payload.k] == 1).size() > 0`,
	} {
		if _, err := e.Compile(text, WantBool); err == nil || !strings.Contains(err.Error(), "key computed from the event, inside a comprehension") {
			t.Errorf("%s: Compile: %v; want it refused", text, err)
		}
	}
	key := strings.Repeat("k", 4<<20)
	m := map[string]any{strings.Clone(key): int64(1)} // as the whole parse makes them: two strings
	for i := range 16 {                               // more than a small map's 8 slots: a lookup hashes its key
		m[strings.Repeat("b", i)] = int64(1)
	}
	l := make([]any, 40_000)
	for i := range l {
		l[i] = int64(0)
	}
	a := vars(t, map[string]any{Payload: map[string]any{"m": m, "k": key, "l": l}})
	size := 64 + 2*len(key) + 2*len(l) + 200 // {"k": key, "m": {key: 1, ...}, "l": [0, 0, ...]}
	for _, text := range []string{
		`payload.m[payload.k] == 1`,
		`payload.l.all(x, payload.m["b"] == 1)`,
		`payload.l.all(x, payload.l[0] == 0)`,
		`[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(x, payload.k in payload.m)`,
	} {
		p, err := e.Compile(text, WantBool)
		if err != nil {
			t.Fatalf("%s: %v", text, err)
		}
		charged, took, _, stopped := measured(t, p, a)
		t.Logf("%s: charged %d (stopped %v), took %v", text, charged, stopped, took)
		if most := mostTime(charged, size); took > most {
			t.Errorf("%s: took %v for %d units charged, more than %v", text, took, charged, most)
		}
	}
}

// TestZoneNameIsAZonesName: a time zone an expression names is read from
// the time-zone database only if its name is shaped as the database names
// zones, and once: a name that is a file of the database but no zone
// (Debian's tzdata.zi, 114 KB, read whole before it is found not to be
// one), or the host's own zone (Local), is an error before anything is
// read; an offset is parsed as cel-go does; a zone is loaded at its first
// call and kept, so that fifty calls read it once.
func TestZoneNameIsAZonesName(t *testing.T) {
	e := newEnv(t)
	p, err := e.Compile(`commit_time.getHours(payload.tz)`, WantInt)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2024, 7, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		tz    string
		hours int64 // -1: an error
	}{
		{"Europe/Paris", 14}, {"America/Argentina/Buenos_Aires", 9}, {"Etc/GMT+5", 7}, {"UTC", 12}, {"", 12},
		{"+02:30", 14}, {"-05:00", 7},
		{"tzdata.zi", -1}, {"zone1970.tab", -1}, {"../../etc/passwd", -1}, {"/etc/localtime", -1}, {"Local", -1}, {"localtime", -1},
		{"Europe/../Europe/Paris", -1}, {"a/b/c/d", -1}, {"Europe/", -1}, {"9Lives", -1}, {strings.Repeat("A", 65), -1},
	} {
		a := vars(t, map[string]any{Payload: map[string]any{"tz": tc.tz}, CommitTime: at})
		for _, size := range []int{100, p.fastUpTo + 1} { // uncounted, and counted
			got, err := p.Int(a, size)
			if tc.hours < 0 && err == nil || tc.hours >= 0 && (err != nil || got != tc.hours) {
				t.Errorf("getHours(%.20q) on an event of %d bytes: %d, %v; want %d (-1: an error)", tc.tz, size, got, err, tc.hours)
			}
		}
	}

	const name = "tzdata.zi"
	if _, err := os.Stat("/usr/share/zoneinfo/" + name); err != nil || os.Getenv("ZONEINFO") != "" {
		t.Skip("no /usr/share/zoneinfo/tzdata.zi, or $ZONEINFO set")
	}
	fifty := "[" + strings.TrimSuffix(strings.Repeat("0, ", 50), ", ") + "]"
	p, err = e.Compile(fifty+`.all(i, commit_time.getHours(payload.tz) >= 0 || true)`, WantBool)
	if err != nil {
		t.Fatal(err)
	}
	for _, tz := range []string{name, "Asia/Kolkata"} {
		a := vars(t, map[string]any{Payload: map[string]any{"tz": tz}, CommitTime: at})
		size := 64 + len(tz) + 10
		charged, took, allocated, _ := measured(t, p, a)
		t.Logf("%s: estimated %d; charged %d, took %v, allocated %d bytes", tz, p.Cost, charged, took, allocated)
		if most := mostAlloc(charged, size); allocated > most {
			t.Errorf("%s: allocated %d bytes for %d units charged, more than %d", tz, allocated, charged, most)
		}
		if allocated > 128<<10 {
			t.Errorf("%s: allocated %d bytes for fifty calls: the zone was read at each", tz, allocated)
		}
	}
}

// TestNumberPastADoubleIsAnError: docs/config.md ("Expressions") says a
// number is an int when it is an integer that fits 64 bits and a double
// otherwise. A number past a double's range (1e999 in JSON, or a numeric
// of 400 digits) is neither, and no value of the event: a payload that
// holds one is refused as one that is not JSON is, whether it is parsed
// whole or by member, and whichever member holds it; a numeric column is
// an error an expression reading it fails on. It is never its text.
func TestNumberPastADoubleIsAnError(t *testing.T) {
	e := newEnv(t)
	p, err := e.Compile(`type(payload.n) == double || type(payload.n) == int`, WantBool)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"1e999", "-1E400", "1" + strings.Repeat("0", 400), "1.7976931348623159e308", "0.1e310", "-" + strings.Repeat("9", 309) + ".5"} {
		doc := `{"a": 1, "n": ` + n + `, "l": [` + n + `]}`
		if _, err := JSON([]byte(doc)); err == nil || !strings.Contains(err.Error(), "too large for a double") {
			t.Errorf("%.20s: parsed whole: %v; want it refused", n, err)
		}
		for _, member := range []string{"n", "a", "l"} {
			if err := NewObject([]string{member}).ReadJSON([]byte(doc)); err == nil || !strings.Contains(err.Error(), "too large for a double") {
				t.Errorf("%.20s: read by member %s: %v; want it refused", n, member, err)
			}
		}
		_, err := p.Bool(vars(t, map[string]any{Payload: map[string]any{"n": Number(n)}}), 100+len(n))
		if err == nil || !strings.Contains(err.Error(), "too large for a double") {
			t.Errorf("%.20s: as a numeric column: %v; want an error", n, err)
		}
	}
	for _, n := range []string{"1e308", "-1.7976931348623157e308", "1e-400", "-9223372036854775809", "123456789012345678901234567890", "1.5e3", "NaN", "Infinity", "-Infinity"} {
		if _, ok := Number(n).(interface{ Error() string }); ok {
			t.Errorf("%s: %v; want a number", n, Number(n))
		}
		if n[0] == 'N' || n[0] == 'I' || n[1] == 'I' {
			continue // Postgres' own float values, which JSON has not
		}
		doc := []byte(`{"n": ` + n + `}`)
		whole, err := JSON(doc)
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		o := NewObject([]string{"n"})
		if err := o.ReadJSON(doc); err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		for _, payload := range []any{whole, o, map[string]any{"n": Number(n)}} {
			if ok, err := p.Bool(vars(t, map[string]any{Payload: payload}), 100); !ok || err != nil {
				t.Errorf("%s: not a number: %v, %v", n, ok, err)
			}
		}
	}
}
