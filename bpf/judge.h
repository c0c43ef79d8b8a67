// The decision: stateless checks, then the lattice of request limits.
#pragma once

#include "counters.h"
#include "cookie.h"
#include "limited.h"
#include "names.h"

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

// reflection_port reports whether the settings slot slot lists port among the
// source ports to drop. A global function that looks the slot up itself: its index
// into the bitmap is a value the verifier cannot know (see node_count).
__noinline int reflection_port(__u32 slot, __u32 port)
{
	__u32 key = 1 + (slot & 1);
	struct settings *s = bpf_map_lookup_elem(&rrl_settings, &key);
	if (!s)
		return 0;
	return (s->reflection_ports[(port >> 6) & 1023] >> (port & 63)) & 1;
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

// node_passes decides for a node whose count reached its trip count: the packet
// passes with probability limit / rate. A subprogram: only packets of sources over a
// limit call it, so the lattice loop stays small.
static __noinline int node_passes(struct judgement *j, fp_t min, fp_t limit)
{
	return fp_mul_frac(arrival_rate(min), (fp_t)draw(j)) < limit;
}

// Verdicts of judge.
enum verdict {
	VERDICT_PASS,
	VERDICT_DROP,     // a stateless check: never a query to this server
	VERDICT_LIMITED,  // refused by the request limiter
};

// judge judges the packet p, parsed from ctx, with the settings s, counting in c (may
// be NULL, a failed lookup) every outcome but COUNTER_SEEN, which the hook counts
// before. now (ns) and test_rnd (a uniform 32-bit draw, or NULL for
// bpf_get_prandom_u32) are arguments so that tests can replay the Go model's inputs;
// *rnd is the draw a refusal took, for the hook's own use (a slip). In report-only
// mode every refusal is counted under its reason and the verdict is VERDICT_PASS.
//
// names (a constant) compiles the names judge in: it runs when the settings have
// names_on. The socket filter keeps it out of the program every socket is charged for
// and runs it in a program of its own (filter_bpf.c).
static __always_inline int judge(struct rrl_ctx *ctx, struct settings *s, struct counters *c,
				 struct packet *p, __u64 now, const __u32 *test_rnd, __u32 *rnd,
				 const int names)
{
	int verdict = VERDICT_DROP;
	fp_t zone_count = 0;      // the zone sketch's estimate for an unknown name, else 0

	// Stateless checks: what can never be a query to this server.
	if (p->dns_len < MIN_DNS_LEN) {
		count(c, COUNTER_DROP_SHORT);
		goto drop;
	}
	if (p->dns_flags & 0x80) {
		count(c, COUNTER_DROP_RESPONSE);
		goto drop;
	}
	// The bitmap is read only for ports in a block that lists one: queries from
	// ephemeral ports, in blocks the default list leaves empty, touch no line of it.
	if (((s->reflection_blocks >> (p->sport >> 10)) & 1) && reflection_port(s->slot, p->sport)) {
		count(c, COUNTER_DROP_REFLECTION);
		goto drop;
	}
	if (is_exempt(s, p)) {
		count(c, COUNTER_EXEMPT);
		goto pass;
	}

	// The lattice: every active node of the packet counts it, then it passes only if
	// every node lets it through for the one draw, which is probability
	// min(limit/rate) over the nodes. The first node that refuses is the decider.
	struct judgement j = {.test_rnd = test_rnd, .now = now};
	__u32 steps;
	const struct step *st = family_steps(s, p->v4, &steps);
	int refused = 0;
	__u64 decider = 0;        // the refusing step's limited counter
	// A query with a valid server cookie comes from the address it claims: it is
	// judged only in its own address's node, not in the groups it shares.
	int proven = 0;
	if (may_hold_cookie(p)) {
		int v = check_cookie(ctx, (__u64)p->dns_off << 32 | p->dns_len << 1 | p->v4, now, p->hi, p->lo);
		if (v == COOKIE_PROVEN && (!steps || own_address_step(st, p->v4))) {
			steps = steps ? 1 : 0;
			proven = 1;
		} else if (v == COOKIE_INVALID) {
			count(c, COUNTER_COOKIE_INVALID);
		}
	}
	// The names judge (docs/names.md): an unknown name passes its zone's level with
	// the draw rotated by 16 bits, close to independent of the lattice's test; a
	// query it refuses is dropped without being counted in the lattice.
	if (names && s->names_on) {
		zone_count = names_count(ctx, name_where(p), now, s->slot);
		if (zone_count && zone_count >= s->names_trip) {
			__u32 d = draw(&j);
			d = d << 16 | d >> 16;
			if (fp_mul_frac(arrival_rate(zone_count), d) >= s->names_limit) {
				count(c, COUNTER_NAMES_LIMITED);
				goto drop;
			}
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
		if (i)
			ptr_add(st, sizeof(*st));
		__u32 node = st->node;
		if (node >= NUM_NODES) {
			count(c, COUNTER_ERROR);
			goto pass;
		}
		__u64 hi = p->hi & st->mask_hi;
		__u64 lo = (p->lo & st->mask_lo) | (p->sport & st->port_mask);
		if (hi != prev_hi) {
			prev_hi = hi;
			h1 = mix64(s->seed ^ hi);
		}
		// Written before the call: for a process without CAP_PERFMON the verifier
		// lets a global function read only initialised stack.
		fp_t min = 0;
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
		if (c)
			count_limited(decider);
		verdict = VERDICT_LIMITED;
		*rnd = j.rnd;
		// The draw refused the packet, so its high bits lean towards 1; its
		// low bits are still uniform and pick one drop in LIMITED_SAMPLE to
		// record. Checked here: the other drops do not pay for the call.
		if (!(j.rnd & (LIMITED_SAMPLE - 1)))
			record_limited(ctx, s, decider, &j);
		goto drop;
	}
	if (proven)
		count(c, COUNTER_COOKIE_PASSED);
	goto pass;

drop:
	// In report-only mode every drop is counted under its reason and passed.
	if (!s->report_only)
		return verdict;
	count(c, COUNTER_REPORT_ONLY);
pass:
	if (zone_count)
		count(c, COUNTER_NAMES_UNKNOWN_PASSED);
	count(c, COUNTER_PASSED);
	return VERDICT_PASS;
}
