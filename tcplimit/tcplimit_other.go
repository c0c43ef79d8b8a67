//go:build !unix

package tcplimit

// openFileLimit reports that the limit on open files is unknown.
func openFileLimit() (uint64, bool) { return 0, false }
