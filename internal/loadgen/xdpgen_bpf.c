//go:build ignore

// A flood generator in the kernel: run under BPF_PROG_TEST_RUN with
// BPF_F_TEST_XDP_LIVE_FRAMES, it sends the frame it is given out of the interface the
// run names (XDP_TX), Repeat times, at a rate no socket can reach. It may vary the
// frame's source address and port from a per-CPU counter, so that one run is many
// sources; checksums are updated incrementally, so the receiver's stack accepts what
// it sends.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char __license[] SEC("license") = "Dual BSD/GPL";

// gen_config says what varies: the low bits of the source address under addr_mask
// (of its last 32 bits, IPv6 too) and of the source port under port_mask, each from
// a hash of the frame's number.
struct gen_config {
	__u32 addr_mask;
	__u16 port_mask;
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gen_config);
} gen_settings SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} gen_sent SEC(".maps");

// Per CPU, the packets xdp_drop53 dropped.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} drop_count SEC(".maps");

static __always_inline __u64 mix64(__u64 x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return x;
}

// csum_replace4 updates a 16-bit ones' complement checksum for a 32-bit word
// changing from old to new (RFC 1624).
static __always_inline void csum_replace4(__sum16 *sum, __be32 old, __be32 new)
{
	__u32 s = (__u16)~*sum;
	s += (__u16)~old + (__u16)~(old >> 16) + (__u16)new + (__u16)(new >> 16);
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	*sum = ~s;
}

SEC("xdp")
int xdp_flood(struct xdp_md *ctx)
{
	__u32 zero = 0;
	__u64 *sent = bpf_map_lookup_elem(&gen_sent, &zero);
	struct gen_config *cfg = bpf_map_lookup_elem(&gen_settings, &zero);
	if (!sent || !cfg)
		return XDP_ABORTED;
	__u64 n = ++*sent;
	if (!cfg->addr_mask && !cfg->port_mask)
		return XDP_TX;
	__u64 r = mix64(n);
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return XDP_ABORTED;
	__be32 *saddr;
	__sum16 *ipsum = NULL, *udpsum;
	struct udphdr *udp;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		udp = (void *)(ip + 1);
		if ((void *)(udp + 1) > end)
			return XDP_ABORTED;
		saddr = &ip->saddr;
		ipsum = &ip->check;
	} else {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		udp = (void *)(ip6 + 1);
		if ((void *)(udp + 1) > end)
			return XDP_ABORTED;
		saddr = &ip6->saddr.in6_u.u6_addr32[3];
	}
	udpsum = &udp->check;
	__be32 old = *saddr;
	__be32 new = bpf_htonl((bpf_ntohl(old) & ~cfg->addr_mask) | ((__u32)r & cfg->addr_mask));
	*saddr = new;
	if (ipsum)
		csum_replace4(ipsum, old, new);
	if (*udpsum)
		csum_replace4(udpsum, old, new);
	__be16 oldp = udp->source;
	__be16 newp = bpf_htons((bpf_ntohs(oldp) & ~cfg->port_mask) | ((__u16)(r >> 32) & cfg->port_mask));
	udp->source = newp;
	if (*udpsum)
		csum_replace4(udpsum, oldp, newp);
	return XDP_TX;
}

// xdp_drop is the floor of what discarding costs: it drops UDP to port 53 and passes
// everything else, counting what it dropped.
SEC("xdp")
int xdp_drop53(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return XDP_PASS;
	struct udphdr *udp;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > end || ip->ihl != 5 || ip->protocol != IPPROTO_UDP)
			return XDP_PASS;
		udp = (void *)(ip + 1);
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > end || ip6->nexthdr != IPPROTO_UDP)
			return XDP_PASS;
		udp = (void *)(ip6 + 1);
	} else {
		return XDP_PASS;
	}
	if ((void *)(udp + 1) > end || udp->dest != bpf_htons(53))
		return XDP_PASS;
	__u32 zero = 0;
	__u64 *dropped = bpf_map_lookup_elem(&drop_count, &zero);
	if (dropped)
		(*dropped)++;
	return XDP_DROP;
}

// The rounds of arithmetic xdp_drop53_work spends on each
// packet it drops.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} work_rounds SEC(".maps");

#define MAX_WORK_ROUNDS 4096

// xdp_drop53_work is xdp_drop53 spending work_rounds rounds of arithmetic on registers
// (a mix of the source port) on each packet it drops, touching no memory: a program
// as slow as another but with none of its memory traffic, to tell a program's own
// time from what it costs the rest of the receiving path.
SEC("xdp")
int xdp_drop53_work(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct udphdr *udp = (void *)(ip + 1);
	if ((void *)(udp + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP) || ip->ihl != 5 ||
	    ip->protocol != IPPROTO_UDP || udp->dest != bpf_htons(53))
		return XDP_PASS;
	__u32 zero = 0;
	__u32 *rounds = bpf_map_lookup_elem(&work_rounds, &zero);
	__u64 *dropped = bpf_map_lookup_elem(&drop_count, &zero);
	if (!rounds || !dropped)
		return XDP_PASS;
	__u32 n = *rounds;
	__u64 x = udp->source;
	for (__u32 i = 0; i < MAX_WORK_ROUNDS; i++) {
		if (i >= n)
			break;
		x = mix64(x);
	}
	// Never 0 in practice; the sum keeps the work from being optimised away.
	*dropped += 1 + (x == 0);
	return XDP_DROP;
}

// xdp_pass passes everything: a veth has NAPI (and threaded NAPI can be measured)
// only with an XDP program attached, so the socket filter's runs attach this one.
SEC("xdp")
int xdp_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}
