package rrl

import (
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// The kernel filter's types and errors, on every platform. The filter itself needs
// Linux (filter_other.go stands in for it elsewhere); the response rate limiter, the
// Go request limiter and the DNS handler work anywhere.

// Errors a caller of Attach can branch on with errors.Is. An error returned for a
// refused system call matches both the sentinel and the errno the kernel returned:
// errors.Is(err, ErrNotPermitted) and errors.Is(err, syscall.EPERM) both hold for a
// refused program load.
var (
	// ErrNotPermitted: the kernel refused an operation for lack of privilege (EPERM or
	// EACCES), typically loading the eBPF program or creating its maps; the message
	// says how to grant the privilege. Also returned when the socket's filter is locked
	// (SO_LOCK_FILTER).
	ErrNotPermitted = errors.New("operation not permitted")

	// ErrNotSupported: the kernel lacks a feature the filter needs (too old, or built
	// without it).
	ErrNotSupported = errors.New("not supported by the kernel")

	// ErrOptMem: the kernel refused to attach a filter to a socket because the
	// socket's option memory, bounded by the sysctl net.core.optmem_max, is too small
	// (ENOMEM from SO_ATTACH_FILTER or SO_ATTACH_BPF).
	ErrOptMem = errors.New("socket option memory exhausted")

	// ErrLoadFailed: the kernel could not load or attach the eBPF program for a reason
	// other than privilege, option memory or a missing kernel feature (a verifier
	// rejection, a map that could not be created); the message has the kernel's words.
	ErrLoadFailed = errors.New("eBPF filter failed to load")

	// ErrClosed: the Filter has been closed.
	ErrClosed = errors.New("filter closed")

	// ErrLayoutMismatch: the pinned objects were made by a version of this package
	// whose map layout differs from this one's; unload and load them again.
	ErrLayoutMismatch = errors.New("pinned filter layout differs from this library's")
	// ErrNotMounted: the pin directory is not on a BPF filesystem (bpffs).
	ErrNotMounted = errors.New("not on a BPF filesystem (mount -t bpf bpf /sys/fs/bpf)")
)

// FilterMode says which layer of protection a Filter installed on its sockets.
type FilterMode int

const (
	// ModeNone: nothing is attached (a closed Filter).
	ModeNone FilterMode = iota
	// ModeClassic: only the stateless classic-BPF prefilter is attached (eBPF could not
	// be loaded). Combine it with a Limiter in Go: call Limiter.Allow after reading each
	// packet and discard the packets it refuses.
	ModeClassic
	// ModeEBPF: the eBPF filter with the request limiter is attached.
	ModeEBPF
)

func (m FilterMode) String() string {
	switch m {
	case ModeNone:
		return "none"
	case ModeClassic:
		return "classic"
	case ModeEBPF:
		return "ebpf"
	}
	return fmt.Sprintf("FilterMode(%d)", int(m))
}

// FilterStats are a request limiter's counters since it was made: the kernel
// filter's (Filter.Stats, summed over CPUs) or the Go Limiter's (Limiter.Stats, Mode
// ModeNone, without the checks only the kernel makes). Every packet counts in Seen
// and then in Passed or in one reason counter (NotDNS, DroppedShort,
// DroppedResponse, DroppedReflection, or a node's Limited). In report-only mode a packet counted
// under a reason is also counted in ReportOnly and Passed, since nothing is withheld.
type FilterStats struct {
	Mode              FilterMode
	Seen              uint64 // packets judged
	Passed            uint64 // packets delivered to the socket
	NotDNS            uint64 // dropped: headers the filter cannot follow to UDP (docs/kernel-filter.md)
	DroppedShort      uint64 // shorter than a DNS header and a minimal question
	DroppedResponse   uint64 // QR bit set: responses reflected at the server
	DroppedReflection uint64 // from a reflection-ports source port
	Exempt            uint64 // from exempt-clients: passed, not counted in the sketches
	ReportOnly        uint64 // limited, but passed because of report-only
	Errors            uint64 // internal failures (passed)
	CookiePassed      uint64 // passed on a valid server cookie, judged only in their address's level (Filter.UseCookies)
	CookieInvalid     uint64 // carried a server cookie that did not verify: judged as without one
	Slipped           uint64 // limited, and answered at the driver with a truncated response (XDP mode, AttachXDP)
	// CookieSecrets is how many server cookie secrets the eBPF filter verifies
	// cookies with: 0 (it looks at no cookie), 1, or 2 (a previous one accepted
	// too). Never the secrets themselves. For a pinned filter it is what the
	// writers of this library recorded with the pins (rrl_cookie_secrets itself is
	// write-only).
	CookieSecrets int
	Nodes         []NodeStats
	// Capacity reports the capacity mode (Config keyword capacity), nil when it is
	// off. With it on, a level's Limit is the water level times its factor during
	// an overload and its static limit otherwise (2^32 for none).
	Capacity *CapacityStats
	// Names reports the names judge (Config keyword names, docs/names.md), nil when
	// it is off.
	Names *NameStats
}

// NameStats are the names judge's counters: under overload, queries for names the
// server has not answered as existing are limited by zone before the source limits.
type NameStats struct {
	// Known counts the queries for names the server has answered as existing,
	// Unknown those for any other name (random names, names under a wildcard,
	// names not yet learnt); queries whose name could not be read are in neither.
	Known   uint64 `json:"known"`
	Unknown uint64 `json:"unknown"`
	// Limited counts the unknown ones refused by zone (or that would have been,
	// in report-only mode), UnknownPassed those finally passed.
	Limited       uint64 `json:"limited"`
	UnknownPassed uint64 `json:"unknown_passed"`
	// Level is the limit in force per zone on queries for unknown names, queries
	// per second; 0 when none (no overload).
	Level float64 `json:"level"`
}

// Dropped is the number of packets the filter withheld, for every reason.
func (s FilterStats) Dropped() uint64 {
	// The kernel's per-CPU counters are copied while packets are being counted, so
	// a packet's Passed may be read without its Seen.
	if s.Passed > s.Seen {
		return 0
	}
	return s.Seen - s.Passed
}

// limited is the number of packets the request limiter's levels refused, or
// would have in report-only mode.
func (s FilterStats) limited() uint64 {
	var n uint64
	for _, node := range s.Nodes {
		n += node.Limited
	}
	return n
}

// CapacityStats report the capacity mode (Config keyword capacity) of a Filter or
// Limiter: whether the server is overloaded, its capacity and the water level.
type CapacityStats struct {
	// Auto: the capacity is measured (capacity auto); else it is configured.
	Auto bool `json:"auto"`
	// Capacity is the capacity in queries per second: measured, the rate the
	// server reads while its receive queues overflow (0 until first measured), or
	// the configured one.
	Capacity float64 `json:"capacity"`
	// Overloaded: the limits are at the water level now.
	Overloaded bool `json:"overloaded"`
	// Since is when the current overload started (zero when not overloaded).
	Since time.Time `json:"since,omitzero"`
	// Level is the water level in force: the limit per group of a level of factor
	// 1 (the client network's), each level's limit being its factor times Level
	// (within requests-per-second). 0 when the limits are lifted.
	Level float64 `json:"level"`
	// Demand is the rate of queries arriving (refused ones included), averaged over
	// a quarter of a second; Target the rate of judged queries the limits aim at.
	Demand float64 `json:"demand"`
	Target float64 `json:"target"`
	// Overloads counts the overloads since the controller started.
	Overloads uint64 `json:"overloads"`
	// Problem says why the capacity cannot be measured or the limits not set (no
	// socket, counters that cannot be read); "" when all is well. The static
	// limits stay in force meanwhile.
	Problem string `json:"problem,omitempty"`
}

// SketchCell is one cell of a request-limiter sketch and its current rate estimate.
type SketchCell struct {
	Node   LimiterNode `json:"node"`   // the level, as in NodeStats ("ipv4/24", "port", ...)
	Row    int         `json:"row"`    // sketch row (every group counts once in each row)
	Column int         `json:"column"` // column within the row
	Rate   float64     `json:"rate"`   // packets per second of all groups hashing here, decayed to now
	Limit  float64     `json:"limit"`  // the level's limit per group
}

// GroupRate is a source group of the request limiter with the kernel filter's rate
// estimate for it: one of the groups a source belongs to (Filter.GroupRates), or one
// the limiter has been refusing packets of (Filter.LimitedGroups), which alone has
// Dropped, First and Last.
type GroupRate struct {
	Node    LimiterNode  `json:"node"`             // the level; for LimitedGroups the one that refused them, the first over its limit, finest first
	Group   netip.Prefix `json:"group"`            // the source masked to the level (0.0.0.0/0 for port and total)
	Port    uint16       `json:"port,omitempty"`   // the source port, for the port level
	Rate    float64      `json:"rate"`             // packets per second now: the smaller of the group's cells, an upper bound
	Limit   float64      `json:"limit"`            // the level's limit per group
	Dropped uint64       `json:"dropped,omitzero"` // packets refused since First, estimated from a sample (report-only: would have been)
	First   time.Time    `json:"first,omitzero"`   // first recorded refusal since the group was last out of the record
	Last    time.Time    `json:"last,omitzero"`    // latest recorded refusal
}
