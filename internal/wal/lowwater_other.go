//go:build !unix

package wal

import "syscall"

// setLowWater does nothing here: the coalescer's wait may wake the
// runtime's poller, and reads are the same.
func setLowWater(syscall.RawConn, int) {}
