//go:build !race

package rrl

const handlerRace = false
