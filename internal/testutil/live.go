//go:build unix

package testutil

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
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
func LockLive() (release func(), err error) {
	if os.Getenv(liveLockEnv) != "" {
		return func() {}, nil
	}
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
	return func() {
		os.Unsetenv(liveLockEnv)
		f.Close() // closing the only descriptor releases the lock
	}, nil
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
