package main

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"strings"
	"syscall"

	"github.com/dnsrake/rrl"
	"github.com/dnsrake/rrl/internal/procsock"
	"golang.org/x/sys/unix"
)

// A socket filter belongs to the socket, not to the descriptor or the process: an
// eBPF program attached through a copy of a server's socket descriptor filters what
// the server reads, and keeps doing so after the copy is closed. attach and detach
// take their copies with pidfd_getfd (Linux 5.6).

// defaultAttachPin is the pin directory attach and detach use without -pin: one per
// listen address, not per process, so that re-attaching to a restarted server (which
// has new sockets) with the same command finds the same filter, its configuration and
// its sketches.
func defaultAttachPin(local netip.AddrPort) string {
	addr := strings.NewReplacer(":", "_", "%", "_", "/", "_").Replace(local.Addr().String())
	return fmt.Sprintf("/sys/fs/bpf/rrl-%s-%d", addr, local.Port())
}

// targetFlags are the flags attach and detach share.
type targetFlags struct {
	pid    int
	listen string
	local  netip.AddrPort
}

func (t *targetFlags) define(fs *flag.FlagSet) {
	fs.IntVar(&t.pid, "pid", 0, "the server's process `id` (required)")
	fs.StringVar(&t.listen, "listen", "", "the server's UDP `address:port` (0.0.0.0 or [::] for every address on the port; required)")
}

// check validates the flags after parsing and fills in the default pin directory.
func (t *targetFlags) check(c *cli) error {
	if t.pid <= 0 {
		return usagef("-pid PID is required")
	}
	if t.listen == "" {
		return usagef("-listen ADDR:PORT is required")
	}
	var err error
	if t.local, err = netip.ParseAddrPort(t.listen); err != nil {
		return usagef("-listen %s: %v", t.listen, err)
	}
	if t.local.Port() == 0 {
		return usagef("-listen %s: port 0 names no socket", t.listen)
	}
	if c.pin == "" {
		c.pin = defaultAttachPin(t.local)
	}
	return nil
}

// closeAll closes copies of the target's sockets, which leaves the target's own
// descriptors open.
func closeAll(conns []*procsock.Conn) {
	for _, k := range conns {
		k.Close()
	}
}

func describe(socks []procsock.Socket) string {
	var s []string
	for _, k := range socks {
		fam := "IPv4"
		if k.IPv6 {
			fam = "IPv6"
		}
		s = append(s, fmt.Sprintf("fd %d %s %s", k.FD, fam, k.Local))
	}
	return strings.Join(s, ", ")
}

var attachCommand = &command{
	name:        "attach",
	args:        "-pid PID -listen ADDR:PORT [-pin DIR] [-KEYWORD VALUE ...]",
	summary:     "protect a running server's UDP sockets (root or CAP_SYS_PTRACE)",
	pinOptional: true,
	help: `Attach the pinned filter to every UDP socket process PID has bound to
ADDR:PORT (0.0.0.0:PORT or [::]:PORT: to any address on the port, both
families), for servers that never call rrl.Attach: named, Knot, Unbound,
PowerDNS... The sockets are found through /proc/PID/fd and /proc/PID/net/udp{,6}
and copied with pidfd_getfd (Linux 5.6): that needs root or CAP_SYS_PTRACE over
the target, and loading the filter needs CAP_BPF. rrlctl then closes its copies
and exits; the filter stays on the server's sockets until detach, or until the
server closes them.

The filter is pinned in -pin DIR (default /sys/fs/bpf/rrl-ADDR-PORT, one per
listen address): "rrlctl stats|set|config|top -pin DIR" work on it as on any
pinned filter. When DIR already holds a filter, attach reuses it (and applies
the keyword flags to it); otherwise it loads one configured by the keyword flags,
as "rrlctl load" does: -requests-per-second 50 -ipv4-request-levels "24:1".

A server that restarts gets new sockets without the filter: run the same
attach command again with its new PID. On any error nothing is left attached,
and a pin directory attach created is removed.`,
	run: func(c *cli, fs *flag.FlagSet, args []string) error {
		var t targetFlags
		t.define(fs)
		kw := keywordFlags(fs)
		if err := c.parseFlags(fs, args); err != nil {
			return err
		}
		if err := t.check(c); err != nil {
			return err
		}
		if _, err := kw.config(rrl.NewConfig()); err != nil {
			return err
		}
		conns, socks, err := procsock.Copy(t.pid, t.local)
		if err != nil {
			return err
		}
		defer closeAll(conns)
		// A filter already there (the server's own, or an earlier attach) is replaced:
		// say so.
		var replaced []procsock.Socket
		for i, k := range conns {
			if kind, err := procsock.AttachedFilter(k); err == nil && kind != procsock.NoFilter {
				replaced = append(replaced, socks[i])
			}
		}
		f, created, err := openOrLoad(c.pin, kw)
		if err != nil {
			return err
		}
		for i, k := range conns {
			if err = f.Attach(k); err != nil {
				err = fmt.Errorf("attach to %s: %w", describe(socks[i:i+1]), err)
				break
			}
		}
		if err != nil {
			// Take the filter off the sockets it reached, then drop the pins made here.
			for _, k := range conns {
				detachSocket(k)
			}
			f.Close()
			if created {
				rrl.Unpin(c.pin)
			}
			return err
		}
		// Closing the copies first makes Close leave the filter on the target's
		// sockets: it only closes this process's descriptors of the pins.
		for _, k := range conns {
			k.Close()
		}
		f.Close()
		verb := "attached the filter pinned in"
		if created {
			verb = "loaded and attached the filter pinned in"
		}
		fmt.Fprintf(c.stdout, "%s %s to %d socket(s) of process %d: %s\n", verb, c.pin, len(socks), t.pid, describe(socks))
		if len(replaced) > 0 {
			fmt.Fprintf(c.stdout, "replaced the filter those sockets had on %s\n", describe(replaced))
		}
		fmt.Fprintf(c.stdout, "if the server restarts, run this command again with its new PID\n")
		return nil
	},
}

// openOrLoad opens the filter pinned in dir, applying the keywords to it, or loads
// one with them; created reports that it loaded one.
func openOrLoad(dir string, kw *keywords) (f *rrl.Filter, created bool, err error) {
	f, err = rrl.OpenPinned(dir)
	if err == nil {
		if len(*kw) > 0 {
			cfg, _ := kw.config(f.Config())
			if err := f.Update(cfg); err != nil {
				f.Close()
				return nil, false, err
			}
		}
		return f, false, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, false, err
	}
	cfg, _ := kw.config(rrl.NewConfig())
	if err := rrl.LoadPinned(cfg, dir, -1, -1); err != nil {
		return nil, false, err
	}
	if f, err = rrl.OpenPinned(dir); err != nil {
		rrl.Unpin(dir)
		return nil, false, err
	}
	return f, true, nil
}

// detachSocket removes the socket filter of k, whatever it is.
func detachSocket(k *procsock.Conn) error {
	var serr error
	err := k.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DETACH_FILTER, 0)
	})
	if err != nil {
		return err
	}
	return serr
}

var detachCommand = &command{
	name:        "detach",
	args:        "-pid PID -listen ADDR:PORT [-pin DIR] [-unpin]",
	summary:     "remove the filter from a running server's UDP sockets (root or CAP_SYS_PTRACE)",
	pinOptional: true,
	help: `Remove the socket filter from every UDP socket process PID has bound to
ADDR:PORT, through copies of its descriptors as attach takes them. The kernel
cannot tell whose filter a socket has: detach removes whichever is there. With
-unpin it then removes the pins in -pin DIR (default /sys/fs/bpf/rrl-ADDR-PORT),
as "rrlctl unload" does; without, the filter stays pinned for a later attach.`,
	run: func(c *cli, fs *flag.FlagSet, args []string) error {
		var t targetFlags
		t.define(fs)
		unpin := fs.Bool("unpin", false, "also remove the pins in -pin DIR")
		if err := c.parseFlags(fs, args); err != nil {
			return err
		}
		if err := t.check(c); err != nil {
			return err
		}
		conns, socks, err := procsock.Copy(t.pid, t.local)
		if err != nil {
			return err
		}
		defer closeAll(conns)
		var detached, bare []procsock.Socket
		for i, k := range conns {
			kind, err := procsock.AttachedFilter(k)
			if err != nil {
				return fmt.Errorf("%s: %w", describe(socks[i:i+1]), err)
			}
			if kind == procsock.NoFilter {
				bare = append(bare, socks[i])
				continue
			}
			if err := detachSocket(k); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("detach from %s: %w", describe(socks[i:i+1]), err)
			}
			detached = append(detached, socks[i])
		}
		if len(detached) > 0 {
			fmt.Fprintf(c.stdout, "detached the filter from %d socket(s) of process %d: %s\n", len(detached), t.pid, describe(detached))
		}
		if len(bare) > 0 {
			fmt.Fprintf(c.stdout, "no filter on %d socket(s) of process %d: %s\n", len(bare), t.pid, describe(bare))
		}
		if *unpin {
			if err := rrl.Unpin(c.pin); err != nil {
				return err
			}
			fmt.Fprintf(c.stdout, "unpinned %s\n", c.pin)
		}
		return nil
	},
}

// fileGroup returns the group that owns the file fi describes.
func fileGroup(fi os.FileInfo) (int, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Gid), true
}
