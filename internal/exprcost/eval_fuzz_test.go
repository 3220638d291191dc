package exprcost

import (
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"
	"cel.dev/cel-go/interpreter"
)

// FuzzEval builds an expression out of the functions an environment of
// Functions declares (any overload of any of them, the macros, literals,
// patterns with counted repeats, and the event's members, a time zone's
// name among them) and an event, and checks, on an expression expr's
// Compile takes, that the two bounds hold on it:
//
//   - the estimate bounds the count: on the event's size, an expression
//     estimated within the limit never reaches it, and its count is at
//     most the estimate, and where it is estimated within the limit its
//     value is the one an evaluation that does not count (Uncounted) gives
//     (so the evaluations that skip counting skip nothing);
//   - the count bounds what is built: an evaluation that stays within
//     the limit made no string or bytes longer than the event's bytes and
//     10 characters a unit it was charged (each character written is
//     charged a tenth), nor a list or map longer than the expression's
//     length times the event's bytes and a unit an element;
//   - the check before each call (guard.go) takes no more than the call is
//     then charged, so that it stops no evaluation the count would let
//     finish;
//   - the count bounds the work, loosely: an evaluation allocates at most
//     1 MiB, 128 bytes a unit charged (the limit for one stopped at the
//     limit: no call runs that would take it past, guard.go) and 64 a byte
//     of the event; and, while fuzzing only (where a failure is a matter
//     to look into, not a flaky run), it takes at most a second, a
//     microsecond a unit and 100 ns a byte of the event: twenty times
//     cel-go's calibration of a unit, 50 ns.
//
// An input whose first byte is '=' is the expression's text itself, for
// the seeds.
func FuzzEval(f *testing.F) {
	for _, seed := range []struct{ prog, event string }{
		{"=" + nestedFormats(3), "\x0ex"},
		{"=" + nestedFormats(1), "\x0cxy"},
		{`=payload.s + payload.t`, "\x0ex"},
		{`=payload.l.map(i, payload.s).size() > 0`, "\x0ax"},
		{`=[1, 2, 3].all(i, payload.l == payload.l)`, "\x0ex"},
		{`=payload.s in payload.l`, "\x0ax"},
		{`="%s %e %x".format([payload.l, payload.d, payload.s])`, "\x06\x01x"},
		{`=payload.s.replace("", "0123456789")`, "\x0ex"},
		{`=payload.s.split("").join("-")`, "\x06x"},
		{`=commit_time.getHours(payload.s) > 1`, "\x00UTC"},
		// The classes random expressions rarely reach: a counted repeat
		// in a pattern (charged by its program, not its length), a long
		// key looked up again and again (payload.m has payload.s as a
		// key), a zone the event names (payload.z, of the event's bytes).
		{`=payload.s.matches(r"\pL{50}x")`, "\x0ex"},
		{`="b".matches("(?:|a){1000}") && payload.t.matches("(a|b){20}c")`, "\x0ex"},
		{`=[1, 2, 3].all(i, payload.s in payload.m)`, "\x0ex"},
		{`=payload.m[payload.s] == 1 && {payload.s: 1}[payload.s] == 1`, "\x0ex"},
		{`=payload.l.all(i, payload.m[payload.s] == 1)`, "\x0ex"},
		{`=[0, 1, 2, 3].all(i, commit_time.getHours(payload.z) >= 0)`, "\x1ex"},
		{`=[0, 1, 2, 3].all(i, commit_time.getHours(payload.z) >= 0)`, "\x3ex"},
		{"\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a", "\x08ab"},
		{"\x11\x22\x33\x44\x55\x66\x77\x88\x99\xaa\xbb\xcc", "\x03a\"b"},
	} {
		f.Add([]byte(seed.prog), []byte(seed.event))
	}
	e := newEnv(f)
	g := newGenerator(e)
	fuzzing := flag.Lookup("test.fuzz").Value.String() != ""
	f.Fuzz(func(t *testing.T, prog, event []byte) {
		text, want := g.expression(prog)
		if _, iss := e.cel.Parse(text); len(iss.Errors()) > 0 {
			return // not iss.Err(): it quotes the line for each error, seconds' worth for a seed's mutation
		}
		a, prg, err := e.compile(text, want)
		if err != nil {
			return
		}
		act, size := fuzzEvent(t, event)
		est, err := e.estimate(a, uint64(size))
		if err != nil {
			t.Fatalf("%s: estimate on %d bytes: %v", text, size, err)
		}

		var overstated string // a call whose least charge, as the check took it, was more than its charge
		checkedHook = func(c interpreter.InterpretableCall, args []ref.Val, least, charged uint64) {
			if least > charged && overstated == "" {
				overstated = fmt.Sprintf("%s%v: least %d, charged %d", c.OverloadID(), args, least, charged)
			}
		}
		defer func() { checkedHook = nil }()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		start := time.Now()
		v, det, err := prg.Eval(act)
		took := time.Since(start)
		runtime.ReadMemStats(&after)
		charged := *det.ActualCost()
		allocated := after.TotalAlloc - before.TotalAlloc
		stopped := atLimit(err)
		where := fmt.Sprintf("%s on a %d-byte event (estimated %d, charged %d, stopped %v)", text, size, est.Max, charged, stopped)

		if overstated != "" {
			t.Fatalf("%s: the check before a call took more than the call's charge: %.300s", where, overstated)
		}
		if stopped && est.Max <= costLimit || !stopped && charged > est.Max {
			t.Fatalf("%s: the estimate is not an upper bound of the count", where)
		}
		// Where the estimate is within the limit, expr evaluates without
		// counting (its Program.fastUpTo). map() and filter() over a map
		// give its keys in Go's order, which is not the same twice.
		ordered := !strings.Contains(text, ".map(") && !strings.Contains(text, ".filter(")
		if est.Max <= costLimit && ordered {
			fast, perr := e.cel.Program(a, e.uncounted...)
			if perr != nil {
				t.Fatal(perr)
			}
			fv, _, ferr := fast.Eval(act)
			if stopped || (ferr == nil) != (err == nil) || err == nil && fv.Equal(v) != types.True {
				t.Fatalf("%s: counted and not counted, the evaluations differ: %v, %v; %v, %v", where, v, err, fv, ferr)
			}
		}
		charge := min(charged, costLimit)
		if stopped {
			charge = costLimit
		}
		if most := 1<<20 + 128*charge + 64*uint64(size); allocated > most {
			t.Fatalf("%s: allocated %d bytes, more than %d", where, allocated, most)
		}
		if most := time.Second + time.Duration(charge)*time.Microsecond + time.Duration(size)*100*time.Nanosecond; fuzzing && took > most {
			t.Fatalf("%s: took %v, more than %v", where, took, most)
		}
		if stopped {
			return
		}
		// What it built, every value it computed on the way.
		sp, err := e.cel.Program(a, append(e.uncounted, cel.CostLimit(costLimit), cel.CostTracking(e.tracker), cel.EvalOptions(cel.OptTrackState))...)
		if err != nil {
			t.Fatal(err)
		}
		_, sdet, _ := sp.Eval(act)
		for _, id := range sdet.State().IDs() {
			val, _ := sdet.State().Value(id)
			n, long := shallow(val)
			most := uint64(size) + 10*charged
			if long {
				most = uint64(len(text))*uint64(size) + charged + uint64(len(text))
			}
			if n > most {
				t.Fatalf("%s: it made a value of %d (characters, bytes or elements), more than %d", where, n, most)
			}
		}
	})
}

// shallow is v's length: a string's characters, bytes' bytes, and, long,
// a list's or map's elements.
func shallow(v ref.Val) (n uint64, long bool) {
	switch v := v.(type) {
	case types.String:
		return uint64(utf8.RuneCountInString(string(v))), false
	case types.Bytes:
		return uint64(len(v)), false
	case traits.Lister:
		return uint64(v.Size().(types.Int)), true
	case traits.Mapper:
		return uint64(v.Size().(types.Int)), true
	}
	return 1, false
}

func nestedFormats(depth int) string {
	x := "payload.s"
	for range depth {
		x = `"` + strings.Repeat("%s", 10) + `".format([` + strings.TrimSuffix(strings.Repeat(x+", ", 10), ", ") + `])`
	}
	return x
}

// fuzzEvent makes an event of b: its first byte says how large (its
// payload's string s, also a key of its map m, is up to 2^15 times the
// rest of b) and which time zone its member z names, the rest what it
// holds. The payload goes through JSON, as the connector reads one, and
// the size is what expr's caller gives: the payload's bytes, the row's and
// 64.
func fuzzEvent(t *testing.T, b []byte) (interpreter.Activation, int) {
	scale, zone, chunk := 0, 0, "x"
	if len(b) > 0 {
		scale, zone = int(b[0]%16), int(b[0]/16)
	}
	if len(b) > 1 {
		chunk = string(b[1:])
	}
	word := func(i int) uint64 {
		var w [8]byte
		copy(w[:], chunk[min(i, len(chunk)):])
		return binary.LittleEndian.Uint64(w[:])
	}
	doubles := []float64{0, -0.5, 1e308, -5e-324, math.MaxInt64, 1.5e-7, 123456.789}
	s := strings.Repeat(chunk, max(1, (1<<scale)/len(chunk)))
	l := []any{}
	for i := range min(1<<scale/8, 1024) {
		switch i % 4 {
		case 0:
			l = append(l, int64(word(i)))
		case 1:
			l = append(l, chunk)
		case 2:
			l = append(l, doubles[word(i)%uint64(len(doubles))])
		case 3:
			l = append(l, []any{chunk, i})
		}
	}
	m := map[string]any{"k": chunk, "n": 1, "l": []any{chunk}, s: 1}
	zones := []string{"Europe/Paris", "tzdata.zi", "leapseconds", "Local", "+02:00", "Nope/Nope", "", "America/Argentina/Buenos_Aires", chunk}
	payload := map[string]any{
		"s": s, "t": chunk, "n": int64(word(0) >> (word(1) % 64)), "d": doubles[word(2)%uint64(len(doubles))],
		"b": word(3)%2 == 0, "l": l, "m": m, "x": []any{s, l, m}[word(4)%3], "z": zones[zone%len(zones)],
	}
	text, err := json.Marshal(payload)
	if err != nil {
		t.Fatal(err)
	}
	a, err := interpreter.NewActivation(map[string]any{
		"payload": payloadOf(t, text), "row": map[string]any{"c": chunk}, "commit_lsn": "0/16B3748", "commit_time": time.Unix(1700000000, 0).UTC(),
		"id": chunk, "tenant": nil, "version": "1.2",
	})
	if err != nil {
		t.Fatal(err)
	}
	return a, len(text) + len(chunk) + 64
}

// generator writes expressions from bytes, choosing among every overload
// of every function the environment declares, so that one a later cel-go
// adds is fuzzed too.
type generator struct {
	env   *env
	calls []call
}

type call struct {
	function string
	member   bool
	args     []*types.Type
	result   *types.Type
}

func newGenerator(e *env) *generator {
	g := &generator{env: e}
	var names []string
	for name := range e.cel.Functions() {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		switch name {
		case "in", "_in_", "@not_strictly_false", "__not_strictly_false__":
			continue // the same overloads as @in, or the macros' own
		}
		for _, o := range e.cel.Functions()[name].OverloadDecls() {
			g.calls = append(g.calls, call{name, o.IsMemberFunction(), o.ArgTypes(), o.ResultType()})
		}
	}
	return g
}

// expression is the text b writes, and what it must give: a string (a
// topic or a key), a bool (a filter) or an int (a partition).
func (g *generator) expression(b []byte) (string, *types.Type) {
	if len(b) > 0 && b[0] == '=' {
		want := types.StringType
		if _, iss := g.env.cel.Parse(string(b[1:])); len(iss.Errors()) > 0 {
			return string(b[1:]), want
		}
		if a, iss := g.env.cel.Compile(string(b[1:])); iss.Err() == nil {
			switch a.OutputType().Kind() {
			case types.BoolKind:
				want = types.BoolType
			case types.IntKind:
				want = types.IntType
			}
		}
		return string(b[1:]), want
	}
	r := &bytesReader{b: b}
	want := []*types.Type{types.StringType, types.BoolType, types.IntType, types.StringType}[r.next()%4]
	t := want
	if r.next()%4 == 3 {
		t = types.DynType
	}
	return g.expr(r, t, 0, nil), want
}

type bytesReader struct {
	b []byte
	i int
}

func (r *bytesReader) next() int {
	if r.i >= len(r.b) {
		return 0
	}
	r.i++
	return int(r.b[r.i-1])
}

// expr writes an expression of type t (dyn: any), depth calls deep, with
// the iteration variables vars in scope.
func (g *generator) expr(r *bytesReader, t *types.Type, depth int, vars []string) string {
	c := r.next()
	if depth >= 4 || c%4 == 0 {
		return leaf(r, t, vars)
	}
	if c%4 == 1 {
		if m, ok := g.macro(r, t, depth, vars); ok {
			return m
		}
	}
	var fits []call
	for _, k := range g.calls {
		if assignable(t, k.result) {
			fits = append(fits, k)
		}
	}
	if len(fits) == 0 {
		return leaf(r, t, vars)
	}
	k := fits[(r.next()<<8|r.next())%len(fits)]
	args := make([]string, len(k.args))
	for i, a := range k.args {
		args[i] = g.expr(r, a, depth+1, vars)
	}
	if k.function == "matches" { // a pattern written in the expression, as Check requires
		args[len(args)-1] = patterns[r.next()%len(patterns)]
	}
	return render(k, args)
}

// assignable reports whether a value of type from may be wanted as t.
func assignable(t, from *types.Type) bool {
	switch {
	case t.Kind() == types.DynKind || from.Kind() == types.DynKind || from.Kind() == types.TypeParamKind:
		return true
	}
	return t.Kind() == from.Kind()
}

func (g *generator) macro(r *bytesReader, t *types.Type, depth int, vars []string) (string, bool) {
	v := fmt.Sprintf("v%d", len(vars))
	inner := append(vars[:len(vars):len(vars)], v)
	over := g.expr(r, types.NewListType(types.DynType), depth+1, vars)
	switch {
	case t.Kind() == types.BoolKind || t.Kind() == types.DynKind && r.next()%2 == 0:
		m := []string{"all", "exists", "exists_one"}[r.next()%3]
		return fmt.Sprintf("%s.%s(%s, %s)", over, m, v, g.expr(r, types.BoolType, depth+1, inner)), true
	case t.Kind() == types.ListKind || t.Kind() == types.DynKind:
		if r.next()%2 == 0 {
			return fmt.Sprintf("%s.map(%s, %s)", over, v, g.expr(r, types.DynType, depth+1, inner)), true
		}
		return fmt.Sprintf("%s.filter(%s, %s)", over, v, g.expr(r, types.BoolType, depth+1, inner)), true
	}
	return "", false
}

var infix = map[string]string{
	"_+_": "+", "_-_": "-", "_*_": "*", "_/_": "/", "_%_": "%", "_==_": "==", "_!=_": "!=",
	"_<_": "<", "_<=_": "<=", "_>_": ">", "_>=_": ">=", "_&&_": "&&", "_||_": "||", "@in": "in",
}

func render(k call, args []string) string {
	if op, ok := infix[k.function]; ok && len(args) == 2 {
		return "(" + args[0] + " " + op + " " + args[1] + ")"
	}
	switch k.function {
	case "!_":
		return "!(" + args[0] + ")"
	case "-_":
		return "-(" + args[0] + ")"
	case "_?_:_":
		return "(" + args[0] + " ? " + args[1] + " : " + args[2] + ")"
	case "_[_]":
		return "(" + args[0] + ")[" + args[1] + "]"
	}
	if k.member {
		return "(" + args[0] + ")." + k.function + "(" + strings.Join(args[1:], ", ") + ")"
	}
	return k.function + "(" + strings.Join(args, ", ") + ")"
}

// patterns are matches()'s: counted repeats (whose programs are far
// larger than their text), classes, anchors, and one that does not
// compile.
var patterns = []string{`r"\pL{50}x"`, `"(?:|a){300}"`, `"(a|b){20}c"`, `"x{30}$"`, `"^.*$"`, `"[0-9]+"`, `"(?i)abc"`, `""`, `"(?:a"`}

// leaf writes a literal, a variable or an event's member of type t.
func leaf(r *bytesReader, t *types.Type, vars []string) string {
	c := r.next()
	pick := func(xs ...string) string { return xs[c%len(xs)] }
	switch t.Kind() {
	case types.StringKind:
		return pick("payload.s", "payload.t", "row.c", "commit_lsn", `"%s"`, `"%d-%s"`, `"%x"`, `"%.3f %e"`, `"a%%b%s"`, `""`, `"."`, `"0123456789"`, "id", "version", `"UTC"`, "payload.z")
	case types.IntKind:
		return pick("payload.n", "0", "1", "-1", "7", "255", "size(payload.l)")
	case types.UintKind:
		return pick("0u", "3u", "uint(payload.n)")
	case types.DoubleKind:
		return pick("payload.d", "2.5", "1e308", "-5e-324")
	case types.BoolKind:
		return pick("true", "false", "payload.b", "has(payload.z)")
	case types.BytesKind:
		return pick(`b"ab"`, `b""`, "bytes(payload.t)")
	case types.ListKind:
		return pick("payload.l", "[]", `["a", payload.t]`, "[payload.s, payload.l]", "payload.m.l", `payload.t.split("")`)
	case types.MapKind:
		return pick("payload.m", "payload", `{"k": payload.s}`, `{payload.t: payload.n}`)
	case types.TimestampKind:
		return pick("commit_time", "timestamp(0)")
	case types.DurationKind:
		return pick(`duration("1s")`, `duration("-2h")`)
	case types.TypeKind:
		return pick("type(payload.x)", "string")
	}
	all := append([]string{"payload.s", "payload.x", "payload.l", "payload.m", "payload.n", "payload.d", "null", "tenant", "payload", "payload.z"}, vars...)
	return all[c%len(all)]
}
