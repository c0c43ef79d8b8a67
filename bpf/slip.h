// Slip at the driver (XDP only): a request-limited query answered with a truncated
// response, sent back out of the interface it came in on (XDP_TX).
#pragma once

#include "dns.h"

// SLIP_SUM_MAX is the longest question rounded up to whole 32-bit words, which
// bpf_csum_diff sums.
#define SLIP_SUM_MAX ((QUESTION_MAX + 3) & ~3)

static __always_inline __u16 fold(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return sum;
}

// slip_reply turns the query in ctx, whose DNS header is at dns_off from the network
// header, into a truncated response in place: the addresses and ports swapped, the
// header with QR and TC set, the opcode and RD kept, RCODE 0, the question echoed and
// every other section cut off, so that the response is never larger than the query. It
// returns 0 when the packet is the response, to be sent with XDP_TX, and -1 when the
// query is not one it answers (IPv4 options, IPv6 extension headers, not exactly one
// question, a question it cannot walk): such a query is dropped. A subprogram: only
// slips run it.
static __noinline int slip_reply(struct xdp_md *ctx, __u32 dns_off)
{
	__u32 zero = 0;
	struct cookie_scratch *sc = bpf_map_lookup_elem(&rrl_cookie_scratch, &zero);
	if (!sc)
		return -1;
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return -1;
	int v4 = eth->h_proto == bpf_htons(ETH_P_IP);
	struct iphdr *ip = (void *)(eth + 1);
	struct ipv6hdr *ip6 = (void *)(eth + 1);
	struct udphdr *udp;
	if (v4) {
		if ((void *)(ip + 1) > end || ip->ihl != 5 || dns_off != sizeof(*ip) + sizeof(*udp))
			return -1;
		udp = (void *)(ip + 1);
	} else {
		if ((void *)(ip6 + 1) > end || ip6->nexthdr != IPPROTO_UDP || dns_off != sizeof(*ip6) + sizeof(*udp))
			return -1;
		udp = (void *)(ip6 + 1);
	}
	struct dns_header *dns = (void *)(udp + 1);
	if ((void *)(dns + 1) > end || (bpf_ntohl(dns->qd_an) >> 16) != 1)
		return -1;
	__u32 udp_len = bpf_ntohs(udp->len);
	if (udp_len < sizeof(*udp) + DNS_HEADER_LEN + 5)
		return -1;
	__u64 n = udp_len - sizeof(*udp) - DNS_HEADER_LEN;
	if (n > QUESTION_MAX)
		n = QUESTION_MAX;
	barrier_var(n);
	if (n < 5 || n > QUESTION_MAX)
		return -1;
	// The frame holds the n bytes the UDP length claims (up to the longest question).
	__u8 last;
	if (bpf_xdp_load_bytes(ctx, ETH_HLEN + dns_off + DNS_HEADER_LEN + n - 1, &last, 1))
		return -1;
	__u64 q = (__u32)question_end(ctx, dns_off + DNS_HEADER_LEN, n); // name, type, class
	if (!q || q > n)
		return -1;

	// The response in place, then the tail cut.
	unsigned char mac[ETH_ALEN];
	__builtin_memcpy(mac, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, mac, ETH_ALEN);
	__u16 ulen = sizeof(*udp) + DNS_HEADER_LEN + q;
	__be16 port = udp->source;
	udp->source = udp->dest;
	udp->dest = port;
	udp->len = bpf_htons(ulen);
	udp->check = 0;
	dns->b[2] = (dns->b[2] & 0x79) | 0x82; // QR, TC; opcode and RD kept
	dns->b[3] = 0;                         // RA, Z, AD, CD clear; RCODE NOERROR
	dns->ns_ar = 0;
	dns->qd_an = bpf_htonl(0x00010000);
	__u32 sum = 0;
	int total;
	if (v4) {
		__be32 a = ip->saddr;
		ip->saddr = ip->daddr;
		ip->daddr = a;
		ip->ttl = 64;
		ip->tot_len = bpf_htons(sizeof(*ip) + ulen);
		ip->check = 0;
		__u16 *w = (void *)ip;
#pragma clang loop unroll(full)
		for (int i = 0; i < 10; i++)
			sum += bpf_ntohs(w[i]);
		ip->check = bpf_htons(~fold(sum) & 0xffff);
		total = ETH_HLEN + sizeof(*ip) + ulen;
	} else {
		struct in6_addr a = ip6->saddr;
		ip6->saddr = ip6->daddr;
		ip6->daddr = a;
		ip6->hop_limit = 64;
		ip6->payload_len = bpf_htons(ulen);
		// The UDP checksum, mandatory over IPv6: the pseudo-header (addresses,
		// length, next header), the UDP header, the DNS header, the question.
		__u16 *w = (void *)&ip6->saddr;
#pragma clang loop unroll(full)
		for (int i = 0; i < 16; i++)
			sum += bpf_ntohs(w[i]);
		sum += 2 * (__u32)ulen + IPPROTO_UDP;
		sum += bpf_ntohs(udp->source) + bpf_ntohs(udp->dest);
		__u16 *d = (void *)dns;
#pragma clang loop unroll(full)
		for (int i = 0; i < 6; i++)
			sum += bpf_ntohs(d[i]);
		// The question, zero-padded to whole words in the scratch space, summed by
		// the kernel: a process without CAP_PERFMON may not index the scratch space
		// by a value that differs between paths, as a loop over it would.
		__u64 *z = (void *)sc->b; // a map value is 8-aligned
#pragma clang loop unroll(full)
		for (int i = 0; i < SLIP_SUM_MAX / 8 + 1; i++)
			z[i] = 0;
		barrier_var(q);
		if (q > QUESTION_MAX)
			return -1;
		if (bpf_xdp_load_bytes(ctx, ETH_HLEN + dns_off + DNS_HEADER_LEN, sc->b, q))
			return -1;
		__s64 qsum = bpf_csum_diff(NULL, 0, (void *)sc->b, (q + 3) & ~3ULL, 0);
		if (qsum < 0)
			return -1;
		// The kernel sums the words as they lie in memory: swapped on a
		// little-endian machine, which a ones' complement sum survives.
		sum += bpf_ntohs(fold(qsum));
		__u16 c = ~fold(sum) & 0xffff;
		udp->check = bpf_htons(c ? c : 0xffff);
		total = ETH_HLEN + sizeof(*ip6) + ulen;
	}
	// The frame's length from the helper: a process without CAP_PERFMON may not
	// subtract one packet pointer from another (the program takes no fragments, so
	// this is end - data).
	int delta = total - (int)bpf_xdp_get_buff_len(ctx);
	if (delta > 0)
		return -1;
	if (delta < 0 && bpf_xdp_adjust_tail(ctx, delta))
		return -1;
	return 0;
}
