// Packet parsing: the source and the DNS header fields of a UDP query.
#pragma once

#include "ctx.h"

// A DNS header (12 bytes) plus the smallest question (root name, type, class).
#define MIN_DNS_LEN 17
#define MAX_IPV6_EXT_HEADERS 6

struct packet {
	__u64 hi, lo;      // source address: IPv4 in lo, IPv6 big-endian words
	__u16 sport;
	__u16 dport;
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
	// header cut short. The socket filter drops such a packet (filter_bpf.c); XDP
	// passes it untouched, as one it cannot tell is for the server.
	PARSE_UNFOLLOWED,
};

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

static __always_inline void set_udp(struct packet *p, const struct udphdr *udp, const __u8 *dns)
{
	p->sport = bpf_ntohs(udp->source);
	p->dport = bpf_ntohs(udp->dest);
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

static __always_inline void set_ipv6_source(struct packet *p, const struct ipv6hdr *ip6)
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
// header directly followed by UDP, with a single load (XDP reads in place); it
// returns -1 when the packet needs the general parser.
static __always_inline int parse_fast(struct rrl_ctx *ctx, struct packet *p)
{
	if (net_protocol(ctx) == bpf_htons(ETH_P_IP)) {
		struct fast_v4 buf, *h;
		if (net_header(ctx, &buf, sizeof(buf), (void **)&h))
			return -1;
		if (h->ip.ihl != 5)
			return -1;
		if (h->ip.protocol != IPPROTO_UDP || (h->ip.frag_off & bpf_htons(0x1fff)))
			return PARSE_UNFOLLOWED;
		p->v4 = 1;
		p->hi = 0;
		p->lo = bpf_ntohl(h->ip.saddr);
		set_udp(p, &h->udp, h->dns.b);
		set_counts(p, &h->dns);
		p->dns_off = sizeof(h->ip) + sizeof(h->udp);
		return PARSE_OK;
	}
	if (net_protocol(ctx) == bpf_htons(ETH_P_IPV6)) {
		struct fast_v6 buf, *h;
		if (net_header(ctx, &buf, sizeof(buf), (void **)&h))
			return -1;
		if (h->ip.nexthdr != IPPROTO_UDP)
			return -1;
		set_ipv6_source(p, &h->ip);
		set_udp(p, &h->udp, h->dns.b);
		set_counts(p, &h->dns);
		p->dns_off = sizeof(h->ip) + sizeof(h->udp);
		return PARSE_OK;
	}
	return PARSE_UNFOLLOWED;
}

// parse_general is the general parser: IPv4 options, IPv6 extension headers,
// packets too short for the single load of parse_fast. A subprogram: few packets need
// it, and both parse's callers share it.
static __noinline int parse_general(struct rrl_ctx *ctx, struct packet *p)
{
	__u32 off;

	if (net_protocol(ctx) == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;
		if (load_net(ctx, 0, &ip, sizeof(ip)))
			return PARSE_UNFOLLOWED;
		if (ip.protocol != IPPROTO_UDP || (ip.frag_off & bpf_htons(0x1fff)))
			return PARSE_UNFOLLOWED;
		off = ip.ihl * 4;
		if (off < sizeof(ip))
			return PARSE_UNFOLLOWED;
		p->v4 = 1;
		p->hi = 0;
		p->lo = bpf_ntohl(ip.saddr);
	} else if (net_protocol(ctx) == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;
		if (load_net(ctx, 0, &ip6, sizeof(ip6)))
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
			if (load_net(ctx, off, ext, sizeof(ext)))
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
	if (load_net(ctx, off, &udp, sizeof(udp)))
		return PARSE_UNFOLLOWED;
	struct dns_header dns = {};
	set_udp(p, &udp, dns.b);
	p->dns_off = off + sizeof(udp);
	if (p->dns_len >= DNS_HEADER_LEN) {
		if (load_net(ctx, p->dns_off, &dns, DNS_HEADER_LEN))
			return PARSE_UNFOLLOWED;
	} else if (p->dns_len >= 3 && load_net(ctx, p->dns_off, &dns, 3)) {
		return PARSE_UNFOLLOWED;
	}
	p->dns_flags = dns.b[2];
	set_counts(p, &dns);
	return PARSE_OK;
}

// parse reads the packet's source and DNS header fields.
static __always_inline int parse(struct rrl_ctx *ctx, struct packet *p)
{
	int fast = parse_fast(ctx, p);
	if (fast >= 0)
		return fast;
	return parse_general(ctx, p);
}
