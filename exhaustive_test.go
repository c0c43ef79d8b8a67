package rrl

import (
	"os"
	"testing"
)

// Some tests repeat one cheap check tens of thousands of times (the kernel program
// over every source port, floods of 100,000 sources, the Limiter against its
// reference model) or simulate seconds of a server in one goroutine (the capacity
// controller's scenarios). The race detector slows most of them five- to
// twentyfold, and all of them take four to six times as long when another process
// holds a core, while the detector finds nothing more after the first few
// repetitions: each is one goroutine's work. Under the detector they check a
// sample, or one scenario of a family; scripts/test runs them in full without it,
// beside the race run (docs/tests.md, "Where the exhaustive tests run").

// exhaustive reports whether such tests run in full: without the race detector, or
// when RRL_EXHAUSTIVE=1 asks for it under the detector too.
func exhaustive() bool {
	return !raceDetector || os.Getenv("RRL_EXHAUSTIVE") == "1"
}

// exhaustiveOnly skips t unless tests run in full (exhaustive), naming smoke, the
// test that checks the same code under the race detector.
func exhaustiveOnly(t *testing.T, smoke string) {
	t.Helper()
	if !exhaustive() {
		t.Skipf("one goroutine's computation, which the race detector slows five- to twentyfold: scripts/test runs it without the detector, and %s checks the same code under it (RRL_EXHAUSTIVE=1 runs it here)", smoke)
	}
}

// floodSources returns the sources of a flood test: full when tests run in full, a
// tenth of it under the race detector.
func floodSources(full int) int {
	if exhaustive() {
		return full
	}
	return full / 10
}
