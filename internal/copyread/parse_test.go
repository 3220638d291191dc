package copyread

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
)

// escape is one value as PostgreSQL's COPY TO writes it in text format
// (CopyAttributeOutText, with a tab for the delimiter): a backslash
// before a backslash, and the letters of \b \f \n \r \t \v; every other
// byte as it is.
func escape(v []byte) []byte {
	var out []byte
	for _, c := range v {
		switch c {
		case '\\':
			out = append(out, '\\', '\\')
		case '\b':
			out = append(out, '\\', 'b')
		case '\f':
			out = append(out, '\\', 'f')
		case '\n':
			out = append(out, '\\', 'n')
		case '\r':
			out = append(out, '\\', 'r')
		case '\t':
			out = append(out, '\\', 't')
		case '\v':
			out = append(out, '\\', 'v')
		default:
			out = append(out, c)
		}
	}
	return out
}

// line is a row as COPY TO writes it: its values escaped, \N for NULL,
// tabs between, a newline after.
func line(row [][]byte) []byte {
	var out []byte
	for i, v := range row {
		if i > 0 {
			out = append(out, '\t')
		}
		if v == nil {
			out = append(out, '\\', 'N')
		} else {
			out = append(out, escape(v)...)
		}
	}
	return append(out, '\n')
}

// value is a random value, often of the bytes COPY escapes, or text that
// looks like an escape (\N, a backslash and a letter).
func value(rng *rand.Rand) []byte {
	switch rng.IntN(9) {
	case 0:
		return nil
	case 1:
		return []byte{}
	case 2:
		return []byte(`\N`)
	case 3:
		if rng.IntN(5) == 0 {
			return bytes.Repeat([]byte("x\t\\"), rng.IntN(20000))
		}
	}
	alphabet := []byte("ab\\\t\n\r\b\f\v\x00\x01\x1fN7xé")
	v := make([]byte, rng.IntN(40))
	for i := range v {
		v[i] = alphabet[rng.IntN(len(alphabet))]
		if rng.IntN(10) == 0 {
			v[i] = byte(rng.IntN(256))
		}
	}
	return v
}

// TestWriterGivesBackEveryRow: generated rows, written as COPY TO writes
// them and handed to the writer cut anywhere (one row a message, as the
// server sends, or any piece), come out in batches, in order, each row
// once and value for value (nil for NULL only), each batch within Rows
// and ending at the first row that reaches Budget; and the writer is held
// back while a batch is not taken: it never gets a batch ahead. With
// Flagged, the rows end before the first flagged one, which the last batch
// names as the row after it, with ErrFlagged; the rest, flags not read,
// are dropped.
func TestWriterGivesBackEveryRow(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 56))
		width := 1 + rng.IntN(7)
		rows := make([][][]byte, rng.IntN(300))
		o := Options{Width: width, Rows: 1 + rng.IntN(40), Flagged: seed%2 == 1}
		// Flagged: the rows from flagAt on are dropped, whatever their
		// flags (flagAt past the rows: none is flagged).
		flagAt := max(len(rows)-20+rng.IntN(40), 0)
		var text []byte
		for i := range rows {
			rows[i] = make([][]byte, width)
			for k := range rows[i] {
				rows[i][k] = value(rng)
			}
			switch {
			case !o.Flagged:
				text = append(text, line(rows[i])...)
			case i < flagAt:
				text = append(text, line(append(rows[i], []byte("f")))...)
			case i == flagAt:
				text = append(text, line(append(rows[i], []byte("t")))...)
			default:
				text = append(text, line(append(rows[i], value(rng)))...)
			}
		}
		var flagged [][]byte
		if o.Flagged && flagAt < len(rows) {
			flagged, rows = rows[flagAt], rows[:flagAt]
		}
		if rng.IntN(2) == 0 {
			o.Budget = int64(1 + rng.IntN(2000))
		}
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			out := make(chan batch)
			stop := make(chan struct{})
			defer close(stop)
			w := &writer{o: o, out: out, stop: stop}
			var written atomic.Int64 // rows whose Write returned
			go func() {
				for rest := text; len(rest) > 0; {
					n := len(rest)
					if piece := rng.IntN(3); piece == 0 {
						n = bytes.IndexByte(rest, '\n') + 1 // a row a message
					} else if piece == 1 {
						n = min(n, 1+rng.IntN(50))
					}
					if _, err := w.Write(rest[:n]); err != nil {
						out <- batch{err: err}
						return
					}
					written.Add(int64(bytes.Count(rest[:n], []byte{'\n'})))
					rest = rest[n:]
				}
				w.finish(nil)
			}()
			var got [][][]byte
			var next [][]byte
			for {
				b := <-out
				if b.err == ErrFlagged && flagged != nil {
					if !slices.EqualFunc(b.next, flagged, bytes.Equal) || len(got) > 0 && !slices.EqualFunc(next, flagged, bytes.Equal) {
						t.Fatalf("the rows ended at a flagged row %q, but the last batch said the row after it was %q", flagged, next)
					}
					break
				}
				if b.err != nil {
					t.Fatal(b.err)
				}
				if b.last && flagged != nil {
					t.Fatalf("a copy with a flagged row ended as though it sent every row")
				}
				// The rows written are those taken and a batch more at
				// most: a full one is held until the row after it, whose
				// Write waits in send.
				if n := written.Load(); n > int64(len(got)+len(b.rows)+o.Rows) && (flagged == nil || n <= int64(len(rows))) {
					t.Fatalf("%d rows written with %d taken: the writer ran more than a batch ahead", n, len(got)+len(b.rows))
				}
				if flagged != nil && len(got)+len(b.rows) == len(rows) {
					b.last = true // the rows' last batch, before the flag: not full
				}
				checkBatch(t, o, b)
				b.last = b.last && flagged == nil
				if len(got) > 0 && next != nil && !slices.EqualFunc(next, b.rows[0], bytes.Equal) {
					t.Fatalf("a batch said the row after it was %q; the next batch began with %q", next, b.rows[0])
				}
				if !b.last && b.next == nil && len(got)+len(b.rows) < len(rows) {
					t.Fatalf("a batch ended after %d rows without the row after it", len(got)+len(b.rows))
				}
				next = b.next
				got = append(got, b.rows...)
				if b.last {
					break
				}
			}
			if len(got) != len(rows) {
				t.Fatalf("%d rows out, %d in", len(got), len(rows))
			}
			for i := range rows {
				for k := range rows[i] {
					if (got[i][k] == nil) != (rows[i][k] == nil) || !bytes.Equal(got[i][k], rows[i][k]) {
						t.Fatalf("row %d value %d: got %q (nil %v), want %q (nil %v)", i, k, got[i][k], got[i][k] == nil, rows[i][k], rows[i][k] == nil)
					}
				}
			}
		})
	}
}

// checkBatch checks a batch's bounds: at most Rows rows, and no row
// before its last one reaching Budget.
func checkBatch(t *testing.T, o Options, b batch) {
	t.Helper()
	if len(b.rows) > o.Rows {
		t.Fatalf("a batch of %d rows, more than %d", len(b.rows), o.Rows)
	}
	var size int64
	for i, row := range b.rows {
		if o.Budget > 0 && size >= o.Budget {
			t.Fatalf("row %d of a batch came after %d bytes, past the budget %d", i, size, o.Budget)
		}
		var values int
		for _, v := range row {
			values += len(v)
		}
		l := line(row)
		held := valueBytes(l[:len(l)-1], o.Width) // what the writer holds and counts
		if held < values || held > values+1+len(row) {
			t.Fatalf("row %d: %d bytes held for %d bytes of values", i, held, values)
		}
		size += int64(held)
	}
	if !b.last && len(b.rows) < o.Rows && (o.Budget == 0 || size < o.Budget) {
		t.Fatalf("a batch of %d rows and %d bytes handed out before it was full", len(b.rows), size)
	}
}

// TestUnescape: the escapes COPY FROM reads (octal, hex, any character
// after a backslash) are read as it reads them, and a value cut after a
// backslash, or a row of the wrong width, is an error.
func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`a\\b`: `a\b`, `\101\x42\x4a`: "ABJ", `\0`: "\x00", `\7777`: "\xff7", `\xg`: "xg", `\q`: "q", `\N`: "N" /* inside a value */, `\b\f\n\r\t\v`: "\b\f\n\r\t\v",
	} {
		got, err := unescape(nil, []byte(in))
		if err != nil || string(got) != want {
			t.Errorf("unescape(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := unescape(nil, []byte(`ab\`)); err == nil {
		t.Error("a value ending in a backslash: no error")
	}
	for _, text := range []string{"a\tb\tc\n", "a\n", "a\tb\\\n"} {
		w := &writer{o: Options{Width: 2, Rows: 10}}
		if _, err := w.Write([]byte(text)); err == nil {
			t.Errorf("%q read as a row of 2 values", text)
		}
	}
}

// TestBatchHoldsItsBudget: a batch of values COPY escapes every byte of
// (backslashes, which it doubles) holds about its budget on the heap, not
// the escaped text's twice that (found by the attack on the copy: each
// row's bytes were sized by its line).
func TestBatchHoldsItsBudget(t *testing.T) {
	const rows, size = 8, 1 << 20
	value := bytes.Repeat([]byte(`\`), size)
	var text []byte
	for range rows {
		text = append(text, line([][]byte{value})...)
	}
	o := Options{Width: 1, Rows: 1000, Budget: rows * size}
	out := make(chan batch, 2)
	w := &writer{o: o, out: out, stop: make(chan struct{})}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if _, err := w.Write(text); err != nil {
		t.Fatal(err)
	}
	w.finish(nil)
	b := <-out
	runtime.GC()
	runtime.ReadMemStats(&after)
	if len(b.rows) != rows {
		t.Fatalf("a batch of %d rows, want %d", len(b.rows), rows)
	}
	for _, r := range b.rows {
		if !bytes.Equal(r[0], value) {
			t.Fatal("a value differs")
		}
	}
	held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	runtime.KeepAlive(text)
	runtime.KeepAlive(b)
	if held > o.Budget+o.Budget/10 {
		t.Fatalf("a batch of %d bytes of values holds %d bytes (%.1fx its budget)", o.Budget, held, float64(held)/float64(o.Budget))
	}
}

// TestBatchSlicesFollowItsRows: with chunk_size at its limit (100,000)
// and rows the budget cuts a batch at (1 MB rows, a 1 MB budget), what
// the batches hold follows their rows, not Rows: their value slices and
// row lists are sized by the rows that fit (found by the attack on the
// copy: each one-row batch held 100,000 rows' slices, 19 times its
// values).
func TestBatchSlicesFollowItsRows(t *testing.T) {
	const width, size = 7, 1 << 20
	row := make([][]byte, width)
	row[0] = bytes.Repeat([]byte("x"), size)
	for k := 1; k < width; k++ {
		row[k] = []byte("v")
	}
	var text []byte
	for range 3 {
		text = append(text, line(row)...)
	}
	o := Options{Width: width, Rows: 100000, Budget: size}
	out := make(chan batch, 4)
	w := &writer{o: o, out: out, stop: make(chan struct{})}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if _, err := w.Write(text); err != nil {
		t.Fatal(err)
	}
	w.finish(nil)
	var bs []batch
	for b := range out {
		bs = append(bs, b)
		if b.last {
			break
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	runtime.KeepAlive(text)
	runtime.KeepAlive(bs)
	values := int64(3 * (size + width - 1))
	t.Logf("%d batches, %d bytes of values, %d bytes held (%.1fx)", len(bs), values, held, float64(held)/float64(values))
	if held > 2*values {
		t.Fatalf("3 one-row batches of %d bytes of values hold %d bytes (%.1fx): the value slices are sized to Rows, not the rows", values, held, float64(held)/float64(values))
	}
}
