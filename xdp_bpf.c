//go:build ignore

// The rrl XDP program: the socket filter's judgement (filter_bpf.c, from the same
// headers under bpf/) at the driver, before the kernel builds a socket buffer, with
// the pinned filter's maps (AttachXDP, xdp.go). It judges only UDP to the
// destinations it was loaded for (xdp_ports); everything else
// passes untouched and uncounted. A share of the request-limited queries (the
// configuration's slip-ratio) is answered with a truncated response by XDP_TX.
//
// Any internal failure passes the packet, as in the socket filter.
//
// It loads with CAP_BPF (AttachXDP adds CAP_NET_ADMIN), without CAP_PERFMON: it keeps
// to the rules filter_bpf.c lists, and to those only packet access meets. For such a
// process the verifier refuses to compare a packet pointer with NULL (net_header,
// bpf/ctx.h, says whether the bytes are in place instead of returning NULL) or to
// subtract one packet pointer from another (slip_reply asks bpf_xdp_get_buff_len);
// and one index of unknown value in the program, such as the port bitmap's, makes it
// compare every later state exactly (xdp_port is a global function for that).

#define RRL_HOOK_XDP
#include "bpf/judge.h"
#include "bpf/xdp_dests.h"
#include "bpf/slip.h"
#include "bpf/test.h"

char __license[] SEC("license") = "Dual BSD/GPL";

// The destinations of the one interface this program is attached to, set when
// AttachXDP loads it (rrl_xdp_dests lists the same for the socket filter): a bitmap
// of the UDP ports it judges and whether it judges every address on them (else only
// those rrl_xdp_dests lists). Constants: a packet looks nothing up to learn them.
const volatile __u64 xdp_ports[65536 / 64];
const volatile __u32 xdp_any_addr;

// xdp_port reports whether this program judges UDP to port. A global function, which
// the verifier checks on its own: the bitmap is indexed by a value it cannot know,
// and for a process without CAP_PERFMON one such index in the program makes it
// compare every later state exactly (see node_count), which the program's paths do
// not survive.
__noinline int xdp_port(__u32 port)
{
	return (xdp_ports[(port >> 6) & 1023] >> (port & 63)) & 1;
}

// judged reports whether this program judges the packet p.
static __always_inline int judged(struct xdp_md *ctx, const struct packet *p)
{
	if (!xdp_port(p->dport))
		return 0;
	if (xdp_any_addr)
		return 1;
	// Some addresses only: the lookup the socket filter makes. (It keeps both maps
	// the program's own, for DetachXDP to find them from the program.)
	return xdp_judges(ctx, ctx->ingress_ifindex, p);
}

// slips reports whether a query refused with the draw rnd is answered with a
// truncated response: one in ratio, on bits of the draw the refusal and the sampling
// of rrl_limited (its low bits) do not decide.
static __always_inline int slips(__u32 rnd, __u32 ratio)
{
	return ratio && ((rnd >> 8) & 0xffff) * ratio < 0x10000;
}

// xdp_filter judges one frame; in (NULL in production) replays a test's clock and
// draw.
static __always_inline int xdp_filter(struct xdp_md *ctx, const struct test_input *in)
{
	struct packet p = {};
	if (parse(ctx, &p) != PARSE_OK || !judged(ctx, &p))
		return XDP_PASS;
	__u32 zero = 0;
	struct counters *c = bpf_map_lookup_elem(&rrl_counters, &zero);
	struct settings *s = active_settings();
	__u64 now = in ? in->now : clock_now(s, c);
	count(c, COUNTER_SEEN);
	if (!s) {
		count(c, COUNTER_ERROR);
		count(c, COUNTER_PASSED);
		return XDP_PASS;
	}
	__u32 rnd = 0;
	switch (judge(ctx, s, c, &p, now, in ? &in->rnd : NULL, &rnd, 1)) {
	case VERDICT_PASS:
		return XDP_PASS;
	case VERDICT_LIMITED:
		if (slips(rnd, s->slip_ratio) && !slip_reply(ctx, p.dns_off)) {
			count(c, COUNTER_SLIPPED);
			return XDP_TX;
		}
	}
	return XDP_DROP;
}

SEC("xdp")
int rrl_xdp(struct xdp_md *ctx)
{
	return xdp_filter(ctx, NULL);
}

// ---- Test-only entry point: never loaded by AttachXDP. ----

SEC("xdp")
int rrl_xdp_test(struct xdp_md *ctx)
{
	__u32 zero = 0;
	struct test_input *in = bpf_map_lookup_elem(&rrl_test_input, &zero);
	if (!in)
		return XDP_PASS;
	return xdp_filter(ctx, in);
}
