package rrl

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
)

// The live capacity and names tests run their capped server as this package's
// tests built without the race detector (which would multiply the server's costs)
// when the tests themselves run under it. Linking that binary takes 4 s on a quiet
// machine, and compiling it first (when the build cache lacks it) 15 s more: it is
// built once per process, shared by the tests that need it, and started in the
// background from TestMain when the run will need it, so that it is ready when the
// first of them starts.

// capServerUsers are the tests and benchmarks that start the capped server; a test
// missing here still gets the binary, built when it first asks.
var capServerUsers = []string{
	"TestLiveCapacity", "TestLiveCapacityChanges", "TestLiveNames",
	"BenchmarkLiveCapacity", "BenchmarkLiveCapacityChanges", "BenchmarkLiveNames",
}

var capServer struct {
	once sync.Once
	dir  string // removed by removeCapServer
	exe  string
	err  error
}

// capServerExe returns the server's executable, building it on the first call.
func capServerExe() (string, error) {
	capServer.once.Do(func() {
		dir, err := os.MkdirTemp("", "rrl-capserver-")
		if err != nil {
			capServer.err = err
			return
		}
		capServer.dir = dir
		exe := filepath.Join(dir, "server.test")
		if out, err := exec.Command("go", "test", "-c", "-o", exe, ".").CombinedOutput(); err != nil {
			capServer.err = fmt.Errorf("building the server without the race detector: %v: %s", err, out)
			return
		}
		capServer.exe = exe
	})
	return capServer.exe, capServer.err
}

// prebuildCapServer starts building the server in the background when this run
// will start it (-test.run or -test.bench selects a user, the race detector is on,
// and the process may build the namespaces and cgroups the tests need), and returns
// the function that waits for that build and removes the binary, for TestMain to
// call once the tests have run.
func prebuildCapServer() (remove func()) {
	if !raceDetector || os.Geteuid() != 0 || !selectsCapServer() {
		return func() {}
	}
	if f := flag.Lookup("test.short"); f != nil && f.Value.String() == "true" {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		capServerExe()
	}()
	return func() {
		<-done
		if capServer.dir != "" {
			os.RemoveAll(capServer.dir)
		}
	}
}

// selectsCapServer reports whether -test.run or -test.bench selects a top-level
// test or benchmark that starts the server and -test.skip does not skip it (by the
// patterns' first elements, as go test matches top-level names).
func selectsCapServer() bool {
	pattern := func(name string) (*regexp.Regexp, bool) {
		f := flag.Lookup(name)
		if f == nil || f.Value.String() == "" {
			return nil, false
		}
		re, err := regexp.Compile(strings.SplitN(f.Value.String(), "/", 2)[0])
		return re, err == nil
	}
	run, runSet := pattern("test.run")
	bench, benchSet := pattern("test.bench")
	skip, skipSet := pattern("test.skip")
	for _, name := range capServerUsers {
		var selected bool
		if strings.HasPrefix(name, "Benchmark") {
			selected = benchSet && bench.MatchString(name)
		} else {
			selected = !runSet || run.MatchString(name)
		}
		// A skip pattern with subtests skips only those: the test still runs.
		whole := skipSet && !strings.Contains(flag.Lookup("test.skip").Value.String(), "/")
		if selected && !(whole && skip.MatchString(name)) {
			return true
		}
	}
	return false
}
