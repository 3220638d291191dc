//go:build unix

package wal

import "syscall"

// setLowWater sets the socket's receive low-water mark (SO_RCVLOWAT): the
// bytes that must be queued before a poll reports it readable. Linux also
// holds back the wake-up itself (tcp_data_ready), which is what the
// coalescer's wait wants. A failure leaves the mark where it was: a wait
// then wakes the runtime's poller as before, and reads are unchanged.
func setLowWater(raw syscall.RawConn, n int) {
	if raw == nil {
		return
	}
	_ = raw.Control(func(fd uintptr) {
		_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, n)
	})
}
