package copyread

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Options bound a Reader's batches and its wait for the first row.
type Options struct {
	// Width is how many values each row has: a row with more or fewer
	// is an error.
	Width int
	// Rows is the most rows a batch holds (at least one).
	Rows int
	// Budget ends a batch at the row whose values reach it, in bytes
	// (0: no bound); a row larger than it is a batch alone.
	Budget int64
	// FirstRow, when not zero, cancels a copy that sent no row within
	// it: a sort that runs that long before its first row is what a
	// statement timeout would end, and the copy itself runs as long as
	// its rows take to send (FirstRowError).
	FirstRow time.Duration
	// Flagged says each row ends in one value more, a boolean, which is
	// not handed out: the first row where it is true ends the rows
	// handed out, after the rows before it, with ErrFlagged. The server
	// is asked to end the copy (a cancel request), and what it sends
	// until it does is dropped: the copy must run in a savepoint, which
	// the caller rolls back to, so that the connection and its
	// transaction go on (a backfill reads on from there with a cursor in
	// the same snapshot).
	Flagged bool
}

// cancelWait is how long the request to end a copy at a flagged row
// waits for the server's answer.
var cancelWait = 10 * time.Second

// ErrFlagged is what Next returns after the rows before the first
// flagged one (Options.Flagged), whose row Peek then shows.
var ErrFlagged = errors.New("the copy reached a flagged row")

// Reader is a copy's rows, handed out a batch at a time.
type Reader struct {
	out    chan batch
	stop   chan struct{}
	done   chan struct{}
	cancel context.CancelCauseFunc
	ended  bool
	err    error
	next   [][]byte
}

type batch struct {
	rows [][][]byte
	next [][]byte // the row after them, when known
	last bool
	err  error
}

// FirstRowError is a copy cancelled because no row came within
// Options.FirstRow.
type FirstRowError struct{ After time.Duration }

func (e *FirstRowError) Error() string {
	return fmt.Sprintf("the copy sent no row within %s", e.After)
}

// errStopped is what a copy that Stop ended returns.
var errStopped = errors.New("the copy was stopped")

// Start runs sql, a COPY ... TO STDOUT in text format, on conn, which it
// uses until the copy ends or Stop returns, and hands out its rows as o
// says.
func Start(ctx context.Context, conn *pgconn.PgConn, sql string, o Options) *Reader {
	ctx, cancel := context.WithCancelCause(ctx)
	r := &Reader{out: make(chan batch), stop: make(chan struct{}), done: make(chan struct{}), cancel: cancel}
	w := &writer{o: o, out: r.out, stop: r.stop}
	// At the first flagged row the server is asked to end the copy, in
	// place of sending the rest to be dropped: a flag early in a large
	// table would cost a whole transfer of it (found by the attack on
	// the flag). The request has reached the server before the copy is
	// over for the caller, so that it cannot meet a later statement: one
	// that comes after the copy ended finds the backend idle, which
	// ignores it. A request with no answer within cancelWait (or cut by
	// Stop) may still land later, on any statement: the read ends with
	// an error instead, and the caller gives the connection up.
	var asked sync.WaitGroup
	w.flag = func() {
		asked.Add(1)
		go func() {
			defer asked.Done()
			cctx, done := context.WithTimeout(ctx, cancelWait)
			defer done()
			// pgconn returns no error when the answer does not come: the
			// wait's end tells.
			if err := conn.CancelRequest(cctx); err != nil || cctx.Err() != nil {
				w.unanswered = cmp.Or(err, context.Cause(cctx))
			}
		}()
	}
	w.o.Rows = max(w.o.Rows, 1)
	var timer *time.Timer
	if o.FirstRow > 0 {
		timer = time.AfterFunc(o.FirstRow, func() { cancel(&FirstRowError{o.FirstRow}) })
		w.first = func() { timer.Stop() }
	}
	go func() {
		defer close(r.done)
		_, err := conn.CopyTo(ctx, w, sql)
		asked.Wait()
		if timer != nil {
			timer.Stop()
		}
		var first *FirstRowError
		var pgErr *pgconn.PgError
		switch {
		case w.unanswered != nil && context.Cause(ctx) == nil:
			err = fmt.Errorf("postgres did not answer the request to end the copy at a flagged row (%v), which could still cancel a later statement; check that postgres.url reaches Postgres directly, not through a pooler", w.unanswered)
		case w.flagged != nil && errors.As(err, &pgErr) && pgErr.Code == "57014":
			err = nil // the copy ended as asked
		case err == nil && len(w.partial) > 0:
			err = fmt.Errorf("the copy ended inside a row (%d bytes after the last newline)", len(w.partial))
		case err != nil && errors.As(context.Cause(ctx), &first):
			err = first
		}
		w.finish(err)
	}()
	return r
}

// Next returns the next batch of rows, and whether they are the last: no
// row is left after them. After the last, or an error, it returns the
// same again.
func (r *Reader) Next() (rows [][][]byte, last bool, err error) {
	if r.ended {
		return nil, r.err == nil, r.err
	}
	select {
	case b := <-r.out:
		if b.err != nil || b.last {
			r.ended, r.err = true, b.err
		}
		r.next = b.next
		return b.rows, b.last, b.err
	case <-r.done: // only once Stop was called: the last batch is always taken first
		r.ended, r.err = true, errStopped
		return nil, false, errStopped
	}
}

// Peek is the row after the batch Next returned last, which the next
// batch begins with, when known (nil: not, or none): a job saved after
// that batch may say whether it ended a commit.
func (r *Reader) Peek() [][]byte { return r.next }

// Stop ends the copy, if it still runs, and waits until nothing uses the
// connection: a copy cut short closes it.
func (r *Reader) Stop() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	r.cancel(errStopped)
	<-r.done
}

// writer parses the copy's text into rows, as pgconn hands it over (one
// row a message, as Postgres sends it, though any cut is taken).
type writer struct {
	o       Options
	out     chan<- batch
	stop    <-chan struct{}
	first   func() // the first row came
	cur     [][][]byte
	full    [][][]byte // a full batch, held until the row after it is read
	heads   [][]byte   // the value slices left for the batch's rows
	fit     int        // the rows the last full batch held
	bytes   int64
	partial []byte   // a row begun in an earlier Write
	flagged [][]byte // the first flagged row: the rest is dropped
	flag    func()   // the first flagged row came
	// unanswered is the cancel request's error (flag), read once it
	// returned.
	unanswered error
}

func (w *writer) Write(p []byte) (int, error) {
	n := len(p)
	if w.first != nil {
		w.first()
		w.first = nil
	}
	for len(p) > 0 && w.flagged == nil {
		i := bytes.IndexByte(p, '\n') // a newline in a value is escaped
		if i < 0 {
			w.partial = append(w.partial, p...)
			return n, nil
		}
		line := p[:i]
		if len(w.partial) > 0 {
			w.partial = append(w.partial, line...)
			line = w.partial
		}
		if err := w.row(line); err != nil {
			return 0, err
		}
		w.partial, p = w.partial[:0], p[i+1:]
	}
	return n, nil
}

// row adds the row of one line to the batch, which it hands out when full.
func (w *writer) row(line []byte) error {
	width := w.o.Width
	if w.o.Flagged {
		width++
	}
	if len(w.heads) < width {
		// One allocation for the value slices of many rows (a row's
		// slice lives as long as its batch), for as many as the last
		// batch held, then doubling: sized by the rows that fit the
		// budget, not by Rows, which may be 100,000.
		n := min(w.o.Rows-len(w.cur), max(w.fit-len(w.cur), len(w.cur), 16))
		w.heads = make([][]byte, n*width)
	}
	row := w.heads[:width:width]
	w.heads = w.heads[width:]
	// One allocation for the row's values, which an event may keep (a
	// Kafka record aliases them until it is acknowledged), of what they
	// take unescaped (valueBytes): the line's length would hold twice
	// the budget of values that COPY escapes each byte of.
	size := valueBytes(line, width)
	if w.o.Flagged {
		size = max(size-1, 0) // the flag, a letter, is not kept
	}
	buf := make([]byte, 0, size)
	rest := line
	for k := 0; ; k++ {
		if k == width {
			return fmt.Errorf("the copy sent a row of more than %d values", width)
		}
		f, tab := rest, bytes.IndexByte(rest, '\t')
		if tab >= 0 {
			f, rest = rest[:tab], rest[tab+1:]
		}
		switch {
		case w.o.Flagged && k == width-1:
			row[k] = f // read below, before the line is
		case len(f) == 2 && f[0] == '\\' && f[1] == 'N':
			row[k] = nil
		default:
			start := len(buf)
			var err error
			if buf, err = unescape(buf, f); err != nil {
				return err
			}
			row[k] = buf[start:len(buf):len(buf)]
		}
		if tab < 0 {
			if k+1 != width {
				return fmt.Errorf("the copy sent a row of %d values, not %d", k+1, width)
			}
			break
		}
	}
	if w.o.Flagged {
		var err error
		if row, err = w.unflag(row); row == nil || err != nil {
			return err
		}
	}
	if w.cur == nil {
		w.cur = make([][][]byte, 0, min(w.o.Rows, max(w.fit, 16)))
	}
	w.cur = append(w.cur, row)
	w.bytes += int64(cap(buf))
	if w.full != nil {
		// The row after a full batch: it goes out with it, as the
		// next batch's first, so that a save after it knows whether
		// the batch ended a commit.
		full := w.full
		w.full = nil
		if err := w.send(batch{rows: full, next: row}); err != nil {
			return err
		}
	}
	if len(w.cur) < w.o.Rows && (w.o.Budget <= 0 || w.bytes < w.o.Budget) {
		return nil
	}
	w.full, w.fit, w.cur, w.heads, w.bytes = w.cur, len(w.cur), nil, nil, 0
	return nil
}

// unflag is row without its flag (Options.Flagged), or nil once the flag
// is true, the row kept as the first flagged one.
func (w *writer) unflag(row [][]byte) ([][]byte, error) {
	n := len(row) - 1
	flag := row[n]
	row[n], row = nil, row[:n:n] // no hold on the line
	switch {
	case len(flag) == 1 && flag[0] == 't':
		w.flagged = row
		if w.flag != nil {
			w.flag()
		}
		return nil, nil
	case len(flag) != 1 || flag[0] != 'f':
		return nil, fmt.Errorf("the copy sent a flag of %q, not t or f", flag)
	}
	return row, nil
}

// finish hands out what the copy left, once it ended on err (nil: all
// sent): the full batch held, then the rows after it, the last or
// followed by err.
func (w *writer) finish(err error) {
	if err == nil && w.flagged != nil {
		// The rows before the flagged one, each batch followed by the
		// row after it, then the end: none is the last of the copy.
		if w.full != nil && (len(w.cur) > 0 && w.send(batch{rows: w.full, next: w.cur[0]}) != nil ||
			len(w.cur) == 0 && w.send(batch{rows: w.full, next: w.flagged}) != nil) {
			return
		}
		if len(w.cur) > 0 && w.send(batch{rows: w.cur, next: w.flagged}) != nil {
			return
		}
		w.send(batch{err: ErrFlagged, next: w.flagged})
		return
	}
	if w.full != nil && len(w.cur) == 0 && err == nil {
		w.cur, w.full = w.full, nil
	}
	if w.full != nil {
		var next [][]byte
		if len(w.cur) > 0 {
			next = w.cur[0]
		}
		if w.send(batch{rows: w.full, next: next}) != nil {
			return
		}
	}
	if err == nil {
		w.send(batch{rows: w.cur, last: true})
		return
	}
	if len(w.cur) > 0 && w.send(batch{rows: w.cur}) != nil {
		return
	}
	w.send(batch{err: err})
}

// valueBytes is at least the bytes a line's width values take unescaped,
// and at most a byte more for each octal or hex digit past the first
// (COPY TO writes none): the line less its tabs, and a byte for each
// escape, which stands for one byte or, \N, for none.
func valueBytes(line []byte, width int) int {
	n := len(line) - (width - 1)
	for rest := line; ; {
		i := bytes.IndexByte(rest, '\\')
		if i < 0 || i+1 >= len(rest) {
			return max(n, 0)
		}
		n--
		rest = rest[i+2:]
	}
}

// send hands b out, once Next takes it, unless Stop comes first, and
// begins the next batch.
func (w *writer) send(b batch) error {
	select {
	case w.out <- b:
		return nil
	case <-w.stop:
		return errStopped
	}
}

// unescape appends f, one value in COPY's text format, to dst as the
// value itself: a backslash and the letter of a control character (\b,
// \f, \n, \r, \t, \v), up to three octal digits, or x and one or two hex
// digits stand for that byte; before any other character, that
// character.
func unescape(dst, f []byte) ([]byte, error) {
	for {
		i := bytes.IndexByte(f, '\\')
		if i < 0 {
			return append(dst, f...), nil
		}
		dst = append(dst, f[:i]...)
		if i+1 == len(f) {
			return nil, errors.New("the copy sent a value ending in a lone backslash")
		}
		c := f[i+1]
		f = f[i+2:]
		switch {
		case c == 'b':
			c = '\b'
		case c == 'f':
			c = '\f'
		case c == 'n':
			c = '\n'
		case c == 'r':
			c = '\r'
		case c == 't':
			c = '\t'
		case c == 'v':
			c = '\v'
		case '0' <= c && c <= '7':
			c -= '0'
			for j := 0; j < 2 && len(f) > 0 && '0' <= f[0] && f[0] <= '7'; j++ {
				c = c*8 + f[0] - '0'
				f = f[1:]
			}
		case c == 'x' && len(f) > 0 && hex(f[0]) >= 0:
			c = byte(hex(f[0]))
			f = f[1:]
			if len(f) > 0 && hex(f[0]) >= 0 {
				c = c*16 + byte(hex(f[0]))
				f = f[1:]
			}
		}
		dst = append(dst, c)
	}
}

// hex is the value of hex digit c, or -1.
func hex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
