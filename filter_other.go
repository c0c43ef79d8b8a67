//go:build !linux

package rrl

import (
	"fmt"
	"net/netip"
	"syscall"
)

// Socket filters are a Linux feature. Elsewhere the package builds, so that programs
// using RRL, Limiter and Handler run anywhere, and every call that would attach or
// open the kernel filter returns an error for which errors.Is(err, ErrNotSupported)
// holds. A server there still gets its request limits, in Go: Protect and
// NewProtection run them in the reader of their servers or in the Handler.

var errNotLinux = fmt.Errorf("rrl: socket filters need Linux: %w", ErrNotSupported)

// Filter is the kernel filter, which needs Linux: on this platform no Filter is
// ever attached.
type Filter struct{}

// Attach returns an error matching ErrNotSupported: socket filters need Linux.
func Attach(conn syscall.Conn, cfg *Config) (*Filter, error) { return nil, errNotLinux }

// AttachPinned returns an error matching ErrNotSupported: socket filters need Linux.
func AttachPinned(conn syscall.Conn, pinDir string) (*Filter, error) { return nil, errNotLinux }

// OpenPinned returns an error matching ErrNotSupported: socket filters need Linux.
func OpenPinned(pinDir string) (*Filter, error) { return nil, errNotLinux }

// LoadPinned returns an error matching ErrNotSupported: socket filters need Linux.
func LoadPinned(cfg *Config, pinDir string, uid, gid int) error { return errNotLinux }

// Unpin returns an error matching ErrNotSupported: socket filters need Linux.
func Unpin(pinDir string) error { return errNotLinux }

// Attach returns an error matching ErrNotSupported.
func (f *Filter) Attach(conn syscall.Conn) error { return errNotLinux }

// Update returns an error matching ErrNotSupported.
func (f *Filter) Update(cfg *Config) error { return errNotLinux }

// Mode returns ModeNone: nothing is attached.
func (f *Filter) Mode() FilterMode { return ModeNone }

// Close does nothing.
func (f *Filter) Close() error { return nil }

// Stats returns empty counters and an error matching ErrNotSupported.
func (f *Filter) Stats() (FilterStats, error) { return FilterStats{}, errNotLinux }

// Config returns nil.
func (f *Filter) Config() *Config { return nil }

// PinDir returns "".
func (f *Filter) PinDir() string { return "" }

// AttachLocal returns an error matching ErrNotSupported.
func (f *Filter) AttachLocal(local netip.AddrPort) error { return errNotLinux }

// LimitedGroups returns an error matching ErrNotSupported.
func (f *Filter) LimitedGroups() ([]LimitedGroup, error) { return nil, errNotLinux }

// UseCookies returns an error matching ErrNotSupported.
func (f *Filter) UseCookies(c *Cookies) error { return errNotLinux }

// AttachLocal returns an error matching ErrNotSupported: socket filters need Linux.
func AttachLocal(local netip.AddrPort, cfg *Config) (*Filter, error) { return nil, errNotLinux }

// limitedLook returns an error matching ErrNotSupported: WatchLimited does too.
func (f *Filter) limitedLook() ([]LimitedGroup, bool, error) { return nil, false, errNotLinux }
