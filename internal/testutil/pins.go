//go:build linux

package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// MkdirAs creates dir as user uid (group uid), in a child process that has that
// uid and no capabilities, as an unprivileged user would.
func MkdirAs(t testing.TB, dir string, uid int) {
	t.Helper()
	cmd := exec.Command("mkdir", dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mkdir %s as uid %d: %v: %s", dir, uid, err, out)
	}
}

// Repin pins every object pinned in from again in to, under the same names, and
// gives the new pins to uid: what a member of the pins' group, who may open them,
// does to plant them in a directory of its own (the planting is done here with this
// process's privileges; what a victim sees is the same). to must exist.
func Repin(t testing.TB, from, to string, uid int) {
	t.Helper()
	ents, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		fd, err := bpfObj(unix.BPF_OBJ_GET, filepath.Join(from, e.Name()), 0)
		if err != nil {
			t.Fatalf("open pin %s: %v", e.Name(), err)
		}
		dst := filepath.Join(to, e.Name())
		_, err = bpfObj(unix.BPF_OBJ_PIN, dst, fd)
		unix.Close(fd)
		if err != nil {
			t.Fatalf("pin %s: %v", dst, err)
		}
		if err := os.Chown(dst, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
}

// bpfObj runs BPF_OBJ_GET (returning the new descriptor) or BPF_OBJ_PIN of fd on
// path.
func bpfObj(cmd int, path string, fd int) (int, error) {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return -1, err
	}
	attr := struct {
		pathname uint64
		fd       uint32
		flags    uint32
	}{pathname: uint64(uintptr(unsafe.Pointer(p))), fd: uint32(fd)}
	r, _, errno := unix.Syscall(unix.SYS_BPF, uintptr(cmd), uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	runtime.KeepAlive(p)
	if errno != 0 {
		return -1, errno
	}
	return int(r), nil
}
