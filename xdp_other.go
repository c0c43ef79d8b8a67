//go:build !linux

package rrl

func AttachXDP(pinDir, dev string, opts *XDPOptions) (bool, error) { return false, errNotLinux }
func DetachXDP(pinDir, dev string) error                           { return errNotLinux }
