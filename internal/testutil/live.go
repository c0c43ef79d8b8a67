//go:build unix

package testutil

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// liveLockEnv marks a process whose ancestor holds the live-test lock: a test binary
// re-run as a child server or command must not wait for its own parent.
const liveLockEnv = "RRL_LIVE_LOCK_HELD"

// LockLive takes the lock that keeps this repository's CPU-bound live tests out of
// each other's way and returns its release. go test runs packages' test binaries
// side by side (one per core), and a test that measures a CPU-capped server's
// capacity (the root package's TestLiveCapacity) measures the machine instead when
// another package floods loopback at the same time; packages whose tests flood take
// the lock for their whole run, that test for its own. It is an advisory lock
// (flock) on a file in the temporary directory, released when the process exits;
// children of the holder (which inherit liveLockEnv) do not take it.
//
// The lock is the process's: calls from tests of one process that overlap share
// it, and it is released when the last of them releases. Within a process the test
// runner already orders tests (a sequential test never overlaps another test), so
// tests that hold it at once are parallel subtests of one test, which chose to run
// side by side (TestLiveXDPScenarios' scenarios, each on a veth pair of its own).
func LockLive() (release func(), err error) {
	held.mu.Lock()
	defer held.mu.Unlock()
	if held.n == 0 && os.Getenv(liveLockEnv) != "" {
		return func() {}, nil
	}
	if held.n == 0 {
		path := filepath.Join(os.TempDir(), "rrl-live-tests.lock")
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o666)
		if err != nil {
			return nil, fmt.Errorf("live-test lock: %w", err)
		}
		for {
			err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
			if err != syscall.EINTR {
				break
			}
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("live-test lock %s: %w", path, err)
		}
		os.Setenv(liveLockEnv, "1")
		held.f = f
	}
	held.n++
	var once sync.Once
	return func() {
		once.Do(func() {
			held.mu.Lock()
			defer held.mu.Unlock()
			if held.n--; held.n == 0 {
				os.Unsetenv(liveLockEnv)
				held.f.Close() // closing the only descriptor releases the lock
				held.f = nil
			}
		})
	}, nil
}

// held is this process's hold on the live-test lock: its descriptor and how many
// holders share it.
var held struct {
	mu sync.Mutex
	n  int
	f  *os.File
}

// HoldLive takes the live-test lock (LockLive) for a test that floods loopback and
// returns its release, which t's end calls if the test has not. A package whose
// floods are a few of its tests holds the lock for those floods, not for its whole
// run (RunLocked), so that the capacity tests of another package, which take the
// lock too, wait only for the floods.
func HoldLive(t testing.TB) (release func()) {
	t.Helper()
	began := time.Now()
	release, err := LockLive()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	if waited := time.Since(began); waited > time.Second {
		t.Logf("waited %v for the live-test lock", waited.Round(100*time.Millisecond))
	}
	return release
}

// RunLocked runs a package's tests holding the live-test lock (see LockLive), for
// the TestMain of a package whose tests flood loopback, and returns the exit code.
func RunLocked(m *testing.M) int {
	release, err := LockLive()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer release()
	return m.Run()
}
