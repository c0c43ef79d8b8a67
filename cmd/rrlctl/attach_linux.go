package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"

	"github.com/dnsrake/rrl"
	"github.com/dnsrake/rrl/internal/procsock"
)

// A socket filter belongs to the socket, not to the descriptor or the process: an
// eBPF program attached through a copy of a server's socket descriptor filters what
// the server reads, and keeps doing so after the copy is closed. attach and detach
// take their copies with pidfd_getfd (Linux 5.6).

// defaultAttachPin is the pin directory attach and detach use without -pin: one per
// listen address, not per process, so that re-attaching to a restarted server (which
// has new sockets) with the same command finds the same filter, its configuration and
// its sketches. bpffs allows no '.' in a name, so every character of the address
// but letters, digits and '-' becomes '_': 127_0_0_1 (three underscores, never two
// in a row) cannot be an IPv6 address's name, which has seven or a "__".
func defaultAttachPin(local netip.AddrPort) string {
	addr := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '_'
	}, local.Addr().String())
	return fmt.Sprintf("%s/rrl-%s-%d", defaultPinRoot, addr, local.Port())
}

// defaultPinRoot is the bpffs the default pin directories are in; tests use their own.
var defaultPinRoot = "/sys/fs/bpf"

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
server closes them. It prints every socket and the filter it has afterwards.

The filter is pinned in -pin DIR (default /sys/fs/bpf/rrl-ADDR-PORT, one per
listen address): "rrlctl stats|set|config|top -pin DIR" work on it as on any
pinned filter. When DIR already holds a filter, attach reuses it (and applies
the keyword flags to it once every socket has it); otherwise it loads one
configured by the keyword flags, as "rrlctl load" does:
-requests-per-second 50 -ipv4-request-levels "24:1".

A server that restarts gets new sockets without the filter: run the same
attach command again with its new PID.

On an error attach leaves every socket as it found it, as far as the kernel
allows: a socket carries one filter, and attaching replaces it. A socket that had
none, or a classic filter (which the kernel gives back), gets that back; a
locked filter (SO_LOCK_FILTER) is refused before any socket is touched. An eBPF
filter cannot be read back, so sockets that had one are attached last, after
every other socket took the filter, and the one using the most option memory
first: if the kernel runs short of it (ENOMEM, the usual failure of a
re-attach), that one fails first, and no eBPF filter was replaced. Only if one
of them fails for another reason after another of them took the filter does
that other one keep the filter from DIR (which may be the one it had); the
output names it. A pin directory attach created is removed, and keyword flags
are not applied.`,
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
		// Everything that can be checked is checked before any socket is touched.
		saved, err := saveFilters(conns, socks, func(procsock.SavedFilter) bool { return true })
		if err != nil {
			return err
		}
		f, created, err := openOrLoad(c.pin, kw)
		if err != nil {
			return err
		}
		a := &attachment{pin: c.pin, conns: conns, socks: socks, saved: saved, state: make([]string, len(conns))}
		err = a.attach(f)
		if err == nil && !created && len(*kw) > 0 {
			if err = kw.apply(f); err != nil {
				err = fmt.Errorf("apply the keyword flags to %s: %w", c.pin, err)
			}
		}
		if err != nil {
			undoErr := a.undo()
			closeAll(conns)
			f.Release() // the sockets stay as the undo left them
			if created {
				rrl.Unpin(c.pin)
			}
			a.report(c.stdout, a.failureHead(t.pid))
			return errors.Join(err, undoErr)
		}
		cookies := ""
		if kw.secret() || kw.clearsSecret() {
			if st, err := f.Stats(); err == nil {
				cookies = cookieLine(st.CookieSecrets) + "\n"
			}
		}
		closeAll(conns)
		f.Release() // the filter stays on the server's sockets
		verb := "attached the filter pinned in"
		if created {
			verb = "loaded and attached the filter pinned in"
		}
		a.report(c.stdout, fmt.Sprintf("%s %s to %d socket(s) of process %d", verb, c.pin, len(socks), t.pid))
		fmt.Fprintf(c.stdout, "%sif the server restarts, run this command again with its new PID\n", cookies)
		return nil
	},
}

// saveFilters returns the filter of every socket, and fails when one that would be
// touched (touches) is locked: the kernel refuses any change to its filter, even
// attaching one where there is none.
func saveFilters(conns []*procsock.Conn, socks []procsock.Socket, touches func(procsock.SavedFilter) bool) ([]procsock.SavedFilter, error) {
	saved := make([]procsock.SavedFilter, len(conns))
	for i, k := range conns {
		var err error
		if saved[i], err = procsock.SaveFilter(k); err != nil {
			return nil, fmt.Errorf("%s: %w", describe(socks[i:i+1]), err)
		}
	}
	for i, s := range saved {
		if s.Locked && touches(s) {
			what := "its " + s.Kind + " filter is"
			if s.Kind == procsock.NoFilter {
				what = "it has no filter, but"
			}
			return nil, fmt.Errorf("%s: %s locked (SO_LOCK_FILTER), so the kernel refuses to change it; no socket was touched",
				describe(socks[i:i+1]), what)
		}
	}
	return saved, nil
}

// attachment is one attach call's work on the target's sockets.
type attachment struct {
	pin   string
	conns []*procsock.Conn
	socks []procsock.Socket
	saved []procsock.SavedFilter
	// done lists the sockets the filter was attached to, in order.
	done []int
	// state says, after attach or undo, what each socket has and how it came to.
	state []string
}

// attachOrder returns the order attach goes through the sockets in: first, in
// descriptor order, those whose filter can be put back (none, or classic); then
// those with an eBPF filter, which cannot, the one using the most option memory
// first. Short of option memory (the failure a re-attach meets: the new filter is
// charged before the old one is freed), the first of those fails if any does, and
// then none of them was touched.
func attachOrder(saved []procsock.SavedFilter) []int {
	var first, last []int
	for i, s := range saved {
		if s.Restorable() {
			first = append(first, i)
		} else {
			last = append(last, i)
		}
	}
	slices.SortStableFunc(last, func(a, b int) int { return cmp.Compare(saved[b].OptMem, saved[a].OptMem) })
	return append(first, last...)
}

// attach attaches f to the sockets in attachOrder, stopping at the first failure; a
// failed SO_ATTACH_BPF leaves that socket's filter as it was.
func (a *attachment) attach(f *rrl.Filter) error {
	for _, i := range attachOrder(a.saved) {
		if err := attachSocket(f, a.conns[i]); err != nil {
			a.state[i] = a.had(i) + ", as before: attach failed here"
			return fmt.Errorf("attach to %s: %w", describe(a.socks[i:i+1]), err)
		}
		a.done = append(a.done, i)
		a.state[i] = "protected by the filter pinned in " + a.pin + a.replaced(i)
	}
	return nil
}

// attachSocket attaches f to k; tests replace it to fail on a chosen socket.
var attachSocket = func(f *rrl.Filter, k *procsock.Conn) error { return f.Attach(k) }

// undo gives every socket attach reached its earlier filter back where the kernel
// allows, in reverse order, and says so in a.state.
func (a *attachment) undo() error {
	var errs []error
	for _, i := range slices.Backward(a.done) {
		s := a.saved[i]
		if !s.Restorable() {
			a.state[i] = "protected by the filter pinned in " + a.pin + ", which replaced its eBPF filter: the kernel cannot give that back (nor say whether it was this one)"
			continue
		}
		if err := procsock.RestoreFilter(a.conns[i], s); err != nil {
			a.state[i] = "could not be given " + a.had(i) + " back: " + err.Error()
			errs = append(errs, fmt.Errorf("give %s %s back: %w", describe(a.socks[i:i+1]), a.had(i), err))
			continue
		}
		a.state[i] = a.had(i) + " again, as before"
	}
	for i := range a.state {
		if a.state[i] == "" {
			a.state[i] = a.had(i) + ", untouched"
		}
	}
	return errors.Join(errs...)
}

// failureHead is the first line of the report after undo.
func (a *attachment) failureHead(pid int) string {
	kept, lost := 0, 0
	for _, i := range a.done {
		switch {
		case !a.saved[i].Restorable():
			kept++
		case !strings.HasSuffix(a.state[i], "as before"):
			lost++
		}
	}
	head := fmt.Sprintf("attach failed; every socket of process %d has the filter it had", pid)
	if kept > 0 {
		head += fmt.Sprintf(", but %d that had an eBPF filter keep the one pinned in %s", kept, a.pin)
	}
	if lost > 0 {
		head += fmt.Sprintf(", and %d could not be given theirs back", lost)
	}
	return head
}

// had describes socket i's filter before attach.
func (a *attachment) had(i int) string {
	switch a.saved[i].Kind {
	case procsock.NoFilter:
		return "no filter"
	case procsock.ClassicFilter:
		return fmt.Sprintf("its classic filter (%d instructions)", len(a.saved[i].Classic))
	}
	return "its " + a.saved[i].Kind + " filter"
}

// replaced says what the filter attach put on socket i replaced.
func (a *attachment) replaced(i int) string {
	switch a.saved[i].Kind {
	case procsock.NoFilter:
		return " (it had no filter)"
	case procsock.ClassicFilter:
		return " (replacing " + a.had(i) + ")"
	}
	return " (replacing its eBPF filter: another program, or this one from an earlier attach)"
}

// report prints head and every socket's state.
func (a *attachment) report(w io.Writer, head string) {
	fmt.Fprintf(w, "%s:\n", head)
	for i := range a.socks {
		fmt.Fprintf(w, "  %s: %s\n", describe(a.socks[i:i+1]), a.state[i])
	}
}

// openOrLoad opens the filter pinned in dir, or loads one configured by the
// keywords; created reports that it loaded one.
func openOrLoad(dir string, kw *keywords) (f *rrl.Filter, created bool, err error) {
	f, err = rrl.OpenPinned(dir)
	if err == nil {
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

var detachCommand = &command{
	name:        "detach",
	args:        "-pid PID -listen ADDR:PORT [-pin DIR] [-unpin]",
	summary:     "remove the filter from a running server's UDP sockets (root or CAP_SYS_PTRACE)",
	pinOptional: true,
	help: `Remove the eBPF socket filter from every UDP socket process PID has bound to
ADDR:PORT, through copies of its descriptors as attach takes them. The kernel
cannot tell one eBPF filter from another: detach removes whichever is there.
Classic filters, which attach never puts, are left in place. Every socket is
checked first: when one's filter is locked (SO_LOCK_FILTER), which the kernel
refuses to remove, nothing is touched. With -unpin it then removes the pins in
-pin DIR (default /sys/fs/bpf/rrl-ADDR-PORT), as "rrlctl unload" does; without,
the filter stays pinned for a later attach.`,
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
		saved, err := saveFilters(conns, socks, func(s procsock.SavedFilter) bool { return s.Kind == procsock.EBPFFilter })
		if err != nil {
			return err
		}
		var detached, bare, classic []procsock.Socket
		for i, k := range conns {
			switch saved[i].Kind {
			case procsock.NoFilter:
				bare = append(bare, socks[i])
				continue
			case procsock.ClassicFilter:
				classic = append(classic, socks[i])
				continue
			}
			if err := procsock.DetachFilter(k); err != nil {
				// Only a lock set since the check can make the kernel refuse.
				if len(detached) > 0 {
					fmt.Fprintf(c.stdout, "detached the filter from %d socket(s) of process %d before the failure: %s\n", len(detached), t.pid, describe(detached))
				}
				return fmt.Errorf("detach from %s: %w", describe(socks[i:i+1]), err)
			}
			detached = append(detached, socks[i])
		}
		if len(detached) > 0 {
			fmt.Fprintf(c.stdout, "detached the filter from %d socket(s) of process %d: %s\n", len(detached), t.pid, describe(detached))
		}
		if len(classic) > 0 {
			fmt.Fprintf(c.stdout, "left the classic filter of %d socket(s) of process %d in place (attach never puts one): %s\n", len(classic), t.pid, describe(classic))
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
