package rrl

import (
	"encoding/binary"
	"net/netip"
)

// prefixSet answers whether an address lies in any of a set of prefixes (the
// exempt-clients list) for Debit and the Limiter, which ask once per response or
// packet. It is a trie over the address's 4-bit digits: a lookup reads at most one
// node per digit (8 for IPv4, 32 for IPv6), however many prefixes the set holds, and
// allocates nothing. A prefix whose length is not a multiple of 4 fills every slot
// its last digit can take. The zero prefixSet is empty. It is not changed after it
// is built, so any number of goroutines may read it.
type prefixSet struct {
	v4, v6 nibbleTrie
}

// nibbleTrie is one family's trie. Slot values: 0 no prefix continues this way,
// covered (negative) a prefix ends here and contains everything below, otherwise
// the index of the child node. Node 0 is the root; a child is never node 0.
type nibbleTrie struct {
	nodes [][16]int32
}

const covered = -1

// newPrefixSet returns the set of prefixes. Invalid prefixes are ignored (Contains
// matches nothing for them either).
func newPrefixSet(prefixes []netip.Prefix) prefixSet {
	var s prefixSet
	for _, p := range prefixes {
		if !p.IsValid() {
			continue
		}
		hi, lo := addrWords(p.Addr())
		if p.Addr().Is4() {
			s.v4.insert(hi, lo, p.Bits(), 8)
		} else {
			s.v6.insert(hi, lo, p.Bits(), 32)
		}
	}
	return s
}

// empty reports whether the set holds no prefix.
func (s *prefixSet) empty() bool { return len(s.v4.nodes) == 0 && len(s.v6.nodes) == 0 }

// contains reports whether a prefix of the set contains a, with the rules of
// netip.Prefix.Contains: families do not mix (an IPv4-mapped IPv6 address is IPv6),
// and an address with a zone or the zero Addr is in no prefix.
func (s *prefixSet) contains(a netip.Addr) bool {
	switch {
	case a.Zone() != "":
		return false
	case a.Is4():
		return s.v4.contains(addrWords(a))
	case a.Is6():
		return s.v6.contains(addrWords(a))
	}
	return false
}

// addrWords returns an address's bits left-aligned in two words: an IPv4 address
// takes the top 32 bits of hi.
func addrWords(a netip.Addr) (hi, lo uint64) {
	if a.Is4() {
		b := a.As4()
		return uint64(binary.BigEndian.Uint32(b[:])) << 32, 0
	}
	b := a.As16()
	return binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
}

// digit returns the i-th 4-bit digit of the address in hi, lo.
func digit(hi, lo uint64, i int) int {
	if i < 16 {
		return int(hi>>(60-4*i)) & 15
	}
	return int(lo>>(60-4*(i-16))) & 15
}

// insert adds the prefix of length bits of the address hi, lo with digits digits.
func (t *nibbleTrie) insert(hi, lo uint64, bits, digits int) {
	if len(t.nodes) == 0 {
		t.nodes = append(t.nodes, [16]int32{})
	}
	node := 0
	for i := range digits {
		d := digit(hi, lo, i)
		if rest := bits - 4*i; rest <= 4 {
			// The prefix ends in this digit: it covers every value of the digit that
			// shares its first rest bits.
			span := 1 << (4 - rest)
			for j := d &^ (span - 1); j < d&^(span-1)+span; j++ {
				t.nodes[node][j] = covered
			}
			return
		}
		switch v := t.nodes[node][d]; v {
		case covered:
			return // a shorter prefix already contains this one
		case 0:
			t.nodes = append(t.nodes, [16]int32{})
			t.nodes[node][d] = int32(len(t.nodes) - 1)
		}
		node = int(t.nodes[node][d])
	}
}

// contains reports whether a prefix of the trie contains the address hi, lo.
func (t *nibbleTrie) contains(hi, lo uint64) bool {
	if len(t.nodes) == 0 {
		return false
	}
	node := int32(0)
	for i := 0; ; i++ {
		// Every path ends in a covered slot by the last digit, since the longest
		// prefix ends there; a missing slot ends it earlier.
		switch v := t.nodes[node][digit(hi, lo, i)]; {
		case v == covered:
			return true
		case v == 0:
			return false
		default:
			node = v
		}
	}
}
