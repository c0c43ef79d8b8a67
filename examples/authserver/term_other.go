//go:build !linux

package main

import "io"

// isTerminal reports false: the demo redraws its progress line only on Linux
// terminals, and writes plain lines elsewhere.
func isTerminal(w io.Writer) bool { return false }
