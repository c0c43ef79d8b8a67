package rrl

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Helpers for tests that depend on privileges: skipping (or failing in CI) when a
// capability is missing, and running a test again as an unprivileged process.

// unprivilegedEnv marks a test binary started by runUnprivileged.
const unprivilegedEnv = "RRL_TEST_UNPRIVILEGED_CHILD"

// unprivilegedID is the uid and gid runUnprivileged runs its child as.
const unprivilegedID = 65534

// capNames names the capabilities tests ask for, for skip messages.
var capNames = map[int]string{
	unix.CAP_SETGID: "CAP_SETGID", unix.CAP_SETUID: "CAP_SETUID",
	unix.CAP_NET_BIND_SERVICE: "CAP_NET_BIND_SERVICE", unix.CAP_NET_ADMIN: "CAP_NET_ADMIN",
	unix.CAP_NET_RAW: "CAP_NET_RAW", unix.CAP_SYS_ADMIN: "CAP_SYS_ADMIN", unix.CAP_BPF: "CAP_BPF",
}

// effectiveCaps returns the process's effective capability set (CapEff in
// /proc/self/status) as a bit mask indexed by capability number.
func effectiveCaps() (uint64, error) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, fmt.Errorf("no CapEff in /proc/self/status")
}

// requirePrivilege skips t unless the process has every capability in caps
// (CAP_BPF when caps is empty) in its effective set, as root normally does. With
// RRL_REQUIRE_BPF=1 (set in CI, which runs as root) a missing capability fails the
// test instead, so that privileged tests cannot pass by skipping.
func requirePrivilege(t testing.TB, caps ...int) {
	t.Helper()
	if len(caps) == 0 {
		caps = []int{unix.CAP_BPF}
	}
	have, err := effectiveCaps()
	if err != nil {
		t.Fatalf("read capabilities: %v", err)
	}
	var missing []string
	for _, c := range caps {
		if have&(1<<c) == 0 {
			name := capNames[c]
			if name == "" {
				name = "capability " + strconv.Itoa(c)
			}
			missing = append(missing, name)
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("needs %s (run as root); euid %d lacks them",
		strings.Join(missing, " and "), os.Geteuid())
	if os.Getenv("RRL_REQUIRE_BPF") == "1" {
		t.Fatal(msg + ", and RRL_REQUIRE_BPF=1 forbids skipping")
	}
	t.Skip(msg + " (set RRL_REQUIRE_BPF=1 to fail instead)")
}

// isUnprivilegedChild reports whether this test binary was started by
// runUnprivileged. The child must also verify that it really lacks privileges (see
// checkUnprivileged) rather than trust the variable.
func isUnprivilegedChild() bool { return os.Getenv(unprivilegedEnv) == "1" }

// checkUnprivileged fails t unless the process runs as a non-root user with no
// effective capabilities.
func checkUnprivileged(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		t.Fatal("unprivileged child runs as root")
	}
	caps, err := effectiveCaps()
	if err != nil {
		t.Fatal(err)
	}
	if caps != 0 {
		t.Fatalf("unprivileged child has capabilities %#x", caps)
	}
}

// checkOnlyCaps fails t unless the process runs as unprivilegedID with exactly the
// capabilities caps in its effective set.
func checkOnlyCaps(t testing.TB, caps ...int) {
	t.Helper()
	if os.Geteuid() != unprivilegedID || os.Getegid() != unprivilegedID {
		t.Fatalf("child runs as uid %d gid %d, want %d", os.Geteuid(), os.Getegid(), unprivilegedID)
	}
	have, err := effectiveCaps()
	if err != nil {
		t.Fatal(err)
	}
	var want uint64
	for _, c := range caps {
		want |= 1 << c
	}
	if have != want {
		t.Fatalf("child has capabilities %#x, want exactly %#x", have, want)
	}
}

// runUnprivileged runs the test named testName (a top-level test function of this
// package) in a copy of the test binary as uid and gid 65534 with no supplementary
// groups and no capabilities, and fails t unless that test passes there; the child's
// output is shown either way. It needs CAP_SETUID and CAP_SETGID, checked with
// requirePrivilege. The child sees unprivilegedEnv=1 and must call checkUnprivileged.
func runUnprivileged(t *testing.T, testName string) {
	t.Helper()
	requirePrivilege(t, unix.CAP_SETUID, unix.CAP_SETGID)
	out, err := unprivilegedRun(t, testName)
	if err != nil {
		t.Fatalf("unprivileged %s: %v\n%s", testName, err, out)
	}
	t.Logf("unprivileged %s (uid %d):\n%s", testName, unprivilegedID, out)
}

// unprivilegedRun is runUnprivileged returning the child's combined output and an
// error when it did not pass, with extra environment variables for the child.
func unprivilegedRun(t *testing.T, testName string, env ...string) ([]byte, error) {
	t.Helper()
	return unprivilegedRunCaps(t, testName, nil, env...)
}

// unprivilegedRunCaps is unprivilegedRun with the capabilities caps raised in the
// child's ambient set, so that they are its whole effective set after exec: what
// `setpriv --reuid 65534 --regid 65534 --clear-groups --inh-caps +cap --ambient-caps
// +cap` gives a program. The child checks them with checkOnlyCaps.
func unprivilegedRunCaps(t *testing.T, testName string, caps []uintptr, env ...string) ([]byte, error) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	exe = executableBy(t, exe, unprivilegedID)

	cmd := exec.Command(exe, "-test.run=^"+testName+"$", "-test.v", "-test.count=1",
		"-test.timeout=60s")
	// A race-enabled binary sleeps a second at exit unless told not to.
	race := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
	cmd.Env = append(append(os.Environ(), unprivilegedEnv+"=1", "GORACE="+race), env...)
	cmd.Dir = filepath.Dir(exe) // the package directory may be closed to unprivilegedID
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential:  &syscall.Credential{Uid: unprivilegedID, Gid: unprivilegedID, Groups: []uint32{}},
		Pdeathsig:   syscall.SIGKILL,
		AmbientCaps: caps,
	}
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, err
	}
	// A child that matched no test or skipped it proves nothing.
	if !strings.Contains(string(out), "--- PASS: "+testName+" ") {
		return out, fmt.Errorf("child did not pass %s", testName)
	}
	return out, nil
}

// executableBy returns path if uid may execute it, else the path of a hard link to
// it, or a copy, in a directory every user can enter, removed when t ends. go test
// builds the binary in a private directory, so the link is the common case.
func executableBy(t *testing.T, path string, uid int) string {
	t.Helper()
	if reachableBy(path, uid) {
		return path
	}
	dir, err := os.MkdirTemp("", "rrl-unpriv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	copyPath := filepath.Join(dir, filepath.Base(path))
	// A hard link is instant; the binary's own mode usually lets everyone run it.
	if os.Link(path, copyPath) == nil && reachableBy(copyPath, uid) {
		return copyPath
	}
	os.Remove(copyPath)
	src, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(copyPath, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	if !reachableBy(copyPath, uid) {
		t.Fatalf("copy %s of the test binary is not executable by uid %d", copyPath, uid)
	}
	return copyPath
}

// reachableBy reports whether uid, which is neither the owner nor in the group of
// any component (true of unprivilegedID), may search every directory on path and execute it.
func reachableBy(path string, uid int) bool {
	abs, err := filepath.Abs(path)
	if err != nil {
		return false
	}
	for p := abs; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return false
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok || int(st.Uid) == uid {
			return false // the owner's bits would apply: do not guess
		}
		need := os.FileMode(0o001) // others may search
		if p == abs {
			need = 0o005 // others may read and execute
		}
		if fi.Mode().Perm()&need != need {
			return false
		}
		if p == "/" {
			return true
		}
	}
}

// The helpers themselves: the child really is unprivileged.
func TestRunUnprivileged(t *testing.T) {
	if isUnprivilegedChild() {
		checkUnprivileged(t)
		if os.Getegid() != unprivilegedID {
			t.Fatalf("egid %d, want %d", os.Getegid(), unprivilegedID)
		}
		groups, err := os.Getgroups()
		if err != nil || len(groups) > 1 || (len(groups) == 1 && groups[0] != unprivilegedID) {
			t.Fatalf("supplementary groups %v (%v), want none", groups, err)
		}
		return
	}
	runUnprivileged(t, "TestRunUnprivileged")
}

// runUnprivileged's child fails when told to, and the parent sees it.
func TestRunUnprivilegedReportsFailure(t *testing.T) {
	if isUnprivilegedChild() {
		if os.Getenv("RRL_TEST_CHILD_FAIL") == "1" {
			t.Error("deliberate failure")
		}
		return
	}
	requirePrivilege(t, unix.CAP_SETUID, unix.CAP_SETGID)
	out, err := unprivilegedRun(t, "TestRunUnprivilegedReportsFailure", "RRL_TEST_CHILD_FAIL=1")
	if err == nil || !strings.Contains(string(out), "deliberate failure") {
		t.Errorf("failing child: err %v, output:\n%s", err, out)
	}
	out, err = unprivilegedRun(t, "TestNoSuchTest")
	if err == nil {
		t.Errorf("child running no test: no error, output:\n%s", out)
	}
}
