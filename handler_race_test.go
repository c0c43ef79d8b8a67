//go:build race

package rrl

// handlerRace reports whether the race detector is on: it allocates.
const handlerRace = true
