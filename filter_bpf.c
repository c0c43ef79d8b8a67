//go:build ignore

// The rrl socket filter: a per-source request limiter over hierarchical CountMin
// sketches, attached to a DNS server's own UDP socket with SO_ATTACH_BPF.
//
// This program, and the XDP program (xdp_bpf.c) built from the same headers under
// bpf/, are the C twin of the Go model in countmin.go and hhh.go: the same
// fixed-point format (fixedpoint.go), the same estimator, hash and node layout, and
// the same decision, so that the same packets, clock readings and random draws give
// the same verdicts and the same sketch cells in both. Any change there is a change
// here, and LAYOUT_VERSION (bpf/common.h) moves with it.
//
// Every packet is judged or dropped. One the parser cannot follow to a UDP header
// (more IPv6 extension headers than it walks, a later fragment, a protocol other
// than UDP, headers cut short) is dropped, counted in COUNTER_DROP_UNFOLLOWED: on a
// UDP socket it is in a form no resolver sends (docs/kernel-filter.md says why), and
// passing it unjudged would let any sender past every limit. An internal failure (a
// map lookup that fails) passes the packet: the filter must never drop legitimate
// traffic through its own fault.

#define RRL_HOOK_SOCKET
#include "bpf/judge.h"
#include "bpf/xdp_dests.h"
#include "bpf/test.h"

char __license[] SEC("license") = "Dual BSD/GPL";

// The verifier and least privilege. The program loads for a process whose only
// capability is CAP_BPF (TestAttachLeastPrivilege). For a process without
// CAP_PERFMON the verifier masks every addition of a register to a pointer against
// Spectre v1, one limit per instruction, and walks the paths a mispredicted branch
// would take; the code keeps to what that allows:
//   - a pointer moves by a register only where the register has the same bounds on
//     every path (clang would merge moves by different constants into one: count
//     and ptr_add write them as immediates);
//   - an index the verifier cannot know (the decay table, the reflection-port
//     bitmap, the limited counters) is used only in a global function, checked on
//     its own after the program: such an index makes the verifier compare states
//     exactly from then on, which the lattice loop's states would not survive;
//   - loops test their counter with < (bounded_loop), and the cookie code walks the
//     packet with helper loads rather than indexing a buffer.
// The XDP program (xdp_bpf.c) is loaded by AttachXDP, which needs CAP_BPF and
// CAP_NET_ADMIN: it runs the same code and keeps to the same rules.

// filter judges one packet with the settings s, counting in c (either may be NULL,
// a failed lookup); now (ns) and test_rnd (a uniform 32-bit draw, or NULL for
// bpf_get_prandom_u32) are arguments so that tests can replay the Go model's inputs.
// It returns the number of bytes to keep: 0 drops the packet.
static __always_inline int filter(struct __sk_buff *skb, struct settings *s, struct counters *c,
				  __u64 now, const __u32 *test_rnd, const int names)
{
	struct packet p = {};
	int parsed = parse(skb, &p);
	// XDP judged and counted this packet on its way in (bpf/xdp_dests.h).
	if (parsed == PARSE_OK && xdp_judges(skb, skb->ifindex, &p))
		return skb->len;

	count(c, COUNTER_SEEN);
	if (!s) {
		count(c, COUNTER_ERROR);
		goto pass;
	}
	if (parsed != PARSE_OK) {
		// Every packet is judged or dropped (see the top of the file).
		count(c, COUNTER_DROP_UNFOLLOWED);
		if (!s->report_only)
			return 0;
		count(c, COUNTER_REPORT_ONLY);
		goto pass;
	}
	__u32 rnd;
	if (judge(skb, s, c, &p, now, test_rnd, &rnd, names) != VERDICT_PASS)
		return 0;
	return skb->len;
pass:
	count(c, COUNTER_PASSED);
	return skb->len;
}

// The names judge (bpf/names.h) is a program of its own, rrl_filter_names, which
// rrl_filter hands the packet to when the settings have names on: the kernel charges
// every socket a filter is attached to for the filter's size (socket option memory),
// not for the programs it calls into, which are loaded once. rrl_filter_names judges
// the whole packet, the names judge included; if the call fails (the array emptied:
// the last user space reference to it closed) rrl_filter judges it without names.
int rrl_filter_names(struct __sk_buff *skb);

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__array(values, int(struct __sk_buff *));
} rrl_names_prog SEC(".maps") = {
	.values = {[0] = (void *)&rrl_filter_names},
};

SEC("socket")
int rrl_filter(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct counters *c = bpf_map_lookup_elem(&rrl_counters, &zero);
	struct settings *s = active_settings();
	if (s && s->names_on)
		bpf_tail_call(skb, &rrl_names_prog, 0);
	return filter(skb, s, c, clock_now(s, c), NULL, 0);
}

SEC("socket")
int rrl_filter_names(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct counters *c = bpf_map_lookup_elem(&rrl_counters, &zero);
	struct settings *s = active_settings();
	return filter(skb, s, c, clock_now(s, c), NULL, 1);
}

// ---- Test-only entry points: never loaded by Attach. ----

SEC("socket")
int rrl_filter_test(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct test_input *in = bpf_map_lookup_elem(&rrl_test_input, &zero);
	if (!in)
		return skb->len;
	struct counters *c = bpf_map_lookup_elem(&rrl_counters, &zero);
	struct settings *s = active_settings();
	return filter(skb, s, c, in->now, &in->rnd, 1);
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

// names_test reads and classifies the query name of a packet as the names judge
// does (bpf/names.h), at the clock of rrl_test_input, into rrl_test_names, so the
// tests can compare the keys and the classification with names.go's.
struct test_names {
	__s32 labels;             // name_read's result: labels, or a negated name_err
	__s32 known;              // name_classify's result (-1: not run or failed)
	__u32 depth;
	__u32 pad;
	__u64 zone, unit;
	__u64 suffix[NAME_MAX_LABELS + 1];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct test_names);
} rrl_test_names SEC(".maps");

SEC("socket")
int rrl_names_test(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct test_input *in = bpf_map_lookup_elem(&rrl_test_input, &zero);
	struct test_names *t = bpf_map_lookup_elem(&rrl_test_names, &zero);
	struct settings *s = active_settings();
	if (!in || !t || !s)
		return 0;
	t->known = -1;
	struct packet p = {};
	if (parse(skb, &p) != PARSE_OK) {
		t->labels = -100;
		return 0;
	}
	int labels = name_read(skb, name_where(&p), s->name_seed);
	t->labels = labels;
	if (labels < 0)
		return 1;
	t->known = name_classify(labels, in->now);
	struct name_scratch *sc = bpf_map_lookup_elem(&rrl_name_scratch, &zero);
	if (!sc)
		return 0;
	t->zone = sc->zone;
	t->unit = sc->unit;
	t->depth = sc->depth;
	for (int i = 0; i <= NAME_MAX_LABELS; i++)
		t->suffix[i] = sc->suffix[i];
	return 1;
}
