//go:build linux

// Package procsock finds the UDP sockets a process (this one or another) has bound to
// a local address, and hands them out as syscall.Conn values for the rrl package's
// attach calls.
//
// How it finds them: every open socket descriptor of a process is a link
// "socket:[INODE]" in /proc/PID/fd, and every UDP socket of the process's network
// namespace is a line of /proc/PID/net/udp (IPv4) or /proc/PID/net/udp6 (IPv6,
// including dual-stack sockets), with its local address and the same inode. A socket
// matches when its inode is among the process's descriptors and its local address is
// the one asked for. Only the UDP tables are read, so TCP sockets never match; the
// TCP tables are read only to say so when nothing else matched.
package procsock

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Socket is one UDP socket of a process.
type Socket struct {
	FD    int            // a descriptor of the socket in the process (the lowest, when it has several)
	Inode uint64         // the socket's inode, unique while the socket lives
	Local netip.AddrPort // its bound address; IPv4-mapped IPv6 addresses unmapped
	IPv6  bool           // found in udp6: an AF_INET6 socket (dual-stack when Local is ::)
}

// ErrNoSocket is returned (wrapped) when no UDP socket of the process matches.
var ErrNoSocket = errors.New("no matching UDP socket")

// Matches reports whether a socket bound to bound serves local: the same port, and
// the same address, or any address when local's address is unspecified (0.0.0.0 and
// :: alike, so that either names a dual-stack socket too).
func Matches(local, bound netip.AddrPort) bool {
	if local.Port() != bound.Port() {
		return false
	}
	a := local.Addr().Unmap().WithZone("")
	return a.IsUnspecified() || a == bound.Addr().Unmap().WithZone("")
}

// UDP returns the UDP sockets of process pid (0 for this process) bound to local, in
// descriptor order, one per socket. Port 0 is an error, and so is finding none: the
// error matches ErrNoSocket and says whether the process has TCP sockets there, or
// UDP sockets on the port bound to other addresses.
func UDP(pid int, local netip.AddrPort) ([]Socket, error) {
	if local.Port() == 0 {
		return nil, fmt.Errorf("local address %s: port 0 names no socket", local)
	}
	if !local.Addr().IsValid() {
		return nil, fmt.Errorf("invalid local address")
	}
	proc := "/proc/self"
	who := "this process"
	if pid != 0 {
		proc = "/proc/" + strconv.Itoa(pid)
		who = "process " + strconv.Itoa(pid)
	}
	fds, err := socketInodes(proc)
	if err != nil {
		return nil, err
	}
	var out []Socket
	var others []netip.AddrPort
	for _, table := range []string{"udp", "udp6"} {
		entries, err := readTable(proc + "/net/" + table)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			fd, ok := fds[e.inode]
			if !ok {
				continue
			}
			if !Matches(local, e.local) {
				if e.local.Port() == local.Port() {
					others = append(others, e.local)
				}
				continue
			}
			out = append(out, Socket{FD: fd, Inode: e.inode, Local: e.local, IPv6: table == "udp6"})
		}
	}
	if len(out) > 0 {
		slices.SortFunc(out, func(a, b Socket) int { return a.FD - b.FD })
		return out, nil
	}
	msg := fmt.Sprintf("%s has no UDP socket bound to %s", who, local)
	var tcp bool
	for _, table := range []string{"tcp", "tcp6"} {
		entries, _ := readTable(proc + "/net/" + table)
		for _, e := range entries {
			if _, ok := fds[e.inode]; ok && Matches(local, e.local) {
				tcp = true
			}
		}
	}
	if tcp {
		msg += " (only TCP sockets, which a UDP filter cannot protect)"
	}
	if len(others) > 0 {
		var s []string
		for _, o := range others {
			s = append(s, o.String())
		}
		msg += "; UDP sockets on that port are bound to " + strings.Join(s, ", ")
	}
	return nil, fmt.Errorf("%s: %w", msg, ErrNoSocket)
}

// socketInodes maps the inode of every socket open in proc (a /proc/PID directory) to
// its lowest descriptor.
func socketInodes(proc string) (map[uint64]int, error) {
	dir := proc + "/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, procError(dir, err)
	}
	out := map[uint64]int{}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		link, err := os.Readlink(dir + "/" + e.Name())
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // closed since ReadDir
			}
			return nil, procError(dir, err)
		}
		s, ok := strings.CutPrefix(link, "socket:[")
		if !ok {
			continue
		}
		ino, err := strconv.ParseUint(strings.TrimSuffix(s, "]"), 10, 64)
		if err != nil {
			continue
		}
		if prev, ok := out[ino]; !ok || fd < prev {
			out[ino] = fd
		}
	}
	return out, nil
}

// procError explains the usual failures of reading another process's /proc entries.
func procError(path string, err error) error {
	switch {
	case errors.Is(err, os.ErrNotExist) && strings.HasPrefix(path, "/proc/self/"):
		return fmt.Errorf("%s: not found (is /proc mounted?): %w", path, err)
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("%s: no such process: %w", path, err)
	case errors.Is(err, os.ErrPermission):
		return fmt.Errorf("%s: reading a process's descriptors needs root or CAP_SYS_PTRACE over it: %w", path, err)
	}
	return err
}

// entry is one line of a /proc/net/{udp,udp6,tcp,tcp6} table.
type entry struct {
	local netip.AddrPort
	inode uint64
}

func readTable(path string) ([]entry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, procError(path, err)
	}
	defer f.Close()
	return parseTable(f)
}

// parseTable reads a /proc/net/{udp,udp6,tcp,tcp6} table: after a header line, one
// socket a line, "sl local_address rem_address st ... uid timeout inode ...", where an
// address is hex words in host byte order, a colon and the port in hex.
func parseTable(r io.Reader) ([]entry, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	var out []entry
	first := true
	for sc.Scan() {
		if first {
			first = false
			continue
		}
		f := strings.Fields(sc.Text())
		if len(f) < 10 {
			continue
		}
		local, err := parseAddr(f[1])
		if err != nil {
			return nil, fmt.Errorf("%q: %w", f[1], err)
		}
		ino, err := strconv.ParseUint(f[9], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("inode %q: %w", f[9], err)
		}
		out = append(out, entry{local: local, inode: ino})
	}
	return out, sc.Err()
}

// parseAddr parses "0100007F:0035" or a 32-digit IPv6 form of it.
func parseAddr(s string) (netip.AddrPort, error) {
	h, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, errors.New("no port")
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, err
	}
	b, err := hex.DecodeString(h)
	if err != nil || (len(b) != 4 && len(b) != 16) {
		return netip.AddrPort{}, errors.New("bad address")
	}
	// The kernel prints each 32-bit word of the address as a number in host order.
	var raw [16]byte
	for i := 0; i < len(b); i += 4 {
		binary.NativeEndian.PutUint32(raw[i:], binary.BigEndian.Uint32(b[i:]))
	}
	var a netip.Addr
	if len(b) == 4 {
		a = netip.AddrFrom4([4]byte(raw[:4]))
	} else {
		a = netip.AddrFrom16(raw).Unmap()
	}
	return netip.AddrPortFrom(a, uint16(port)), nil
}

// Descriptor returns a descriptor of this process for the socket with the given
// inode, borrowed as Borrow does, or an error matching ErrNoSocket when the process
// has none left (the socket is closed, or lives on only in other processes). Any
// other error means /proc/self/fd could not be read, and says nothing either way.
func Descriptor(inode uint64) (*Conn, error) {
	fds, err := socketInodes("/proc/self")
	if err != nil {
		return nil, err
	}
	fd, ok := fds[inode]
	if !ok {
		return nil, fmt.Errorf("this process has no descriptor of socket inode %d: %w", inode, ErrNoSocket)
	}
	return &Conn{fd: fd, inode: inode}, nil
}

// Conn is a UDP socket descriptor of this process as a syscall.Conn, for the rrl
// package's attach calls. It checks on every use that the descriptor still refers to
// the socket it was made for, and fails with unix.EBADF otherwise: after the socket
// was closed, and when its number was reused for another file, a later detach finds
// nothing instead of touching an unrelated socket.
type Conn struct {
	fd    int
	inode uint64
	owned bool // Close closes fd (a copy taken from another process)
}

// Borrow wraps s, a socket of this process, without taking it over: Close leaves the
// descriptor open.
func Borrow(s Socket) *Conn { return &Conn{fd: s.FD, inode: s.Inode} }

// SyscallConn returns c itself.
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c, nil }

// Control runs fn on the descriptor if it still refers to the socket. A borrowed
// descriptor belongs to code that may close it at any moment, and its number may
// then go to another socket between the check and fn: fn gets a copy of it
// (F_DUPFD_CLOEXEC), which keeps the checked socket under that number while fn runs
// and is closed right after. A copy taken from another process is c's own, and used
// as it is.
func (c *Conn) Control(fn func(fd uintptr)) error {
	if c.fd < 0 {
		return unix.EBADF
	}
	fd := c.fd
	if !c.owned {
		d, err := unix.FcntlInt(uintptr(c.fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(d)
		fd = d
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Ino != c.inode || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return unix.EBADF
	}
	fn(uintptr(fd))
	return nil
}

// Read is not supported: Conn is for socket options only.
func (c *Conn) Read(func(fd uintptr) bool) error { return errors.ErrUnsupported }

// Write is not supported: Conn is for socket options only.
func (c *Conn) Write(func(fd uintptr) bool) error { return errors.ErrUnsupported }

// Close closes a copied descriptor (the socket lives on in its process) and makes c
// unusable; a borrowed descriptor stays open.
func (c *Conn) Close() error {
	if c.fd < 0 {
		return nil
	}
	fd := c.fd
	c.fd = -1
	if c.owned {
		return unix.Close(fd)
	}
	return nil
}

var _ syscall.Conn = (*Conn)(nil)

// Filter kinds reported by AttachedFilter.
const (
	NoFilter      = "none"
	EBPFFilter    = "eBPF"
	ClassicFilter = "classic"
)

// AttachedFilter reports which socket filter conn has: NoFilter, EBPFFilter or
// ClassicFilter. It asks with SO_GET_FILTER and no buffer, which the kernel answers
// with the classic program's length, 0 for no filter, and EACCES for an eBPF program
// (which it cannot dump).
func AttachedFilter(conn syscall.Conn) (string, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return "", err
	}
	var n uint32
	var errno syscall.Errno
	cerr := raw.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_GET_FILTER,
			0, uintptr(unsafe.Pointer(&n)), 0)
	})
	switch {
	case cerr != nil:
		return "", cerr
	case errno == unix.EACCES:
		return EBPFFilter, nil
	case errno != 0:
		return "", errno
	case n == 0:
		return NoFilter, nil
	}
	return ClassicFilter, nil
}
