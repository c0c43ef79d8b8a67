//go:build ignore

// The rrl socket filter: a per-source request limiter over hierarchical CountMin
// sketches, attached to a DNS server's own UDP socket with SO_ATTACH_BPF.
//
// This program is the C twin of the Go model in countmin.go and hhh.go: the same
// fixed-point format (fixedpoint.go), the same estimator, hash and node layout, and
// the same decision, so that the same packets, clock readings and random draws give
// the same verdicts and the same sketch cells in both. Any change here is a change
// there, and layout_version moves with it.
//
// Headers are always read relative to the network header (BPF_HDR_START_NET): on a
// live UDP socket the packet data starts at the UDP header, under BPF_PROG_TEST_RUN at
// the IP header, and only network-relative offsets are right in both. The IP parser is
// chosen by skb->protocol, not by the socket's family, because a dual-stack AF_INET6
// socket also receives IPv4 packets.
//
// Every packet is judged or dropped. One the parser cannot follow to a UDP header
// (more IPv6 extension headers than it walks, a later fragment, a protocol other
// than UDP, headers cut short) is dropped, counted in COUNTER_DROP_UNFOLLOWED: on a
// UDP socket it is in a form no resolver sends (docs/kernel-filter.md says why), and
// passing it unjudged would let any sender past every limit. An internal failure (a
// map lookup that fails) passes the packet: the filter must never drop legitimate
// traffic through its own fault.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char __license[] SEC("license") = "Dual BSD/GPL";

// The verifier and least privilege. The program loads for a process with CAP_BPF and
// CAP_PERFMON (TestAttachLeastPrivilege), not with CAP_BPF alone: for a process
// without CAP_PERFMON the verifier masks every instruction that adds a register to a
// pointer against Spectre v1, one mask per instruction, and refuses one that sees a
// different constant on different paths (clang makes those out of loops over arrays
// and out of the merged increments of count); and once a pointer moves by an unknown
// value (the reflection-port bitmap, the decay table, the limited counters, the
// cookie scan) it compares states exactly, stops pruning, and runs out of its million
// instructions. Attach therefore asks for CAP_PERFMON too (verifierTrusts in
// filter_objects.go).

#define LAYOUT_VERSION 9

#define MAX_LEVELS 5
#define NODE_IPV4_FIRST 0
#define NODE_IPV6_FIRST MAX_LEVELS
#define NODE_PORT (2 * MAX_LEVELS)
#define NODE_TOTAL (NODE_PORT + 1)
#define NUM_NODES (NODE_TOTAL + 1)
#define MAX_STEPS (MAX_LEVELS + 2)
// Counters of packets limited by a level: one per (family, prefix length), then the
// port and total nodes, so that a level keeps its counter whatever node it uses.
#define NUM_LIMITED (33 + 129 + 2)

#define SKETCH_DEPTH 2
#define SKETCH_WIDTH_SHIFT 11
#define SKETCH_WIDTH (1 << SKETCH_WIDTH_SHIFT)
#define NUM_CELLS (NUM_NODES * SKETCH_DEPTH * SKETCH_WIDTH)

#define HALF_LIFE_NS 200000000ULL
#define DECAY_FRAC_BITS 22
#define DECAY_TABLE_SHIFT 6
#define DECAY_INTERP_BITS (DECAY_FRAC_BITS - DECAY_TABLE_SHIFT)
#define DECAY_SCALE 90071993ULL
#define DECAY_HORIZON (32 * HALF_LIFE_NS)
#define RATE_SCALE 14885222359ULL

// The limited-groups map (rrl_limited) keeps this many groups, least recently
// recorded out first; a drop is recorded with probability 1 / LIMITED_SAMPLE.
#define LIMITED_GROUPS 4096
#define LIMITED_SAMPLE 16

#define FP_ONE (1ULL << 32)
#define FP_HALF (1ULL << 31)
#define FP_MAX (~0ULL)

// A DNS header (12 bytes) plus the smallest question (root name, type, class).
#define MIN_DNS_LEN 17
#define MAX_IPV6_EXT_HEADERS 6

typedef __u64 fp_t;

// One CountMin cell: a decayed packet count (fixed point) and the time of its last
// update in nanoseconds.
struct cell {
	__u64 count;
	__u64 last;
};

// One node of a family's lattice, as the packets of that family judge it. The node's
// key is (source hi & mask_hi, (source lo & mask_lo) | (source port & port_mask)): a
// prefix of the source address for a level node, the source port for the port node
// (masks 0, port_mask 0xffff), nothing for the total node (all masks 0).
struct step {
	__u64 mask_hi;
	__u64 mask_lo;
	__u64 port_mask;
	fp_t trip;                // smallest count whose arrival_rate reaches limit
	fp_t limit;
	__u32 node;
	__u32 limited;            // this level's limited counter: COUNTER_LIMITED0 + limited
};

// Live settings, written by the Go side (settings.go) and read on every packet.
//
// rrl_settings holds three of them: entry 0 is a header whose slot field names the
// slot in force, entries 1 and 2 are the two slots. A packet reads the header and
// then only the slot it names (active_settings), and the exempt tries' entries of
// that slot. Go writes a new configuration into the other slot and its exempt
// entries, then flips the header's slot (one byte: a packet reads it whole, old or
// new); it rewrites a slot only a grace period after it stopped being in force, when
// no packet that read the old slot number can still be running. So every packet is
// judged entirely by one configuration, never by a mix of two.
struct settings {
	__u32 layout_version;
	__u8 report_only;
	__u8 has_exempt4;         // rrl_exempt4 holds prefixes of this slot: look sources up
	__u8 has_exempt6;
	__u8 slot;                // header: the slot in force (0 or 1); a slot: its own number
	__u64 generation;         // header: flips so far (Go's readers check it did not move)
	__u64 flipped_ns;         // header: CLOCK_MONOTONIC of the last flip
	__u64 seed;
	__u64 seed_mix0;          // mix64(seed), the hash's first round for hi == 0
	__u64 tick_ns;            // length of a jiffy (the coarse clock's resolution); 0: unknown
	__u64 reflection_blocks;  // bit b: reflection_ports lists a port in b*1024 .. b*1024+1023
	__u32 steps[2];           // active nodes of IPv6 ([0]) and IPv4 ([1]) sources
	struct step step[2][MAX_STEPS]; // in judging order: levels finest first, port, total
	__u64 reflection_ports[65536 / 64]; // bitmap of source ports to drop
};

enum counter {
	COUNTER_SEEN,
	COUNTER_PASSED,
	COUNTER_DROP_UNFOLLOWED,  // headers the parser cannot follow to UDP (see parse)
	COUNTER_DROP_SHORT,
	COUNTER_DROP_RESPONSE,
	COUNTER_DROP_REFLECTION,
	COUNTER_EXEMPT,
	COUNTER_REPORT_ONLY,      // would have been dropped (any reason), passed in report-only mode
	COUNTER_ERROR,            // internal failure, passed
	COUNTER_LIMITED0,         // limited by a level: COUNTER_LIMITED0 + step.limited
	COUNTER_COOKIE_PASSED = COUNTER_LIMITED0 + NUM_LIMITED, // passed on a valid server cookie
	COUNTER_COOKIE_INVALID,   // a server cookie that does not verify: judged as without one
	COUNTER_MAX,
};

// Per CPU: the packet counters and the state of the live clock (clock_now), placed
// next to the two counters every packet increments, so that it costs no other line.
struct counters {
	__u64 clock_sync;         // jiffies when clock_offset was last taken
	__u64 clock_offset;       // coarse clock minus jiffies * tick_ns at clock_sync
	__u64 value[COUNTER_MAX];
};

// The exempt tries hold the prefixes of both settings slots, told apart by the slot
// byte that precedes the address: an entry's prefixlen is 8 plus its prefix length,
// so a lookup matches only entries of the slot it names.
struct exempt4_key {
	__u32 prefixlen;
	__u8 slot;
	__u8 addr[4];
	__u8 pad[3];
};

struct exempt6_key {
	__u32 prefixlen;
	__u8 slot;
	__u8 addr[16];
	__u8 pad[3];
};

// Memory-mappable, so that the capacity controller (capacity_linux.go) reads every
// cell from user space without a system call per cell; the program's lookups are the
// same.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NUM_CELLS);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct cell);
} rrl_cells SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 3);   // the header, then the two slots
	__type(key, __u32);
	__type(value, struct settings);
} rrl_settings SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct counters);
} rrl_counters SEC(".maps");

// A source group the request limiter refused packets of: the decider's key as the
// lattice loop computes it (the masked address; the source port in lo for the port
// node; zeros for the total node) and its limited counter, which names the level
// whatever node index it uses.
struct limited_key {
	__u64 hi;
	__u64 lo;
	__u32 limited;
	__u32 pad;
};

// What the program knows about a limited group: sampled drops (each one stands for
// LIMITED_SAMPLE), the clock of the first and last recorded drop, and at the last one
// the deciding node's estimate (the smaller cell count, read with cellRate) and limit.
struct limited_value {
	__u64 drops;
	__u64 first;
	__u64 last;
	__u64 count;
	__u64 limit;
};

// The groups limited lately, for operators (Filter.LimitedGroups, rrlctl top): the
// kernel evicts the least recently recorded group when it is full, so a flood of
// spoofed sources can neither grow it nor fail a packet.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LIMITED_GROUPS);
	__type(key, struct limited_key);
	__type(value, struct limited_value);
} rrl_limited SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 2048); // 1024 prefixes for each slot
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct exempt4_key);
	__type(value, __u8);
} rrl_exempt4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 2048); // 1024 prefixes for each slot
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct exempt6_key);
	__type(value, __u8);
} rrl_exempt6 SEC(".maps");

// ---- Server cookies (cookie.go) ----

#define COOKIE_OPTION 10
#define COOKIE_LEN 24             // client cookie (8) and RFC 9018 server cookie (16)
#define COOKIE_VERSION 1
#define COOKIE_MAX_AGE 3600
#define COOKIE_MAX_FUTURE 300
#define OPT_TYPE 41
#define OPT_FIXED_LEN 11          // root name, type, class, TTL, RDLENGTH
// The smallest query that can hold a cookie: header, root question, OPT, option.
#define MIN_COOKIE_QUERY (DNS_HEADER_LEN + 5 + OPT_FIXED_LEN + 4 + COOKIE_LEN)
// How much of a query after its header the cookie lookup reads in one load: room
// for the longest question name (255 bytes), the OPT record and options before the
// cookie. A cookie that ends further in is not looked at.
#define COOKIE_SCAN 512
#define COOKIE_SCAN_MASK (COOKIE_SCAN - 1)
#define MAX_NAME_LEN 255
#define MAX_OPTIONS 32            // options looked at, the cookie included

struct sip_key {
	__u64 k0, k1;             // the CookieSecret's two little-endian halves
};

// The server cookie secrets and the wall clock, written by the Go side
// (kernelcookie.go) into a map of their own: rotating secrets and updating the
// settings never write the same map.
struct cookie_secrets {
	__u32 layout_version;
	__u8 has_current;         // 0: look for no cookie
	__u8 has_previous;
	__u16 pad;
	__s64 wall_offset_ns;     // CLOCK_REALTIME minus the program's clock (clock_now)
	struct sip_key current;
	struct sip_key previous;
};

// Per CPU, the part of a query after its header, read in one load for the cookie
// lookup; indexes are masked to COOKIE_SCAN_MASK, so reads run into the slack.
struct cookie_scratch {
	__u8 b[COOKIE_SCAN + 32];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cookie_secrets);
} rrl_cookie_secrets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cookie_scratch);
} rrl_cookie_scratch SEC(".maps");

// 2^(-i/64) in fixed point, i = 0..64 (decayTable in countmin.go).
static const __u64 decay_table[(1 << DECAY_TABLE_SHIFT) + 1] = {
	4294967296, 4248701965, 4202935003, 4157661043,
	4112874773, 4068570940, 4024744348, 3981389855,
	3938502376, 3896076880, 3854108391, 3812591987,
	3771522796, 3730896002, 3690706840, 3650950594,
	3611622603, 3572718252, 3534232978, 3496162267,
	3458501653, 3421246719, 3384393094, 3347936457,
	3311872529, 3276197082, 3240905930, 3205994934,
	3171459999, 3137297074, 3103502151, 3070071267,
	3037000500, 3004285971, 2971923842, 2939910317,
	2908241642, 2876914102, 2845924021, 2815267765,
	2784941738, 2754942382, 2725266179, 2695909648,
	2666869345, 2638141863, 2609723834, 2581611923,
	2553802834, 2526293303, 2499080105, 2472160047,
	2445529972, 2419186755, 2393127307, 2367348571,
	2341847524, 2316621173, 2291666561, 2266980759,
	2242560872, 2218404036, 2194507417, 2170868212,
	2147483648,
};

// ---- Fixed point (fixedpoint.go) ----

// fp_mul is Fixed.Mul: floor(a*b / 2^32) from four 32x32-bit partial products (BPF
// has no 128-bit multiply), modulo 2^64: it equals Fixed.Mul wherever the product fits
// (Fixed.Mul saturates beyond), and arrival_rate, its only caller, never leaves that.
static __always_inline fp_t fp_mul(fp_t a, fp_t b)
{
	__u64 ah = a >> 32, al = a & 0xffffffff;
	__u64 bh = b >> 32, bl = b & 0xffffffff;
	return ((ah * bh) << 32) + ah * bl + al * bh + ((al * bl) >> 32);
}

// fp_div is Fixed.Div: floor(a * 2^32 / b) by long division over the 96-bit
// dividend, FP_MAX when b is 0 or the quotient does not fit.
// fp_mul_frac is fp_mul for b <= 1.0 (b < 2^32 or exactly FP_ONE), such as a decay
// factor or a random draw: the partial products with b's integer part vanish, so
// this is the same result with two multiplies instead of four.
static __always_inline fp_t fp_mul_frac(fp_t a, fp_t b)
{
	if (b == FP_ONE)
		return a;
	__u64 ah = a >> 32, al = a & 0xffffffff;
	return ah * b + ((al * b) >> 32);
}

static __always_inline fp_t fp_div(fp_t a, fp_t b)
{
	__u64 rem = a >> 32, lo = a << 32, q = 0;
	if (b == 0 || rem >= b)
		return FP_MAX;
	for (int i = 0; i < 64; i++) {
		__u64 carry = rem >> 63;
		rem = (rem << 1) | (lo >> 63);
		lo <<= 1;
		q <<= 1;
		if (carry || rem >= b) {
			rem -= b;
			q |= 1;
		}
	}
	return q;
}

static __always_inline fp_t fp_add(fp_t a, fp_t b)
{
	fp_t s = a + b;
	return s < a ? FP_MAX : s;
}

static __always_inline fp_t fp_sub(fp_t a, fp_t b)
{
	return b > a ? 0 : a - b;
}

// ---- Estimator (countmin.go) ----

static __always_inline fp_t decay_factor(__u64 dt)
{
	if (dt >= DECAY_HORIZON)
		return 0;
	__u64 u = (dt * DECAY_SCALE) >> 32;
	__u64 k = u >> DECAY_FRAC_BITS;
	__u64 f = u & ((1ULL << DECAY_FRAC_BITS) - 1);
	__u64 i = f >> DECAY_INTERP_BITS;
	__u64 r = f & ((1ULL << DECAY_INTERP_BITS) - 1);
	__u64 hi = decay_table[i], lo = decay_table[i + 1];
	return (hi - (((hi - lo) * r) >> DECAY_INTERP_BITS)) >> k;
}

// cell_arrive decays a cell to now and counts one arrival (cellArrive).
static __always_inline void cell_arrive(struct cell *c, __u64 now)
{
	fp_t count = c->count;
	if (now > c->last) {
		count = fp_mul_frac(count, decay_factor(now - c->last));
		c->last = now;
	}
	c->count = fp_add(count, FP_ONE);
}

static __always_inline fp_t arrival_rate(fp_t count)
{
	return fp_mul(fp_sub(count, FP_HALF), RATE_SCALE);
}

static __always_inline __u64 mix64(__u64 x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return x;
}

// sketch_hash hashes a node key (sketchHash): the masked source address, the source
// port (the port node: hi 0, lo the port) or nothing (the total node).
static __always_inline __u64 sketch_hash(__u64 seed, __u64 hi, __u64 lo)
{
	return mix64(mix64(seed ^ hi) ^ lo);
}

// ---- Packet parsing ----

struct packet {
	__u64 hi, lo;      // source address: IPv4 in lo, IPv6 big-endian words
	__u16 sport;
	__u8 v4;
	__u8 dns_flags;    // third byte of the DNS header (QR, opcode, AA, TC, RD)
	__u32 dns_len;     // UDP payload length
	__u32 dns_off;     // offset of the DNS header from the network header
	__u64 dns_counts;  // QDCOUNT, ANCOUNT, NSCOUNT, ARCOUNT (meaningful if dns_len >= 12)
};

enum parse_result {
	PARSE_OK,
	// The headers cannot be followed to a UDP header: not IPv4 or IPv6, not UDP,
	// a later fragment, more IPv6 extension headers than MAX_IPV6_EXT_HEADERS, or a
	// header cut short. Such a packet is dropped (see the top of the file).
	PARSE_UNFOLLOWED,
};

static __always_inline int load_net(struct __sk_buff *skb, __u32 off, void *to, __u32 len)
{
	return bpf_skb_load_bytes_relative(skb, off, to, len, BPF_HDR_START_NET);
}

// The headers of a plain IPv4 or IPv6 DNS query, read with one helper call.
// The whole DNS header is read, for the section counts the cookie lookup checks first.
#define DNS_HEADER_LEN 12

// A DNS header: the first four bytes, then the four section counts as two aligned
// words.
struct dns_header {
	__u8 b[4];
	__be32 qd_an;
	__be32 ns_ar;
};

struct fast_v4 {
	struct iphdr ip;
	struct udphdr udp;
	struct dns_header dns;
};

struct fast_v6 {
	struct ipv6hdr ip;
	struct udphdr udp;
	struct dns_header dns;
};

static __always_inline void set_udp(struct packet *p, struct udphdr *udp, __u8 *dns)
{
	p->sport = bpf_ntohs(udp->source);
	__u32 ulen = bpf_ntohs(udp->len);
	p->dns_len = ulen >= sizeof(*udp) ? ulen - sizeof(*udp) : 0;
	p->dns_flags = p->dns_len >= 3 ? dns[2] : 0;
}

// set_counts keeps the DNS header's four section counts. For a payload shorter than
// a header they are whatever followed it, harmless: a cookie is looked for only in
// a payload long enough to hold one.
static __always_inline void set_counts(struct packet *p, const struct dns_header *dns)
{
	p->dns_counts = (__u64)bpf_ntohl(dns->qd_an) << 32 | bpf_ntohl(dns->ns_ar);
}

static __always_inline void set_ipv6_source(struct packet *p, struct ipv6hdr *ip6)
{
	__u64 hi, lo;
	__builtin_memcpy(&hi, &ip6->saddr.in6_u.u6_addr8[0], 8);
	__builtin_memcpy(&lo, &ip6->saddr.in6_u.u6_addr8[8], 8);
	hi = bpf_be64_to_cpu(hi);
	lo = bpf_be64_to_cpu(lo);
	if (hi == 0 && (lo >> 32) == 0xffff) {
		// IPv4-mapped: an IPv4 client, as in the Go model.
		p->v4 = 1;
		p->hi = 0;
		p->lo = lo & 0xffffffff;
	} else {
		p->v4 = 0;
		p->hi = hi;
		p->lo = lo;
	}
}

// parse_fast handles the common case, an IPv4 header without options or an IPv6
// header directly followed by UDP, with a single load; it returns -1 when the packet
// needs the general parser.
static __always_inline int parse_fast(struct __sk_buff *skb, struct packet *p)
{
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct fast_v4 h;
		if (load_net(skb, 0, &h, sizeof(h)) || h.ip.ihl != 5)
			return -1;
		if (h.ip.protocol != IPPROTO_UDP || (h.ip.frag_off & bpf_htons(0x1fff)))
			return PARSE_UNFOLLOWED;
		p->v4 = 1;
		p->hi = 0;
		p->lo = bpf_ntohl(h.ip.saddr);
		set_udp(p, &h.udp, h.dns.b);
		set_counts(p, &h.dns);
		p->dns_off = sizeof(h.ip) + sizeof(h.udp);
		return PARSE_OK;
	}
	if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct fast_v6 h;
		if (load_net(skb, 0, &h, sizeof(h)) || h.ip.nexthdr != IPPROTO_UDP)
			return -1;
		set_ipv6_source(p, &h.ip);
		set_udp(p, &h.udp, h.dns.b);
		set_counts(p, &h.dns);
		p->dns_off = sizeof(h.ip) + sizeof(h.udp);
		return PARSE_OK;
	}
	return PARSE_UNFOLLOWED;
}

// parse_general is the general parser: IPv4 options, IPv6 extension headers,
// packets too short for the single load of parse_fast. A subprogram: few packets need
// it, and both parse's callers share it.
static __noinline int parse_general(struct __sk_buff *skb, struct packet *p)
{
	__u32 off;

	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;
		if (load_net(skb, 0, &ip, sizeof(ip)))
			return PARSE_UNFOLLOWED;
		if (ip.protocol != IPPROTO_UDP || (ip.frag_off & bpf_htons(0x1fff)))
			return PARSE_UNFOLLOWED;
		off = ip.ihl * 4;
		if (off < sizeof(ip))
			return PARSE_UNFOLLOWED;
		p->v4 = 1;
		p->hi = 0;
		p->lo = bpf_ntohl(ip.saddr);
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;
		if (load_net(skb, 0, &ip6, sizeof(ip6)))
			return PARSE_UNFOLLOWED;
		__u8 next = ip6.nexthdr;
		off = sizeof(ip6);
		// Walk the extension headers that may precede UDP.
#pragma clang loop unroll(disable)
		for (int i = 0; i < MAX_IPV6_EXT_HEADERS; i++) {
			__u8 ext[8];
			if (next != IPPROTO_HOPOPTS && next != IPPROTO_ROUTING &&
			    next != IPPROTO_DSTOPTS && next != IPPROTO_FRAGMENT &&
			    next != IPPROTO_AH)
				break;
			if (load_net(skb, off, ext, sizeof(ext)))
				return PARSE_UNFOLLOWED;
			if (next == IPPROTO_FRAGMENT) {
				// Only the first fragment carries the UDP header.
				if (((ext[2] << 8) | ext[3]) & 0xfff8)
					return PARSE_UNFOLLOWED;
				off += 8;
			} else if (next == IPPROTO_AH) {
				off += ((__u32)ext[1] + 2) * 4;
			} else {
				off += ((__u32)ext[1] + 1) * 8;
			}
			next = ext[0];
		}
		// Still an extension header after MAX_IPV6_EXT_HEADERS, or an upper layer
		// other than UDP.
		if (next != IPPROTO_UDP)
			return PARSE_UNFOLLOWED;
		set_ipv6_source(p, &ip6);
	} else {
		return PARSE_UNFOLLOWED;
	}

	struct udphdr udp;
	if (load_net(skb, off, &udp, sizeof(udp)))
		return PARSE_UNFOLLOWED;
	struct dns_header dns = {};
	set_udp(p, &udp, dns.b);
	p->dns_off = off + sizeof(udp);
	if (p->dns_len >= DNS_HEADER_LEN) {
		if (load_net(skb, p->dns_off, &dns, DNS_HEADER_LEN))
			return PARSE_UNFOLLOWED;
	} else if (p->dns_len >= 3 && load_net(skb, p->dns_off, &dns, 3)) {
		return PARSE_UNFOLLOWED;
	}
	p->dns_flags = dns.b[2];
	set_counts(p, &dns);
	return PARSE_OK;
}

// parse reads the packet's source and DNS header fields.
static __always_inline int parse(struct __sk_buff *skb, struct packet *p)
{
	int fast = parse_fast(skb, p);
	if (fast >= 0)
		return fast;
	return parse_general(skb, p);
}

// ---- Decision ----

static __always_inline void count(struct counters *c, __u32 which)
{
	if (c && which < COUNTER_MAX)
		c->value[which]++;
}

static __always_inline void count_limited(struct counters *c, __u64 i)
{
	if (c && i < NUM_LIMITED)
		c->value[COUNTER_LIMITED0 + i]++;
}

static __always_inline int is_exempt(struct settings *s, struct packet *p)
{
	if (p->v4) {
		if (!s->has_exempt4)
			return 0;
		struct exempt4_key k = {.prefixlen = 8 + 32, .slot = s->slot};
		__u32 a = bpf_htonl((__u32)p->lo);
		__builtin_memcpy(k.addr, &a, 4);
		return bpf_map_lookup_elem(&rrl_exempt4, &k) != NULL;
	}
	if (!s->has_exempt6)
		return 0;
	struct exempt6_key k = {.prefixlen = 8 + 128, .slot = s->slot};
	__u64 hi = bpf_cpu_to_be64(p->hi), lo = bpf_cpu_to_be64(p->lo);
	__builtin_memcpy(&k.addr[0], &hi, 8);
	__builtin_memcpy(&k.addr[8], &lo, 8);
	return bpf_map_lookup_elem(&rrl_exempt6, &k) != NULL;
}

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define le64(x) (x)
#else
#define le64(x) __builtin_bswap64(x)
#endif

#define ROTL64(x, b) (((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                        \
	do {                                                            \
		v0 += v1; v1 = ROTL64(v1, 13); v1 ^= v0; v0 = ROTL64(v0, 32); \
		v2 += v3; v3 = ROTL64(v3, 16); v3 ^= v2;                \
		v0 += v3; v3 = ROTL64(v3, 21); v3 ^= v0;                \
		v2 += v1; v1 = ROTL64(v1, 17); v1 ^= v2; v2 = ROTL64(v2, 32); \
	} while (0)

// siphash24 is SipHash-2-4 keyed by k over a message of nblocks (at most 4) 8-byte
// little-endian words m and the final word last (the tail bytes and the length in
// the top byte). A subprogram with one copy of the round in one loop (two rounds per
// word, then four): every attached socket pays for the program's size, and only
// queries that carry a server cookie call it.
static __noinline __u64 siphash24(const struct sip_key *k, const __u64 *m, __u32 nblocks, __u64 last)
{
	__u64 v0 = k->k0 ^ 0x736f6d6570736575ULL;
	__u64 v1 = k->k1 ^ 0x646f72616e646f6dULL;
	__u64 v2 = k->k0 ^ 0x6c7967656e657261ULL;
	__u64 v3 = k->k1 ^ 0x7465646279746573ULL;
	__u64 word = last;
	// Rounds 2i and 2i+1 take word i (m, then last); then four more rounds.
#pragma clang loop unroll(disable)
	for (__u64 r = 0; r < 2 * 5 + 4; r++) {
		__u64 i = r >> 1;
		if (i > nblocks + 2)
			break;
		if (!(r & 1) && i <= nblocks) {
			word = i < nblocks ? m[i & 3] : last;
			v3 ^= word;
		}
		SIPROUND;
		if ((r & 1) && i <= nblocks) {
			v0 ^= word;
			if (i == nblocks)
				v2 ^= 0xff;
		}
	}
	return v0 ^ v1 ^ v2 ^ v3;
}

enum cookie_verdict {
	COOKIE_NONE,    // no server cookie of the RFC 9018 size: judged as today
	COOKIE_PROVEN,  // a server cookie Cookies.Verify finds valid
	COOKIE_INVALID, // a server cookie that is not: judged as without one
};

// find_cookie looks for the query's COOKIE option in an OPT record right after the
// only question, whose name it walks label by label (a compression pointer or an
// extended label type ends the search). It returns 0 when there is none where it
// looks, else the offset of the option's data from the end of the DNS header in the
// low 16 bits and the option's length (capped at 255) above them.
//
// The question and the OPT record's fixed part are read from one load of the first
// COOKIE_SCAN bytes after the header, each option's header from the packet where it
// is: so a cookie is found anywhere in an OPT record of any length (a padded query's
// OPT ends well past byte 512). Reading the options from the scan too, where they
// lie within it, would save a load per option but doubles the paths the verifier
// walks with every option, beyond its limit.
static __always_inline __u32 find_cookie(struct __sk_buff *skb, __u32 dns_off, __u32 dns_len)
{
	__u32 zero = 0;
	struct cookie_scratch *sc = bpf_map_lookup_elem(&rrl_cookie_scratch, &zero);
	if (!sc || dns_len < MIN_COOKIE_QUERY)
		return 0;
	// Indexes are 64-bit: the verifier keeps the bounds of a 64-bit register
	// through the checks, not those of a 32-bit one zero-extended into a copy.
	__u64 len = dns_len - DNS_HEADER_LEN; // the message after its header
	__u64 n = len;
	if (n > COOKIE_SCAN)
		n = COOKIE_SCAN;
	barrier_var(n);
	if (n < MIN_COOKIE_QUERY - DNS_HEADER_LEN || n > COOKIE_SCAN)
		return 0;
	if (load_net(skb, dns_off + DNS_HEADER_LEN, sc->b, n))
		return 0;
	const __u8 *b = sc->b;
	__u64 i = 0;
#pragma clang loop unroll(disable)
	for (int k = 0; k <= MAX_NAME_LEN / 2; k++) {
		__u8 l = b[i & COOKIE_SCAN_MASK];
		if (l == 0)
			goto name_end;
		if (l & 0xc0)
			return 0;
		i += l + 1;
		if (i >= MAX_NAME_LEN || i >= n)
			return 0;
	}
	return 0;
name_end:
	i += 1 + 4; // the root label, QTYPE, QCLASS
	if (i + OPT_FIXED_LEN > n)
		return 0;
	i &= COOKIE_SCAN_MASK;
	if (b[i] != 0 || b[i + 1] != 0 || b[i + 2] != OPT_TYPE)
		return 0;
	__u64 o = i + OPT_FIXED_LEN;
	__u64 end = o + ((__u64)b[i + 9] << 8 | b[i + 10]);
	if (end > len)
		return 0;
#pragma clang loop unroll(disable)
	for (int k = 0; k < MAX_OPTIONS; k++) {
		if (o + 4 > end)
			return 0;
		__u8 h[4];
		if (load_net(skb, dns_off + DNS_HEADER_LEN + o, h, sizeof(h)))
			return 0;
		__u64 code = (__u64)h[0] << 8 | h[1];
		__u64 olen = (__u64)h[2] << 8 | h[3];
		if (code == COOKIE_OPTION) {
			if (o + 4 + olen > end)
				return 0;
			return (o + 4) | (olen > 255 ? 255 : olen) << 16;
		}
		o += 4 + olen;
	}
	return 0;
}

// check_cookie judges the server cookie of a query whose DNS header is at dns_off
// (bits 32..63 of where), dns_len bytes long (bits 1..31), from source (hi, lo), IPv4
// if bit 0 of where is set, at now on the program's clock, as Cookies.Verify does:
// version 1, a timestamp no more than COOKIE_MAX_AGE seconds old and
// COOKIE_MAX_FUTURE ahead of the wall clock, and SipHash-2-4 over client cookie |
// version | reserved | timestamp | address with the current or the previous secret.
//
// A global function: the verifier checks it once, on its own, instead of walking
// every label count at every place the caller's state differs (which took a second
// of loading), and the code that only cookie queries run stays out of the caller's
// registers.
__noinline int check_cookie(struct __sk_buff *skb, __u64 where, __u64 now, __u64 hi, __u64 lo)
{
	__u32 zero = 0;
	__u32 dns_off = where >> 32, dns_len = (__u32)where >> 1;
	struct cookie_secrets *sec = bpf_map_lookup_elem(&rrl_cookie_secrets, &zero);
	if (!sec || !sec->has_current)
		return COOKIE_NONE;
	__u32 found = find_cookie(skb, dns_off, dns_len);
	__u32 at = found & 0xffff, len = found >> 16;
	if (!at)
		return COOKIE_NONE;
	if (len != COOKIE_LEN)
		// Other server cookie sizes RFC 7873 allows are not ours (CookieBad).
		return len >= 16 && len <= 40 ? COOKIE_INVALID : COOKIE_NONE;
	__u64 ck[3];
	if (load_net(skb, dns_off + DNS_HEADER_LEN + at, ck, sizeof(ck)))
		return COOKIE_NONE;
	__u64 w = le64(ck[1]); // version, reserved, timestamp
	if ((w & 0xff) != COOKIE_VERSION)
		return COOKIE_INVALID;
	__u32 wall = (__u64)((__s64)now + sec->wall_offset_ns) / 1000000000ULL;
	__s32 age = (__s32)(wall - __builtin_bswap32((__u32)(w >> 32)));
	if (age > COOKIE_MAX_AGE || age < -COOKIE_MAX_FUTURE)
		return COOKIE_INVALID;
	__u64 m[4] = {le64(ck[0]), w};
	__u32 nblocks = 2;
	__u64 last;
	if (where & 1) {
		// An IPv4 client is hashed as 4 bytes, from a dual-stack socket too.
		last = (__u64)__builtin_bswap32((__u32)lo) | (20ULL << 56);
	} else {
		m[2] = __builtin_bswap64(hi);
		m[3] = __builtin_bswap64(lo);
		nblocks = 4;
		last = 32ULL << 56;
	}
	__u64 want = le64(ck[2]);
	if (siphash24(&sec->current, m, nblocks, last) == want)
		return COOKIE_PROVEN;
	if (sec->has_previous && siphash24(&sec->previous, m, nblocks, last) == want)
		return COOKIE_PROVEN;
	return COOKIE_INVALID;
}

// may_hold_cookie is the cheap test every query takes: one question, no answers or
// authority, an additional record, and room for a cookie.
static __always_inline int may_hold_cookie(const struct packet *p)
{
	return (p->dns_counts >> 16) == 0x000100000000ULL && (p->dns_counts & 0xffff) &&
	       p->dns_len >= MIN_COOKIE_QUERY;
}

// own_address_step reports whether st, a family's first step, keys on the whole
// source address (/32 or /128), the only group a proven query is judged in.
static __always_inline int own_address_step(const struct step *st, __u32 v4)
{
	if (st->port_mask)
		return 0;
	if (v4)
		return st->mask_lo == 0xffffffffULL;
	return (st->mask_hi & st->mask_lo) == ~0ULL;
}

// judgement holds the draw of the packet being judged, taken when a node first needs
// it: below a node's trip count the packet passes whatever the draw, so a packet
// within every limit (all of them, without an attack) costs no random number.
struct judgement {
	const __u32 *test_rnd;  // the draw tests replay; NULL: bpf_get_prandom_u32
	__u64 now;              // the packet's clock reading, for record_limited
	__u32 rnd;
	__u32 drawn;
};

static __always_inline __u32 draw(struct judgement *j)
{
	if (!j->drawn) {
		j->rnd = j->test_rnd ? *j->test_rnd : bpf_get_prandom_u32();
		j->drawn = 1;
	}
	return j->rnd;
}

// node_passes decides for a node whose count reached its trip count: the packet
// passes with probability limit / rate. A subprogram: only packets of sources over a
// limit call it, so the lattice loop stays small.
static __noinline int node_passes(struct judgement *j, fp_t min, fp_t limit)
{
	return fp_mul_frac(arrival_rate(min), (fp_t)draw(j)) < limit;
}

// node_count counts the packet in node's sketch, where its key hashes to h, and sets
// *min to the smaller of its cells after the arrival (the estimate). It returns -1
// when a cell cannot be looked up (an internal error), else 0.
static __always_inline int node_count(__u32 node, __u64 h, __u64 now, fp_t *min)
{
	*min = FP_MAX;
	for (__u32 row = 0; row < SKETCH_DEPTH; row++) {
		__u32 idx = (node * SKETCH_DEPTH + row) * SKETCH_WIDTH +
			    ((__u32)(h >> (16 * row)) & (SKETCH_WIDTH - 1));
		struct cell *c = bpf_map_lookup_elem(&rrl_cells, &idx);
		if (!c)
			return -1;
		cell_arrive(c, now);
		if (c->count < *min)
			*min = c->count;
	}
	return 0;
}

// record_limited notes a sampled drop in rrl_limited: of the packet's group at the
// step whose limited counter is limited (the decider), with that step's estimate for
// it, read back from the cells the packet was just counted in. A subprogram on the
// drop path, which parses the packet again rather than have the lattice loop keep
// the group: passed packets pay nothing for this. Concurrent records of one group
// may interleave their fields; drops is added atomically, the rest is for display.
static __noinline void record_limited(struct __sk_buff *skb, const struct settings *s, __u64 limited,
				      const struct judgement *j)
{
	struct packet p = {};
	if (parse(skb, &p) != PARSE_OK)
		return;
	__u32 fam = p.v4 & 1;
	__u32 steps = s->steps[fam];
	const struct step *st = NULL;
#pragma clang loop unroll(disable)
	for (__u32 i = 0; i < MAX_STEPS; i++) {
		if (i >= steps)
			break;
		if (s->step[fam][i].limited == limited) {
			st = &s->step[fam][i];
			break;
		}
	}
	if (!st || st->node >= NUM_NODES)
		return;
	struct limited_key k = {
		.hi = p.hi & st->mask_hi,
		.lo = (p.lo & st->mask_lo) | (p.sport & st->port_mask),
		.limited = limited,
	};
	__u32 node = st->node;
	__u64 h = sketch_hash(s->seed, k.hi, k.lo);
	fp_t min = FP_MAX;
	for (__u32 row = 0; row < SKETCH_DEPTH; row++) {
		__u32 idx = (node * SKETCH_DEPTH + row) * SKETCH_WIDTH +
			    ((__u32)(h >> (16 * row)) & (SKETCH_WIDTH - 1));
		struct cell *c = bpf_map_lookup_elem(&rrl_cells, &idx);
		if (!c)
			return;
		if (c->count < min)
			min = c->count;
	}
	__u64 now = j->now;
	struct limited_value *v = bpf_map_lookup_elem(&rrl_limited, &k);
	if (v) {
		__sync_fetch_and_add(&v->drops, 1);
		v->last = now;
		v->count = min;
		v->limit = st->limit;
		return;
	}
	struct limited_value nv = {.drops = 1, .first = now, .last = now, .count = min, .limit = st->limit};
	bpf_map_update_elem(&rrl_limited, &k, &nv, BPF_NOEXIST);
}

// filter judges one packet with the settings s, counting in c (either may be NULL,
// a failed lookup); now (ns) and test_rnd (a uniform 32-bit draw, or NULL for
// bpf_get_prandom_u32) are arguments so that tests can replay the Go model's inputs.
// It returns the number of bytes to keep: 0 drops the packet.
static __always_inline int filter(struct __sk_buff *skb, struct settings *s, struct counters *c,
				  __u64 now, const __u32 *test_rnd)
{
	struct packet p = {};

	count(c, COUNTER_SEEN);
	if (!s) {
		count(c, COUNTER_ERROR);
		goto pass;
	}

	switch (parse(skb, &p)) {
	case PARSE_OK:
		break;
	default:
		count(c, COUNTER_DROP_UNFOLLOWED);
		goto drop;
	}

	// Stateless checks: what can never be a query to this server.
	if (p.dns_len < MIN_DNS_LEN) {
		count(c, COUNTER_DROP_SHORT);
		goto drop;
	}
	if (p.dns_flags & 0x80) {
		count(c, COUNTER_DROP_RESPONSE);
		goto drop;
	}
	// The bitmap is read only for ports in a block that lists one: queries from
	// ephemeral ports, in blocks the default list leaves empty, touch no line of it.
	if (((s->reflection_blocks >> (p.sport >> 10)) & 1) &&
	    (s->reflection_ports[(p.sport >> 6) & 1023] & (1ULL << (p.sport & 63)))) {
		count(c, COUNTER_DROP_REFLECTION);
		goto drop;
	}
	if (is_exempt(s, &p)) {
		count(c, COUNTER_EXEMPT);
		goto pass;
	}

	// The lattice: every active node of the packet counts it, then it passes only if
	// every node lets it through for the one draw, which is probability
	// min(limit/rate) over the nodes. The first node that refuses is the decider.
	struct judgement j = {.test_rnd = test_rnd, .now = now};
	__u32 fam = p.v4 & 1;
	__u32 steps = s->steps[fam];
	int refused = 0;
	__u64 decider = 0;        // the refusing step's limited counter
	// A query with a valid server cookie comes from the address it claims: it is
	// judged only in its own address's node, not in the groups it shares.
	int proven = 0;
	if (may_hold_cookie(&p)) {
		int v = check_cookie(skb, (__u64)p.dns_off << 32 | p.dns_len << 1 | p.v4, now, p.hi, p.lo);
		if (v == COOKIE_PROVEN && (!steps || own_address_step(&s->step[fam][0], p.v4))) {
			steps = steps ? 1 : 0;
			proven = 1;
		} else if (v == COOKIE_INVALID) {
			count(c, COUNTER_COOKIE_INVALID);
		}
	}
	// The hash's first round depends on the key's hi word only, which is 0 for
	// IPv4 sources, the port and the total node, and the same for IPv6 levels of
	// /64 and longer: it is computed again only when hi changes.
	__u64 prev_hi = 0, h1 = s->seed_mix0;
	// Not unrolled: the kernel charges the program's size to every socket it is
	// attached to (socket option memory), so the filter stays small.
#pragma clang loop unroll(disable)
	for (__u32 i = 0; i < MAX_STEPS; i++) {
		if (i >= steps)
			break;
		struct step *st = &s->step[fam][i];
		__u32 node = st->node;
		if (node >= NUM_NODES) {
			count(c, COUNTER_ERROR);
			goto pass;
		}
		__u64 hi = p.hi & st->mask_hi;
		__u64 lo = (p.lo & st->mask_lo) | (p.sport & st->port_mask);
		if (hi != prev_hi) {
			prev_hi = hi;
			h1 = mix64(s->seed ^ hi);
		}
		fp_t min;
		if (node_count(node, mix64(h1 ^ lo), now, &min)) {
			count(c, COUNTER_ERROR);
			goto pass;
		}
		// arrival_rate(min) * draw < limit holds for every draw below the trip
		// count (the draw is below 1): the same verdict without the multiplies.
		if (min >= st->trip && !refused && !node_passes(&j, min, st->limit)) {
			refused = 1;
			decider = st->limited;
		}
	}

	if (refused) {
		count_limited(c, decider);
		// The draw refused the packet, so its high bits lean towards 1; its
		// low bits are still uniform and pick one drop in LIMITED_SAMPLE to
		// record. Checked here: the other drops do not pay for the call.
		if (!(j.rnd & (LIMITED_SAMPLE - 1)))
			record_limited(skb, s, decider, &j);
		goto drop;
	}
	if (proven)
		count(c, COUNTER_COOKIE_PASSED);
	goto pass;

drop:
	// In report-only mode every drop is counted under its reason and passed.
	if (!s->report_only)
		return 0;
	count(c, COUNTER_REPORT_ONLY);
pass:
	count(c, COUNTER_PASSED);
	return skb->len;
}

// CLOCK_RESYNC_TICKS is how often (in jiffies) clock_now takes its offset afresh.
#define CLOCK_RESYNC_TICKS 256

// clock_now is the live clock: CLOCK_MONOTONIC at tick resolution (1 to 10 ms), a
// fraction of a percent of the estimator's 289 ms time constant. Packets within one
// tick decay nothing between them, exactly as the model treats equal timestamps.
//
// It counts jiffies, which the kernel reads inline (a load, not a helper call), and
// turns them into the coarse monotonic clock (bpf_ktime_get_coarse_ns, Linux 5.11),
// the clock the Go side reads cells against, with an offset this CPU takes from that
// clock every CLOCK_RESYNC_TICKS. Both advance on the same tick, so the two readings
// differ by at most a tick. Without tick_ns or counters it reads the coarse clock.
static __always_inline __u64 clock_now(const struct settings *s, struct counters *c)
{
	__u64 tick = s ? s->tick_ns : 0;
	if (!tick || !c)
		return bpf_ktime_get_coarse_ns();
	__u64 j = bpf_jiffies64();
	// Unsigned: a CPU that never synced (clock_sync 0) resyncs, and so does one
	// whose clock_sync is ahead of j (a race between two runs on this CPU).
	if (j - c->clock_sync >= CLOCK_RESYNC_TICKS) {
		c->clock_offset = bpf_ktime_get_coarse_ns() - j * tick;
		c->clock_sync = j;
	}
	return j * tick + c->clock_offset;
}

// active_settings returns the settings slot in force (see struct settings), NULL
// when a lookup fails.
static __always_inline struct settings *active_settings(void)
{
	__u32 key = 0;
	struct settings *h = bpf_map_lookup_elem(&rrl_settings, &key);
	if (!h)
		return NULL;
	key = 1 + (h->slot & 1);
	return bpf_map_lookup_elem(&rrl_settings, &key);
}

SEC("socket")
int rrl_filter(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct counters *c = bpf_map_lookup_elem(&rrl_counters, &zero);
	struct settings *s = active_settings();
	return filter(skb, s, c, clock_now(s, c), NULL);
}

// ---- Test-only entry points: never loaded by Attach. ----

// test_input feeds rrl_filter_test its clock and draw, so a test can replay exactly
// what it gives the Go model.
struct test_input {
	__u64 now;
	__u32 rnd;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct test_input);
} rrl_test_input SEC(".maps");

SEC("socket")
int rrl_filter_test(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct test_input *in = bpf_map_lookup_elem(&rrl_test_input, &zero);
	if (!in)
		return skb->len;
	struct counters *c = bpf_map_lookup_elem(&rrl_counters, &zero);
	struct settings *s = active_settings();
	return filter(skb, s, c, in->now, &in->rnd);
}

// fp_ops_test evaluates the fixed-point and estimator primitives on inputs from
// rrl_test_fp, so the tests can compare them with the Go functions bit for bit.
struct test_fp {
	__u64 a, b;
	__u64 mul, mul_frac, div, add, sub, decay, rate, hash;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct test_fp);
} rrl_test_fp SEC(".maps");

SEC("socket")
int rrl_fp_test(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct test_fp *t = bpf_map_lookup_elem(&rrl_test_fp, &zero);
	if (!t)
		return 0;
	t->mul = fp_mul(t->a, t->b);
	t->mul_frac = fp_mul_frac(t->a, t->b & 0xffffffff);
	t->div = fp_div(t->a, t->b);
	t->add = fp_add(t->a, t->b);
	t->sub = fp_sub(t->a, t->b);
	t->decay = decay_factor(t->a);
	t->rate = arrival_rate(t->a);
	t->hash = sketch_hash(t->a, t->b, t->a ^ t->b);
	return 1;
}
