package rrl

import (
	"fmt"
	"strconv"
	"strings"
)

// LimiterNode names a node of the request limiter: a source prefix level of one
// family, the source-port node or the total. Its String is "ipv4/24", "ipv6/56",
// "port", "total" or "none".
type LimiterNode uint16

// The nodes that do not depend on a prefix length. Prefix-level nodes are named by
// family and length (see LimiterNode.String).
const (
	// NodeNone is no node: the packet was not limited.
	NodeNone LimiterNode = 0
	// NodePort is the group of all sources sharing one source port.
	NodePort LimiterNode = 3 << 8
	// NodeTotal is all sources together (total-requests-per-second).
	NodeTotal LimiterNode = 4 << 8
	// NodeNames is the names judge: queries for names the server has not answered
	// as existing, limited by zone under overload (docs/names.md).
	NodeNames LimiterNode = 5 << 8
)

const (
	nodeTagIPv4 LimiterNode = 1 << 8
	nodeTagIPv6 LimiterNode = 2 << 8
)

func (n LimiterNode) String() string {
	switch n &^ 0xff {
	case nodeTagIPv4:
		return fmt.Sprintf("ipv4/%d", n&0xff)
	case nodeTagIPv6:
		return fmt.Sprintf("ipv6/%d", n&0xff)
	}
	switch n {
	case NodeNone:
		return "none"
	case NodePort:
		return "port"
	case NodeTotal:
		return "total"
	case NodeNames:
		return "names"
	}
	return fmt.Sprintf("LimiterNode(%d)", uint16(n))
}

// MarshalText returns n.String(), so that JSON and text encodings name nodes as
// "ipv4/24".
func (n LimiterNode) MarshalText() ([]byte, error) {
	return []byte(n.String()), nil
}

// UnmarshalText parses a node's String form.
func (n *LimiterNode) UnmarshalText(b []byte) error {
	s := string(b)
	for _, fam := range []struct {
		prefix string
		tag    LimiterNode
		max    int
	}{{"ipv4/", nodeTagIPv4, 32}, {"ipv6/", nodeTagIPv6, 128}} {
		if rest, ok := strings.CutPrefix(s, fam.prefix); ok {
			plen, err := strconv.Atoi(rest)
			if err != nil || plen < 0 || plen > fam.max || strconv.Itoa(plen) != rest {
				return fmt.Errorf("rrl: limiter node %q: bad prefix length", s)
			}
			*n = fam.tag | LimiterNode(plen)
			return nil
		}
	}
	for _, c := range []LimiterNode{NodeNone, NodePort, NodeTotal, NodeNames} {
		if s == c.String() {
			*n = c
			return nil
		}
	}
	return fmt.Errorf("rrl: limiter node %q: not ipv4/N, ipv6/N, port, total, names or none", s)
}

// NodeStats are the settings and counters of one source group level of the request
// limiter, in the kernel filter (Filter.Stats) or in Go (Limiter.Stats). A level keeps
// its counter when an Update takes it out of force (with Limit 0) and when it comes
// back, so Limited never goes down.
type NodeStats struct {
	Node    LimiterNode // the level: ipv4/24, ipv6/56, port (one source port), total
	Limit   float64     // packets per second per group; 0 for a level no longer in force
	Packets uint64      // packets counted at the level (Limiter.Stats only; 0 from the kernel)
	Limited uint64      // packets this level refused (dropped unless report-only)
}
