//go:build unix

package tcplimit

import "syscall"

// openFileLimit returns the soft RLIMIT_NOFILE.
func openFileLimit() (uint64, bool) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, false
	}
	return uint64(rl.Cur), true
}
