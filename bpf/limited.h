// The groups the request limiter refused lately (filter_limited.go).
#pragma once

#include "counters.h"
#include "parse.h"

// The limited-groups map (rrl_limited) keeps this many groups, least recently
// recorded out first; a drop is recorded with probability 1 / LIMITED_SAMPLE.
#define LIMITED_GROUPS 4096
#define LIMITED_SAMPLE 16

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

// record_limited notes a sampled drop in rrl_limited: of the packet's group at the
// step whose limited counter is limited (the decider), with that step's estimate for
// it, read back from the cells the packet was just counted in. A subprogram on the
// drop path, which parses the packet again rather than have the lattice loop keep
// the group: passed packets pay nothing for this. Concurrent records of one group
// may interleave their fields; drops is added atomically, the rest is for display.
static __noinline void record_limited(struct rrl_ctx *ctx, const struct settings *s, __u64 limited,
				      const struct judgement *j)
{
	struct packet p = {};
	if (parse(ctx, &p) != PARSE_OK)
		return;
	__u32 steps;
	const struct step *st = family_steps(s, p.v4, &steps);
	int found = 0;
#pragma clang loop unroll(disable)
	for (__u32 i = 0; i < MAX_STEPS; i++) {
		if (i >= steps)
			break;
		if (i)
			ptr_add(st, sizeof(*st));
		if (st->limited == limited) {
			found = 1;
			break;
		}
	}
	if (!found || st->node >= NUM_NODES)
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
