package rrl

import (
	"flag"
	"os"
	"strconv"
	"testing"
)

// liveParallel is how many parallel tests of this package run at once unless
// -test.parallel says otherwise. The tests marked parallel are the live flood
// scenarios, each with sockets, filter and maps of its own: they wait on the clock
// (a scenario paces its packets over seconds, and the program judges by the clock, not
// by CPU time), and four of them at 10,000 pps each use about half a core under -race,
// so the default of one per core (go test's -parallel is GOMAXPROCS) would leave
// the machine idle.
const liveParallel = 4

func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		flag.Set("test.parallel", strconv.Itoa(liveParallel))
	}
	removeCapServer := prebuildCapServer()
	code := m.Run()
	removeCapServer()
	os.Exit(code)
}
