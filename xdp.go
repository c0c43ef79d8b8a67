//go:build linux

package rrl

// XDP mode: the request limits of a pinned filter, judged at the driver before the
// kernel builds a socket buffer. AttachXDP loads the XDP program (xdp_bpf.c, built
// from the same headers as the socket filter) with the pinned filter's maps, so that
// both judge with one set of sketches, settings and counters, and attaches it to an
// interface through a bpf_link pinned in the pin directory, which holds it after the
// process exits.
//
// Which packets XDP judges is recorded in rrl_xdp_dests, a map of the pin directory
// the socket filter reads too: an entry (interface index, UDP port, address) says
// that XDP judges UDP to that port and address arriving on that interface, and the
// socket filter passes such packets without counting them again, so that each limit
// applies once. The entry with the zero address is there for every (interface, port)
// XDP judges, and says whether it judges every address (xdpDestAny) or only those of
// the other entries. rrl_xdp_state holds the number of (interface, port) pairs, so that the
// socket filter looks nothing up while no XDP program is attached.

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Pins of XDP mode in a pin directory.
const (
	// pinXDPLinkPrefix + an interface name is the pinned link of an attachment.
	pinXDPLinkPrefix = "rrl_xdplink_"
	// xdpProgramName is the XDP program's name in the kernel, by which DetachXDP
	// and AttachXDP tell rrl's attachments from other programs'.
	xdpProgramName = "rrl_xdp"
)

// xdpDestAny in a zero-address entry's flags: XDP judges every address.
const xdpDestAny = 1

// AttachXDP attaches the XDP program of the filter pinned in pinDir (LoadPinned) to
// the interface dev, so that UDP to the server's ports and addresses (opts; nil means
// port 53, every address) is judged at the driver with the pinned filter's limits,
// sketches and counters, and request-limited queries are answered, for the share
// slip-ratio gives, with a truncated response. Everything else passes untouched. A
// socket filter of the same pins does not judge again what XDP judged.
//
// The attachment is a bpf_link pinned in pinDir: it outlives the process, and
// DetachXDP or Unpin removes it. It returns whether the program runs in generic mode:
// asked for native mode on a driver that has none, it falls back to generic mode.
//
// It needs CAP_NET_ADMIN and CAP_BPF, and to be the owner of the pins (root), who
// may write the destinations XDP judges (rrl_xdp_dests). Errors say what to do:
// fs.ErrNotExist for an interface that does not exist, fs.ErrExist when an XDP
// program is already attached to dev (rrl's or another's: it never replaces one),
// ErrNotSupported for a kernel without XDP links (Linux 5.9) or the helpers the
// program calls (Linux 5.18), ErrNotPermitted without the capabilities.
func AttachXDP(pinDir, dev string, opts *XDPOptions) (generic bool, err error) {
	if opts == nil {
		opts = &XDPOptions{}
	}
	ports := opts.Ports
	if len(ports) == 0 {
		ports = []uint16{53}
	}
	for _, p := range ports {
		if p == 0 {
			return false, fmt.Errorf("rrl: attach XDP: port 0")
		}
	}
	for _, a := range opts.Addrs {
		if !a.IsValid() || a.IsUnspecified() {
			return false, fmt.Errorf("rrl: attach XDP: address %v: give the server's addresses, or none for all", a)
		}
	}
	ifc, err := xdpInterface(dev)
	if err != nil {
		return false, err
	}
	if err := xdpCheckFree(ifc); err != nil {
		return false, err
	}
	// OpenPinned checks the pins' layout; the program needs read-write
	// descriptors of the maps it shares, opened below.
	f, err := OpenPinned(pinDir)
	if err != nil {
		return false, err
	}
	f.Close()
	objs, err := loadXDPObjects(pinDir, ports, len(opts.Addrs) == 0)
	if err != nil {
		return false, err
	}
	defer objs.close()

	l, generic, err := attachXDPLink(objs.program, ifc, opts.Generic)
	if err != nil {
		return false, err
	}
	defer l.Close()
	// The destinations after the attach: until they are recorded both programs
	// judge these packets (counted twice for a moment) rather than neither.
	if err := objs.addDests(ifc.Index, ports, opts.Addrs); err != nil {
		objs.removeDests(ifc.Index)
		return false, err
	}
	path := filepath.Join(pinDir, pinXDPLinkPrefix+ifc.Name)
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		objs.removeDests(ifc.Index)
		return false, fmt.Errorf("rrl: attach XDP: remove the stale pin %s: %w", path, err)
	}
	if err := l.Pin(path); err != nil {
		objs.removeDests(ifc.Index)
		return false, fmt.Errorf("rrl: attach XDP: pin the link: %w", err)
	}
	return generic, nil
}

// DetachXDP detaches rrl's XDP program from dev and removes its pinned link from
// pinDir, if given, and its destinations from the pins' rrl_xdp_dests, so that the
// socket filter judges those packets again. It never detaches another's program:
// that is an error for which errors.Is(err, fs.ErrExist) holds. With no rrl program
// on dev the error matches fs.ErrNotExist.
func DetachXDP(pinDir, dev string) error {
	ifc, err := xdpInterface(dev)
	if err != nil {
		return err
	}
	if pinDir != "" {
		if done, err := detachXDPPinned(pinDir, ifc); done || err != nil {
			return err
		}
	}
	l, info, err := findXDPLink(ifc.Index)
	if err != nil {
		return err
	}
	if l == nil && info != nil {
		return fmt.Errorf("rrl: detach XDP: the XDP program on %s (id %d) was attached without a link, not by rrl: detach it with the tool that attached it: %w", dev, info.Program, fs.ErrExist)
	}
	if l == nil {
		if pinDir != "" {
			// A link pin whose interface went away or was detached by hand.
			os.Remove(filepath.Join(pinDir, pinXDPLinkPrefix+ifc.Name))
		}
		return fmt.Errorf("rrl: detach XDP: no XDP program of rrl attached to %s: %w", dev, fs.ErrNotExist)
	}
	defer l.Close()
	prog, err := ebpf.NewProgramFromID(info.Program)
	if err != nil {
		return fmt.Errorf("rrl: detach XDP: program %d on %s: %w", info.Program, dev, err)
	}
	defer prog.Close()
	if pi, err := prog.Info(); err != nil || pi.Name != xdpProgramName {
		name := ""
		if pi != nil {
			name = pi.Name
		}
		return fmt.Errorf("rrl: detach XDP: the program on %s is %q, not rrl's: detach it with the tool that attached it: %w", dev, name, fs.ErrExist)
	}
	dests, err := xdpDestsOf(prog)
	if err != nil {
		return err
	}
	defer dests.close()
	// The destinations go first: from now on the socket filter judges these
	// packets, so that none goes unjudged while the program leaves.
	if err := dests.removeDests(ifc.Index); err != nil {
		return err
	}
	if err := l.Detach(); err != nil {
		return fmt.Errorf("rrl: detach XDP from %s: %w", dev, err)
	}
	if pinDir != "" {
		path := filepath.Join(pinDir, pinXDPLinkPrefix+ifc.Name)
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("rrl: detach XDP: %w", err)
		}
	}
	return nil
}

// detachXDPPinned detaches rrl's XDP program from ifc through the link pinned in
// pinDir, when that link is the one attaching the program on ifc, and reports
// whether it did. It needs no more than attaching does, CAP_BPF and CAP_NET_ADMIN
// as the pins' owner: finding a link or a program by its ID, as DetachXDP does
// without the pin, needs CAP_SYS_ADMIN. A link in rrl's pin directory under rrl's
// name is rrl's.
func detachXDPPinned(pinDir string, ifc *net.Interface) (bool, error) {
	path := filepath.Join(pinDir, pinXDPLinkPrefix+ifc.Name)
	l, err := link.LoadPinnedLink(path, nil)
	if err != nil {
		return false, nil // no such pin, or not ours to open: the general way
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil || info.Type != link.XDPType {
		return false, nil
	}
	prog, err := xdpAttachedProgram(ifc.Index)
	if err != nil {
		return false, err
	}
	if x := info.XDP(); x == nil || int(x.Ifindex) != ifc.Index || uint32(info.Program) != prog {
		return false, nil // a stale pin: the general way finds what is attached
	}
	dests := &xdpAttachment{}
	defer dests.close()
	if dests.dests, err = ebpf.LoadPinnedMap(filepath.Join(pinDir, pinXDPDests), nil); err == nil {
		dests.state, err = ebpf.LoadPinnedMap(filepath.Join(pinDir, pinXDPState), nil)
	}
	if err != nil {
		return false, nil
	}
	// As in DetachXDP: the destinations first, so that no packet goes unjudged.
	if err := dests.removeDests(ifc.Index); err != nil {
		return true, err
	}
	if err := l.Detach(); err != nil {
		return true, fmt.Errorf("rrl: detach XDP from %s: %w", ifc.Name, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return true, fmt.Errorf("rrl: detach XDP: %w", err)
	}
	return true, nil
}

// xdpInterface finds dev in the calling thread's network namespace.
func xdpInterface(dev string) (*net.Interface, error) {
	ifc, err := net.InterfaceByName(dev)
	if err != nil {
		return nil, fmt.Errorf("rrl: XDP: no interface %q in this network namespace (ip link lists them): %w", dev, fs.ErrNotExist)
	}
	return ifc, nil
}

// xdpCheckFree fails when an XDP program is attached to ifc through a link, naming
// it; a program attached through netlink shows as EBUSY at the attach instead.
func xdpCheckFree(ifc *net.Interface) error {
	l, info, err := findXDPLink(ifc.Index)
	if err != nil || info == nil {
		return err
	}
	if l != nil {
		l.Close()
	}
	name := ""
	if p, err := ebpf.NewProgramFromID(info.Program); err == nil {
		if pi, err := p.Info(); err == nil {
			name = pi.Name
		}
		p.Close()
	}
	if name == xdpProgramName {
		return fmt.Errorf("rrl: attach XDP: rrl's XDP program is already attached to %s (link %d): detach it first (rrlctl xdp detach -dev %s): %w", ifc.Name, info.ID, ifc.Name, fs.ErrExist)
	}
	return fmt.Errorf("rrl: attach XDP: %s already has an XDP program (%q, id %d), which rrl never replaces: detach it with the tool that attached it, or chain both with a dispatcher (libxdp): %w",
		ifc.Name, name, info.Program, fs.ErrExist)
}

// findXDPLink returns the link through which the XDP program attached to interface
// index ifindex of this network namespace is attached, or nil when none is, or when
// it is attached without a link (its ID is then *progID).
func findXDPLink(ifindex int) (link.Link, *link.Info, error) {
	prog, err := xdpAttachedProgram(ifindex)
	if err != nil || prog == 0 {
		return nil, nil, err
	}
	var it link.Iterator
	defer it.Close()
	for it.Next() {
		info, err := it.Link.Info()
		if err != nil || info.Type != link.XDPType || uint32(info.Program) != prog {
			continue
		}
		if x := info.XDP(); x != nil && int(x.Ifindex) == ifindex {
			return it.Take(), info, nil
		}
	}
	if err := it.Err(); err != nil {
		if isPermission(err) {
			return nil, nil, &sysError{op: "rrl: XDP: list links", sentinel: ErrNotPermitted, err: err, hint: xdpPermissionHint}
		}
		return nil, nil, fmt.Errorf("rrl: XDP: list links: %w", err)
	}
	// Attached through netlink, without a link.
	return nil, &link.Info{Program: ebpf.ProgramID(prog)}, nil
}

const xdpPermissionHint = "XDP needs CAP_NET_ADMIN and CAP_BPF, as the owner of the pins (run as root, or grant them with setcap cap_net_admin,cap_bpf+ep)"

// attachXDPLink attaches prog to ifc, natively unless generic, falling back to
// generic mode when the driver has no native XDP.
func attachXDPLink(prog *ebpf.Program, ifc *net.Interface, generic bool) (link.Link, bool, error) {
	flags := link.XDPDriverMode
	if generic {
		flags = link.XDPGenericMode
	}
	l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifc.Index, Flags: flags})
	if err != nil && !generic && errors.Is(err, unix.EOPNOTSUPP) {
		// The driver has no native XDP (ndo_bpf): generic mode runs the same
		// program on the socket buffer, before the IP layer.
		generic = true
		l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifc.Index, Flags: link.XDPGenericMode})
	}
	if err == nil {
		return l, generic, nil
	}
	switch {
	case errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EEXIST):
		return nil, false, fmt.Errorf("rrl: attach XDP: %s already has an XDP program, which rrl never replaces (ip link show dev %s names it): detach it with the tool that attached it: %w: %w",
			ifc.Name, ifc.Name, fs.ErrExist, err)
	case errors.Is(err, ebpf.ErrNotSupported):
		return nil, false, notSupportedError("rrl: attach XDP", fmt.Errorf("XDP links need Linux 5.9 or later: %w", err))
	case isPermission(err):
		return nil, false, &sysError{op: "rrl: attach XDP", sentinel: ErrNotPermitted, err: err, hint: xdpPermissionHint}
	}
	return nil, false, fmt.Errorf("rrl: attach XDP to %s: %w", ifc.Name, err)
}

// xdpAttachment are the XDP program and the destination maps it shares with the pins.
type xdpAttachment struct {
	program *ebpf.Program
	dests   *ebpf.Map
	state   *ebpf.Map
}

func (o *xdpAttachment) close() {
	if o.program != nil {
		o.program.Close()
	}
	for _, m := range []*ebpf.Map{o.dests, o.state} {
		if m != nil {
			m.Close()
		}
	}
}

// loadXDPObjects loads the XDP program for ports (at every address if anyAddr,
// else at those rrl_xdp_dests lists) with every map it shares with the socket filter
// taken from the pins in pinDir.
func loadXDPObjects(pinDir string, ports []uint16, anyAddr bool) (*xdpAttachment, error) {
	spec, err := xdpSpec(ports, anyAddr)
	if err != nil {
		return nil, err
	}
	repl := map[string]*ebpf.Map{}
	defer func() {
		for _, m := range repl {
			m.Close()
		}
	}()
	for name := range spec.Maps {
		path := filepath.Join(pinDir, name)
		if _, err := os.Lstat(path); err != nil {
			continue // the program's own (scratch space, test input)
		}
		m, err := ebpf.LoadPinnedMap(path, xdpPinAccess(name))
		if err != nil {
			return nil, openError(path, err)
		}
		repl[name] = m
	}
	for _, name := range []string{pinXDPDests, pinXDPState, pinSettings, pinCells, pinCounters} {
		if repl[name] == nil {
			return nil, fmt.Errorf("rrl: %s: %w: no %s (pinned by a version without XDP mode: unload and load again)", pinDir, ErrLayoutMismatch, name)
		}
	}
	prog, err := loadXDPProgram(spec, repl)
	if err != nil {
		return nil, err
	}
	o := &xdpAttachment{program: prog}
	// Clones: the replacements close when this returns.
	var cerr error
	if o.dests, cerr = repl[pinXDPDests].Clone(); cerr == nil {
		o.state, cerr = repl[pinXDPState].Clone()
	}
	if cerr != nil {
		o.close()
		return nil, fmt.Errorf("rrl: XDP: %w", cerr)
	}
	return o, nil
}

// xdpPinAccess is how loadXDPObjects opens the pin name: read-write only the
// destinations it writes (their owner may, pinModes), write-only the cookie secrets
// (mode 0220), every other map read-only. The program writes through any
// descriptor of a map; the pins' modes limit only what this process may do with
// them, so that attaching needs no CAP_DAC_OVERRIDE, only to be the pins' owner.
func xdpPinAccess(name string) *ebpf.LoadPinOptions {
	switch name {
	case pinXDPDests, pinXDPState:
		return nil
	case pinCookieSecrets:
		return &ebpf.LoadPinOptions{WriteOnly: true}
	}
	return &ebpf.LoadPinOptions{ReadOnly: true}
}

// xdpRequiredHelpers are the helpers of the XDP program that not every kernel this
// package builds for has, newest first.
var xdpRequiredHelpers = []asm.BuiltinFunc{
	asm.FnXdpLoadBytes,     // Linux 5.18
	asm.FnXdpGetBuffLen,    // Linux 5.18
	asm.FnKtimeGetCoarseNs, // Linux 5.11
	asm.FnJiffies64,        // Linux 5.5
}

// xdpSpec is the XDP program's spec with its destinations, ports (at every address
// if anyAddr), set.
func xdpSpec(ports []uint16, anyAddr bool) (*ebpf.CollectionSpec, error) {
	spec, err := loadXdp()
	if err != nil {
		return nil, fmt.Errorf("rrl: XDP program spec: %w", err)
	}
	var bitmap [65536 / 64]uint64
	for _, p := range ports {
		bitmap[p>>6] |= 1 << (p & 63)
	}
	any := uint32(0)
	if anyAddr {
		any = 1
	}
	if err := spec.Variables["xdp_ports"].Set(bitmap); err != nil {
		return nil, fmt.Errorf("rrl: XDP program spec: %w", err)
	}
	if err := spec.Variables["xdp_any_addr"].Set(any); err != nil {
		return nil, fmt.Errorf("rrl: XDP program spec: %w", err)
	}
	return spec, nil
}

// loadXDPProgram loads the XDP program of spec with the maps it shares (repl).
func loadXDPProgram(spec *ebpf.CollectionSpec, repl map[string]*ebpf.Map) (*ebpf.Program, error) {
	var objs struct {
		Program *ebpf.Program `ebpf:"rrl_xdp"`
	}
	if err := spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{MapReplacements: repl}); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			if missing := missingXDPHelper(); missing != nil {
				return nil, notSupportedError("rrl: load XDP program", missing)
			}
		}
		if isPermission(err) {
			return nil, &sysError{op: "rrl: load XDP program", sentinel: ErrNotPermitted, err: err, hint: xdpPermissionHint}
		}
		return nil, loadError("rrl: load XDP program", err)
	}
	return objs.Program, nil
}

// missingXDPHelper names the first helper the XDP program needs that the kernel
// lacks for XDP programs, or returns nil.
func missingXDPHelper() error {
	for _, fn := range xdpRequiredHelpers {
		if err := features.HaveProgramHelper(ebpf.XDP, fn); errors.Is(err, ebpf.ErrNotSupported) {
			return fmt.Errorf("the kernel lacks the helper %s for XDP programs: %w", fn, err)
		}
	}
	return nil
}

// xdpDestsOf opens the destination maps of a loaded XDP program.
func xdpDestsOf(prog *ebpf.Program) (*xdpAttachment, error) {
	pi, err := prog.Info()
	if err != nil {
		return nil, fmt.Errorf("rrl: XDP: program info: %w", err)
	}
	ids, ok := pi.MapIDs()
	if !ok {
		return nil, notSupportedError("rrl: XDP: the program's maps", errors.New("program info lists no maps"))
	}
	o := &xdpAttachment{}
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			continue
		}
		mi, err := m.Info()
		switch {
		case err == nil && mi.Name == pinXDPDests && o.dests == nil:
			o.dests = m
		case err == nil && mi.Name == pinXDPState && o.state == nil:
			o.state = m
		default:
			m.Close()
		}
	}
	if o.dests == nil || o.state == nil {
		o.close()
		return nil, fmt.Errorf("rrl: XDP: the attached program has no %s: %w", pinXDPDests, ErrLayoutMismatch)
	}
	return o, nil
}

// xdpDestKey is struct xdp_dest_key (bpf/xdp_dests.h): an interface, a UDP port
// and an address (16 bytes, IPv4 mapped; zero for the port's own entry).
type xdpDestKey = xdpXdpDestKey

// addDests records that XDP on ifindex judges UDP to ports at addrs (nil: any).
func (o *xdpAttachment) addDests(ifindex int, ports []uint16, addrs []netip.Addr) error {
	for _, p := range ports {
		flags := uint32(0)
		if len(addrs) == 0 {
			flags = xdpDestAny
		}
		for _, a := range addrs {
			// IPv4 as IPv4-mapped IPv6, as the programs look it up.
			k := xdpDestKey{Ifindex: uint32(ifindex), Port: p, Addr: a.As16()}
			if err := o.dests.Put(k, uint32(1)); err != nil {
				return fmt.Errorf("rrl: XDP: record %v port %d: %w", a, p, err)
			}
		}
		// The port's entry last: until it is there, neither program looks further.
		if err := o.dests.Put(xdpDestKey{Ifindex: uint32(ifindex), Port: p}, flags); err != nil {
			return fmt.Errorf("rrl: XDP: record port %d: %w", p, err)
		}
	}
	return o.recount()
}

// removeDests removes every destination of ifindex.
func (o *xdpAttachment) removeDests(ifindex int) error {
	var k xdpDestKey
	var v uint32
	var gone []xdpDestKey
	it := o.dests.Iterate()
	for it.Next(&k, &v) {
		if int(k.Ifindex) == ifindex {
			gone = append(gone, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("rrl: XDP: %w", err)
	}
	// Ports' own entries first, so that no lookup finds a port without its
	// addresses.
	for _, zeroFirst := range []bool{true, false} {
		for _, k := range gone {
			if (k.Addr == [16]byte{}) == zeroFirst {
				if err := o.dests.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
					return fmt.Errorf("rrl: XDP: %w", err)
				}
			}
		}
	}
	return o.recount()
}

// recount writes the number of (interface, port) pairs into rrl_xdp_state.
func (o *xdpAttachment) recount() error {
	var k xdpDestKey
	var v uint32
	n := uint32(0)
	it := o.dests.Iterate()
	for it.Next(&k, &v) {
		if k.Addr == [16]byte{} {
			n++
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("rrl: XDP: %w", err)
	}
	if err := o.state.Put(uint32(0), n); err != nil {
		return fmt.Errorf("rrl: XDP: %w", err)
	}
	return nil
}

// removeXDPLinks removes the pinned XDP links in pinDir (for Unpin), which detaches
// them unless a process holds one open.
func removeXDPLinks(pinDir string) error {
	entries, err := os.ReadDir(pinDir)
	if err != nil {
		return nil
	}
	var errs []error
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), pinXDPLinkPrefix) {
			if err := DetachXDP(pinDir, strings.TrimPrefix(e.Name(), pinXDPLinkPrefix)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
			os.Remove(filepath.Join(pinDir, e.Name()))
		}
	}
	return errors.Join(errs...)
}
