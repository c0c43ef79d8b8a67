//go:build unix

package testutil

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestLockLiveSharedInProcess: holders of one process that overlap share the lock,
// which another open of the lock file (another process's, as flock sees it) finds
// taken until the last of them releases; a child's environment says it is held, and
// no longer once it is released.
func TestLockLiveSharedInProcess(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir()) // a lock file of the test's own
	t.Setenv(liveLockEnv, "")       // restored when the test ends
	os.Unsetenv(liveLockEnv)
	taken := func() bool {
		f, err := os.OpenFile(filepath.Join(os.TempDir(), "rrl-live-tests.lock"), os.O_RDWR|os.O_CREATE, 0o666)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == syscall.EWOULDBLOCK {
			return true
		}
		if err != nil {
			t.Fatal(err)
		}
		return false
	}
	first, err := LockLive()
	if err != nil {
		t.Fatal(err)
	}
	second, err := LockLive()
	if err != nil {
		t.Fatal(err)
	}
	if !taken() || os.Getenv(liveLockEnv) == "" {
		t.Fatal("two holders: the lock is free, or children would not know it is held")
	}
	first()
	first() // a second call of a release changes nothing
	if !taken() || os.Getenv(liveLockEnv) == "" {
		t.Fatal("the first holder's release freed the lock while the second holds it")
	}
	second()
	if taken() || os.Getenv(liveLockEnv) != "" {
		t.Fatal("the lock is still held after the last release")
	}
	third, err := LockLive()
	if err != nil {
		t.Fatal(err)
	}
	if !taken() {
		t.Fatal("taken again: the lock is free")
	}
	third()
}
