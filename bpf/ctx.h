// The program's context and how packet bytes are read from it: the only part of the
// parsing and judging code that differs between the hooks. Offsets are from the
// network (IP) header in both.
//
// Socket filter (RRL_HOOK_SOCKET): a __sk_buff, read relative to the network header
// (BPF_HDR_START_NET): on a live UDP socket the packet data starts at the UDP header,
// under BPF_PROG_TEST_RUN at the IP header, and only network-relative offsets are
// right in both. The IP version is skb->protocol, not the socket's family, since a
// dual-stack AF_INET6 socket also receives IPv4 packets.
//
// XDP (RRL_HOOK_XDP): an xdp_md whose data starts at the Ethernet header; the IP
// version is the Ethernet type. A VLAN tag or anything else is no IP this program
// parses: such frames pass untouched, and the socket filter judges what of them
// reaches the server.
#pragma once

#include "common.h"

#if defined(RRL_HOOK_XDP)

#define rrl_ctx xdp_md

static __always_inline int load_net(struct xdp_md *ctx, __u32 off, void *to, __u32 len)
{
	return bpf_xdp_load_bytes(ctx, ETH_HLEN + off, to, len);
}

// net_header points *h at the len bytes from the network header: in place when the
// frame holds them (XDP reads the common headers without a helper call), else at buf
// after copying them there; it returns nonzero when the frame is shorter. It never
// returns a pointer that may be NULL: a process without CAP_PERFMON may not compare
// a packet pointer with NULL (the verifier: "pointer comparison prohibited").
static __always_inline int net_header(struct xdp_md *ctx, void *buf, __u32 len, void **h)
{
	void *data = (void *)(long)ctx->data + ETH_HLEN, *end = (void *)(long)ctx->data_end;
	if (data + len <= end) {
		*h = data;
		return 0;
	}
	*h = buf;
	return load_net(ctx, 0, buf, len);
}

static __always_inline __be16 net_protocol(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return 0;
	return eth->h_proto;
}

#elif defined(RRL_HOOK_SOCKET)

#define rrl_ctx __sk_buff

static __always_inline int load_net(struct __sk_buff *skb, __u32 off, void *to, __u32 len)
{
	return bpf_skb_load_bytes_relative(skb, off, to, len, BPF_HDR_START_NET);
}

// net_header always copies for a socket filter, whose packet data may start at the
// UDP header: every read goes through load_net.
static __always_inline int net_header(struct __sk_buff *skb, void *buf, __u32 len, void **h)
{
	*h = buf;
	return load_net(skb, 0, buf, len);
}

static __always_inline __be16 net_protocol(struct __sk_buff *skb)
{
	return skb->protocol;
}

#else
#error "define RRL_HOOK_SOCKET or RRL_HOOK_XDP before including the rrl headers"
#endif
