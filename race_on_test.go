//go:build race

package rrl

// raceDetector reports whether the tests run under the race detector, which
// allocates and slows every memory access.
const raceDetector = true
