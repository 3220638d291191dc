package readahead

// Reader hands out the rows its read returns, at most piece at a time,
// reading the next rows in a goroutine while those of the read before are
// handed out.
type Reader struct {
	read  func() (rows [][][]byte, last bool, err error)
	piece int
	// ahead, when not nil, brings the read begun when pending was taken.
	ahead chan result
	// pending are the rows read and not handed out; last: no row is left
	// after them.
	pending [][][]byte
	last    bool
}

type result struct {
	rows [][][]byte
	last bool
	err  error
}

// New is a Reader of the rows read returns (last: no row is left after
// them), handed out at most piece rows at a time (at least one).
func New(read func() (rows [][][]byte, last bool, err error), piece int) *Reader {
	return &Reader{read: read, piece: max(piece, 1)}
}

// Next returns the next rows, at most the piece, and whether they are the
// last: no row is left after them.
func (r *Reader) Next() (rows [][][]byte, last bool, err error) {
	if len(r.pending) == 0 && !r.last {
		res := r.take()
		if res.err != nil {
			return nil, false, res.err
		}
		r.pending, r.last = res.rows, res.last
		if !r.last {
			r.readAhead() // while the rows taken are handed out
		}
	}
	n := min(len(r.pending), r.piece)
	rows, r.pending = r.pending[:n:n], r.pending[n:]
	return rows, r.last && len(r.pending) == 0, nil
}

// Pending is the rows read and not handed out yet, and whether no row is
// left after them.
func (r *Reader) Pending() (rows [][][]byte, last bool) { return r.pending, r.last }

// Wait waits for a read ahead to end: no read runs once it returns. The
// rows it read are dropped.
func (r *Reader) Wait() {
	if r.ahead != nil {
		<-r.ahead
		r.ahead = nil
	}
}

// take is the read begun ahead, or one read now.
func (r *Reader) take() result {
	if r.ahead == nil {
		rows, last, err := r.read()
		return result{rows, last, err}
	}
	res := <-r.ahead
	r.ahead = nil
	return res
}

// readAhead begins the next read, which take takes.
func (r *Reader) readAhead() {
	r.ahead = make(chan result, 1)
	go func(read func() ([][][]byte, bool, error), out chan<- result) {
		rows, last, err := read()
		out <- result{rows, last, err}
	}(r.read, r.ahead)
}
