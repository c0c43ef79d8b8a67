// Which packets XDP judges (xdp.go): both programs read it, so that each limit
// applies once. The XDP program judges UDP to the destinations listed for the
// interface it runs on; the socket filter passes, uncounted, the packets that arrived
// on such an interface for such a destination, since XDP has judged them already.
#pragma once

#include "parse.h"

// XDP_DEST_ANY in the flags of a port's own entry (the zero address): every
// destination address is judged; otherwise only those with an entry of their own.
#define XDP_DEST_ANY 1
#define XDP_DESTS 1024

struct xdp_dest_key {
	__u32 ifindex;
	__u16 port;
	__u16 pad;
	__u8 addr[16];            // IPv6, or IPv4-mapped; zero: the port's own entry
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, XDP_DESTS);
	__type(key, struct xdp_dest_key);
	__type(value, __u32);
} rrl_xdp_dests SEC(".maps");

// Entry 0: the number of ports' own entries in rrl_xdp_dests, so that the socket
// filter looks nothing up while no XDP program is attached.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} rrl_xdp_state SEC(".maps");

// xdp_dest_addr looks up the packet's destination address among the listed ones of
// the port in k. A subprogram: only ports restricted to some addresses need it. k is
// never NULL, and is not tested: the verifier refuses to compare a pointer to the
// stack for a process without CAP_PERFMON.
static __noinline int xdp_dest_addr(struct rrl_ctx *ctx, struct xdp_dest_key *k)
{
	if (net_protocol(ctx) == bpf_htons(ETH_P_IP)) {
		__u8 a[4];
		if (load_net(ctx, offsetof(struct iphdr, daddr), a, 4))
			return 0;
		k->addr[10] = 0xff;
		k->addr[11] = 0xff;
		__builtin_memcpy(&k->addr[12], a, 4);
	} else if (net_protocol(ctx) == bpf_htons(ETH_P_IPV6)) {
		if (load_net(ctx, offsetof(struct ipv6hdr, daddr), k->addr, 16))
			return 0;
	} else {
		return 0;
	}
	return bpf_map_lookup_elem(&rrl_xdp_dests, k) != NULL;
}

// xdp_judges reports whether XDP judges the packet p, parsed from ctx, which arrived
// on the interface ifindex.
static __always_inline int xdp_judges(struct rrl_ctx *ctx, __u32 ifindex, const struct packet *p)
{
	__u32 zero = 0;
	__u32 *n = bpf_map_lookup_elem(&rrl_xdp_state, &zero);
	if (!n || !*n)
		return 0;
	struct xdp_dest_key k = {.ifindex = ifindex, .port = p->dport};
	__u32 *flags = bpf_map_lookup_elem(&rrl_xdp_dests, &k);
	if (!flags)
		return 0;
	if (*flags & XDP_DEST_ANY)
		return 1;
	return xdp_dest_addr(ctx, &k);
}
