//go:build !linux

package main

// dropStartPages is pages_linux.go's economy, which needs Linux's
// /proc/self/smaps and madvise: elsewhere the pages stay.
func dropStartPages() {}
