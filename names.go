package rrl

import "github.com/miekg/dns"

// Query names as the kernel filter will read them (the name hierarchy;
// docs/names.md). This file is the specification the C side must follow bit for bit:
// the walk over the question's labels, what it refuses, and the hashes of the name
// and its suffixes. Nothing here is wired into the kernel program or the Limiter yet.
//
// The walk. The question starts right after the 12-byte header, whose QDCOUNT must
// be 1 (the kernel program already walks this name to find the OPT record after it,
// find_cookie in filter_bpf.c). Each label is a length byte l and l bytes; l == 0 is
// the root and ends the name. A length byte with either of its top two bits set is a
// compression pointer (11) or an extended or reserved label type (01, 10): a query's
// only name has nothing to point back to, so both are refused, as find_cookie does.
// The name's wire length, root byte included, is at most 255 (RFC 1035 section
// 3.1), so it has at most 127 labels; a longer name is refused. QTYPE and QCLASS
// must follow the name. The walk reads nothing beyond the message.
//
// The hashes, keyed by a per-process seed so that a sender cannot aim collisions:
//
//	label(l, b)   h = seed ^ l; for each 8 bytes w of b, little endian, the last word
//	              padded with zero bytes: h = (h ^ lower8(w)) * nameMul; h ^= h >> 31
//	suffix(root)  = mix64(seed)
//	suffix(i)     = mix64(suffix(i+1) ^ label(i))  for the name without its first i labels
//
// lower8 folds ASCII capitals only (DNS compares names so, RFC 4343); every other
// byte, a dot or a zero inside a label included, is hashed as it is. Hashing each
// label on its own and chaining from the root gives every suffix its key in one
// pass over the labels and one over the label hashes, so the name (suffix 0), its
// parent (suffix 1) and any ancestor such as the zone's apex (suffix labels-d for an
// apex of d labels) are comparable 64-bit keys, found without strings or
// allocation. The kernel keeps the label hashes in a per-CPU scratch array (at
// most 127) and chains them backwards in a second bounded loop.

const (
	// nameMaxWire is the longest name on the wire, its root byte included.
	nameMaxWire = 255
	// nameMaxLabels is the most labels a name can have: one length byte and at
	// least one byte each, then the root byte.
	nameMaxLabels = (nameMaxWire - 1) / 2
	// dnsHeaderLen is the DNS header's length.
	dnsHeaderLen = 12
)

// nameSeed is the seed of the names' keys for a filter or Limiter keyed by seed
// (docs/names.md, "Keys"): the settings carry it as name_seed, so that the kernel
// program does not compute it per packet.
func nameSeed(seed uint64) uint64 { return mix64(seed ^ 0x6e616d6573) }

// nameKey is the hash of a lower-cased name (see suffix above).
type nameKey uint64

// nameErr says why readQName refused a query's name; nameOK when it did not.
type nameErr uint8

const (
	nameOK        nameErr = iota
	nameShort             // the message ends inside the header, the name, QTYPE or QCLASS
	nameQuestions         // QDCOUNT is not 1
	namePointer           // a compression pointer
	nameLabelType         // an extended or reserved label type (01 or 10)
	nameTooLong           // longer than 255 bytes on the wire
)

var nameErrText = [...]string{"ok", "message too short", "not one question", "compression pointer", "extended label type", "name too long"}

func (e nameErr) String() string {
	if int(e) < len(nameErrText) {
		return nameErrText[e]
	}
	return "nameErr(?)"
}

// qname is what readQName keeps of a query name: its label count and the key of
// every suffix. It is large (1 KiB), as the kernel's per-CPU scratch will be: the
// caller keeps one and passes it by pointer.
type qname struct {
	labels int // labels of the name, the root not counted; 0 for the root itself
	// suffix[i] is the key of the name without its first i labels, for i in
	// [0, labels]: suffix[0] the name, suffix[labels] the root.
	suffix [nameMaxLabels + 1]nameKey
}

// name returns the key of the whole name.
func (q *qname) name() nameKey { return q.suffix[0] }

// parent returns the key of the name one label up; the root is its own parent.
func (q *qname) parent() nameKey { return q.suffix[min(1, q.labels)] }

// ancestor returns the key of the name's suffix of depth labels (0: the root), and
// false when the name has fewer labels.
func (q *qname) ancestor(depth int) (nameKey, bool) {
	if depth < 0 || depth > q.labels {
		return 0, false
	}
	return q.suffix[q.labels-depth], true
}

// readQName reads the question name of the DNS message msg (starting at its header)
// into q, keyed by seed. It returns the offset just past the question's QCLASS, or
// why it refused the name (q is then left undefined).
func readQName(msg []byte, seed uint64, q *qname) (int, nameErr) {
	if len(msg) < dnsHeaderLen {
		return 0, nameShort
	}
	if msg[4] != 0 || msg[5] != 1 {
		return 0, nameQuestions
	}
	end, err := walkName(msg, dnsHeaderLen, seed, q)
	if err != nameOK {
		return 0, err
	}
	if end+4 > len(msg) {
		return 0, nameShort
	}
	return end + 4, nameOK
}

// walkName reads the uncompressed name at b[off:] into q and returns the offset
// just past its root byte.
func walkName(b []byte, off int, seed uint64, q *qname) (int, nameErr) {
	i, n := off, 0
	for {
		if i >= len(b) {
			return 0, nameShort
		}
		l := int(b[i])
		if l == 0 {
			break
		}
		switch l >> 6 {
		case 3:
			return 0, namePointer
		case 1, 2:
			return 0, nameLabelType
		}
		// With the root byte still to come, the name's length is at least
		// i+1+l+1-off.
		if i+l+2-off > nameMaxWire {
			return 0, nameTooLong
		}
		if i+1+l > len(b) {
			return 0, nameShort
		}
		q.suffix[n] = nameKey(labelHash(seed, b[i+1:i+1+l]))
		n++
		i += 1 + l
	}
	q.labels = n
	s := nameKey(mix64(seed))
	q.suffix[n] = s
	for j := n - 1; j >= 0; j-- {
		s = nameKey(mix64(uint64(s) ^ uint64(q.suffix[j])))
		q.suffix[j] = s
	}
	return i + 1, nameOK
}

// labelHash hashes one label's bytes (1 to 63 of them), ASCII folded to lower case,
// eight at a time.
func labelHash(seed uint64, b []byte) uint64 {
	h := seed ^ uint64(len(b))
	for ; len(b) >= 8; b = b[8:] {
		w := uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
			uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
		h = (h ^ lower8(w)) * nameMul
		h ^= h >> 31
	}
	if len(b) > 0 {
		var w uint64
		for i := range len(b) {
			w |= uint64(b[i]) << (8 * i)
		}
		h = (h ^ lower8(w)) * nameMul
		h ^= h >> 31
	}
	return h
}

// qnameOf reads a name in presentation format (as a *dns.Msg holds it, escapes
// included) into q, with the same keys as readQName gives for it on the wire: the
// path for the server's responses, never the per-packet one. A name that does not
// pack (too long, an empty label) is refused.
func qnameOf(name string, seed uint64, q *qname) bool {
	var buf [nameMaxWire + 1]byte
	end, err := dns.PackDomainName(dns.Fqdn(name), buf[:], 0, nil, false)
	if err != nil {
		return false
	}
	got, e := walkName(buf[:end], 0, seed, q)
	return e == nameOK && got == end
}
