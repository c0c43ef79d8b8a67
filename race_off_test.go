//go:build !race

package rrl

const raceDetector = false
