//go:build !linux

package rrl

import (
	"context"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/miekg/dns"
)

// Socket filters are a Linux feature. Elsewhere the package builds, so that programs
// using RRL, Limiter and Handler run anywhere, and every call that would attach or
// open the kernel filter returns an error for which errors.Is(err, ErrNotSupported)
// holds. A server there still gets its request limits, in Go: Protect and
// NewProtection run them in the reader of their servers or in the Handler.

var errNotLinux = fmt.Errorf("rrl: socket filters need Linux: %w", ErrNotSupported)

// The Filter API is documented once, in the Linux files (filter_linux.go, attach.go,
// attach_local.go, filter_pin.go, filter_stats.go, filter_types.go, filter_limited.go,
// filter_sketches.go, filter_zones.go, filter_cookies.go, capacity_linux.go). Here every call that would attach, open or read a kernel filter returns errNotLinux, Mode is
// ModeNone, Config is nil and Close does nothing.

// Filter is the kernel filter, which needs Linux: on this platform no Filter is
// ever attached.
type Filter struct{}

func Attach(conn syscall.Conn, cfg *Config) (*Filter, error)         { return nil, errNotLinux }
func attachLocal(local netip.AddrPort, cfg *Config) (*Filter, error) { return nil, errNotLinux }
func AttachPinned(conn syscall.Conn, pinDir string) (*Filter, error) { return nil, errNotLinux }
func OpenPinned(pinDir string) (*Filter, error)                      { return nil, errNotLinux }
func LoadPinned(cfg *Config, pinDir string, uid, gid int) error      { return errNotLinux }
func Unpin(pinDir string) error                                      { return errNotLinux }
func (f *Filter) Attach(conn syscall.Conn) error                     { return errNotLinux }
func (f *Filter) attachLocal(local netip.AddrPort) error             { return errNotLinux }
func (f *Filter) Update(cfg *Config) error                           { return errNotLinux }
func (f *Filter) Mode() FilterMode                                   { return ModeNone }
func (f *Filter) Close() error                                       { return nil }
func (f *Filter) Release() error                                     { return nil }
func (f *Filter) Stats() (FilterStats, error)                        { return FilterStats{}, errNotLinux }
func (f *Filter) Config() *Config                                    { return nil }
func (f *Filter) pinPath() string                                    { return "" }
func (f *Filter) observe(resp *dns.Msg, wildcard string)             {}
func (f *Filter) LimitedGroups() ([]GroupRate, error)                { return nil, errNotLinux }
func (f *Filter) UseCookies(c *Cookies) error                        { return errNotLinux }
func (f *Filter) HeavyCells(n int) ([]SketchCell, error)             { return nil, errNotLinux }
func (f *Filter) GroupRates(src netip.AddrPort) ([]GroupRate, error) { return nil, errNotLinux }
func (f *Filter) RunCapacity(ctx context.Context, conns ...syscall.Conn) error {
	return errNotLinux
}
func (f *Filter) limitedLook() ([]GroupRate, bool, error) { return nil, false, errNotLinux }

func (f *Filter) ZoneRates(names ...string) (*ZoneRates, error) { return nil, errNotLinux }
