package rrl

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/net/bpf"
)

// The classic-BPF prefilter: a stateless socket filter that drops, in the kernel,
// datagrams that can never be a DNS query to this server. It is attached with
// SO_ATTACH_FILTER, which any process may do on its own socket, so it protects a
// server that may not load eBPF; the eBPF filter starts with the same checks.
//
// What the filter sees. On a UDP socket the kernel runs the filter after the UDP
// layer has found the socket, with the packet data starting at the UDP header, for
// IPv4 and IPv6 alike (a dual-stack AF_INET6 socket's IPv4 packets included):
// offset 0 is the source port, 2 the destination port, 4 the UDP length, 8 the DNS
// header; the packet length extension is the UDP header plus payload. The IP header
// lies before the data and is reachable only relative to SKF_NET_OFF; this filter
// does not need it. Tests on real sockets check all of this.
//
// What it drops, and why no query is among it:
//
//   - Datagrams whose DNS payload is shorter than 17 bytes: a query carries a 12-byte
//     header and at least one question, whose shortest form is the root name (1 byte),
//     a type and a class (2 bytes each). Any message with a question or a resource
//     record is at least 17 bytes (an OPT record alone makes 23), so the only
//     messages this drops are truncated ones and bare 12-byte headers, which a server
//     answers with FORMERR at best.
//   - Datagrams with the QR bit set: they are responses, and a server's listening
//     socket sends responses and never asks questions. Responses arriving there are
//     reflected at us (a spoofed query to a resolver naming our address). Do not
//     attach the filter to a socket the program also uses as a DNS client, for
//     instance to send NOTIFY or forward queries, since their answers carry QR.
//   - Datagrams from a source port on the reflection-ports list (by default:
//     0, chargen, NTP, SNMP, CLDAP, SSDP, memcached). A resolver or stub sends queries
//     from an ephemeral port or from 53; the services on the list answer from their
//     well-known port, so traffic from there is the reflected output of an
//     amplification attack aimed at us. Port 53 is never on the default list: a
//     resolver may query from it, and reflected DNS responses already carry QR.
//
// Everything else passes whole. In particular the filter never drops a datagram of
// 17 or more DNS bytes with QR clear from a port not on the list: the minimal query
// without EDNS from an ephemeral port or from port 53 passes over IPv4, IPv6 and a
// dual-stack socket, whatever IP options or extension headers came before the UDP
// header (the IP header is never read). The checks read three fields at fixed
// offsets after a length check, so there is nothing to parse and no state: the
// verdict depends on those bytes alone. They apply to exempt clients too, since
// exemption is from rate limits and these packets are not queries.
//
// Combining with the Go Limiter. The prefilter does no rate limiting. A server that
// cannot load the eBPF filter (Attach then returns an ErrNotPermitted error and
// reports the classic mode) limits requests in Go: it calls Limiter.Allow(src) for
// every packet it reads and discards the packet when Allow refuses. The two compose
// without double counting: the prefilter removes what is not a query before the
// server pays for reading it, so the Limiter counts only plausible queries, the same
// ones the eBPF filter would count. A socket has one filter: attaching the eBPF
// program replaces the classic one, which it makes redundant by running the same
// checks first; with it attached the Go Limiter is not needed for requests.

// Layout of a datagram as a UDP socket filter sees it: an 8-byte UDP header, then DNS.
const (
	// classicMinLen is the shortest datagram passed: the UDP header, the 12-byte DNS
	// header and the shortest question (root name, type, class: 5 bytes).
	classicMinLen   = 8 + 12 + 5
	classicOffSport = 0     // UDP source port
	classicOffFlags = 8 + 2 // first DNS flags byte: QR, opcode, AA, TC, RD
	classicFlagQR   = 0x80

	// skfNetOff is SKF_NET_OFF: a classic-BPF load at skfNetOff+n reads byte n of
	// the network (IP) header, wherever the packet data starts.
	skfNetOff = -0x100000

	// classicPass is the verdict that keeps the whole datagram.
	classicPass = 0xFFFFFFFF

	// maxClassicInsns is the kernel's limit on a classic program (BPF_MAXINSNS).
	maxClassicInsns = 4096

	// classicLeafSize is the longest run of ports compared one by one; longer lists are
	// split by a binary search on the port.
	classicLeafSize = 8
)

// classicProgram assembles the prefilter for cfg's reflection ports (the defaults
// when cfg is nil). It fails when the list is longer than maxReflectionPorts.
func classicProgram(cfg *Config) ([]bpf.RawInstruction, error) {
	insns, err := classicInstructions(cfg)
	if err != nil {
		return nil, err
	}
	raw, err := bpf.Assemble(insns)
	if err != nil {
		return nil, fmt.Errorf("assemble classic filter: %w", err)
	}
	return raw, nil
}

func classicInstructions(cfg *Config) ([]bpf.Instruction, error) {
	ports := defaultReflectionPorts[:]
	if cfg != nil {
		ports = cfg.reflectionPorts
	}
	// The Config keeps the list sorted and unique, but a Config is a plain struct in
	// this package: do not rely on it.
	ports = slices.Compact(slices.Sorted(slices.Values(ports)))
	if len(ports) > maxReflectionPorts {
		return nil, &ConfigError{Keyword: "reflection-ports", Value: formatPorts(ports),
			Reason: fmt.Sprintf("%d ports, at most %d are allowed", len(ports), maxReflectionPorts)}
	}

	a := newClassicAsm()
	a.emit(bpf.LoadExtension{Num: bpf.ExtLen}, classicNoJump, classicNoJump)
	a.emit(bpf.JumpIf{Cond: bpf.JumpLessThan, Val: classicMinLen}, classicLabelDrop, classicNext)
	a.emit(bpf.LoadAbsolute{Off: classicOffFlags, Size: 1}, classicNoJump, classicNoJump)
	a.emit(bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: classicFlagQR}, classicLabelDrop, classicNext)
	if len(ports) > 0 {
		a.emit(bpf.LoadAbsolute{Off: classicOffSport, Size: 2}, classicNoJump, classicNoJump)
		a.portSearch(ports)
	}
	a.label(classicLabelPass)
	a.emit(bpf.RetConstant{Val: classicPass}, classicNoJump, classicNoJump)
	a.label(classicLabelDrop)
	a.emit(bpf.RetConstant{Val: 0}, classicNoJump, classicNoJump)
	return a.resolve()
}

// portSearch emits code that jumps to classicLabelDrop when the port in A is in ports
// (sorted, unique, not empty) and to classicLabelPass otherwise.
func (a *classicAsm) portSearch(ports []uint16) {
	if len(ports) <= classicLeafSize {
		for i, p := range ports {
			miss := classicNext
			if i == len(ports)-1 {
				miss = classicLabelPass
			}
			a.emit(bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(p)}, classicLabelDrop, miss)
		}
		return
	}
	mid := len(ports) / 2
	upper := a.newLabel()
	a.emit(bpf.JumpIf{Cond: bpf.JumpGreaterThan, Val: uint32(ports[mid-1])}, upper, classicNext)
	a.portSearch(ports[:mid])
	a.label(upper)
	a.portSearch(ports[mid:])
}

// classicAsm is a small assembler for conditional jumps to labels, resolved into classic
// BPF's forward skip counts once every label is placed.
type classicAsm struct {
	insns  []bpf.Instruction
	jumps  [][2]int // per instruction: true and false targets (labels)
	labels []int    // label -> instruction index, -1 until placed
}

const (
	classicNoJump    = -1
	classicNext      = -2
	classicLabelPass = 0
	classicLabelDrop = 1
)

func newClassicAsm() *classicAsm {
	return &classicAsm{labels: []int{classicLabelPass: -1, classicLabelDrop: -1}}
}

func (a *classicAsm) newLabel() int {
	a.labels = append(a.labels, -1)
	return len(a.labels) - 1
}

func (a *classicAsm) label(l int) { a.labels[l] = len(a.insns) }

func (a *classicAsm) emit(ins bpf.Instruction, ifTrue, ifFalse int) {
	a.insns = append(a.insns, ins)
	a.jumps = append(a.jumps, [2]int{ifTrue, ifFalse})
}

// resolve turns label targets into skip counts.
func (a *classicAsm) resolve() ([]bpf.Instruction, error) {
	skip := func(from, target int) (uint8, error) {
		to := from + 1
		if target != classicNext {
			if target >= len(a.labels) || a.labels[target] < 0 {
				return 0, fmt.Errorf("classic filter: label %d not placed", target)
			}
			to = a.labels[target]
		}
		d := to - (from + 1)
		if d < 0 || d > 255 {
			return 0, fmt.Errorf("classic filter: jump from %d to %d out of range", from, to)
		}
		return uint8(d), nil
	}
	out := slices.Clone(a.insns)
	for i, ins := range out {
		j, ok := ins.(bpf.JumpIf)
		if !ok {
			continue
		}
		var err error
		if j.SkipTrue, err = skip(i, a.jumps[i][0]); err != nil {
			return nil, err
		}
		if j.SkipFalse, err = skip(i, a.jumps[i][1]); err != nil {
			return nil, err
		}
		out[i] = j
	}
	return out, nil
}

func formatPorts(ports []uint16) string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = strconv.Itoa(int(p))
	}
	return strings.Join(s, ",")
}
