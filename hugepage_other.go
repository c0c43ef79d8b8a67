//go:build !linux

package rrl

import "unsafe"

// adviseHugePages does nothing outside Linux.
func adviseHugePages(p unsafe.Pointer, n int) {}
