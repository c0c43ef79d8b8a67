// CountMin sketches of decaying rates (countmin.go) and the node layout (hhh.go).
#pragma once

#include "fixedpoint.h"

#define MAX_LEVELS 5
#define NODE_IPV4_FIRST 0
#define NODE_IPV6_FIRST MAX_LEVELS
#define NODE_PORT (2 * MAX_LEVELS)
#define NODE_TOTAL (NODE_PORT + 1)
#define NUM_NODES (NODE_TOTAL + 1)
#define MAX_STEPS (MAX_LEVELS + 2)

#define SKETCH_DEPTH 2
#define SKETCH_WIDTH_SHIFT 11
#define SKETCH_WIDTH (1 << SKETCH_WIDTH_SHIFT)
// The zone sketch of the names judge (docs/names.md) follows the lattice's nodes in
// rrl_cells, a block of the same shape: it is no node of the lattice (no step names
// it), but it is counted and read as one.
#define NODE_ZONES NUM_NODES
#define NUM_CELLS ((NUM_NODES + 1) * SKETCH_DEPTH * SKETCH_WIDTH)

#define HALF_LIFE_NS 200000000ULL
#define DECAY_FRAC_BITS 22
#define DECAY_TABLE_SHIFT 6
#define DECAY_INTERP_BITS (DECAY_FRAC_BITS - DECAY_TABLE_SHIFT)
#define DECAY_SCALE 90071993ULL
#define DECAY_HORIZON (32 * HALF_LIFE_NS)
#define RATE_SCALE 14885222359ULL

// One CountMin cell: a decayed packet count (fixed point) and the time of its last
// update in nanoseconds.
struct cell {
	__u64 count;
	__u64 last;
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

// node_count counts the packet in node's sketch, where its key hashes to h, and sets
// *min to the smaller of its cells after the arrival (the estimate). It returns -1
// when a cell cannot be looked up (an internal error), else 0.
//
// A global function, so that the verifier checks it once, on its own and after the
// program that calls it: the decay table is indexed by a value it cannot know, and
// for a process without CAP_PERFMON such an index makes it compare every later state
// exactly, which the lattice loop's states would not survive (TestAttachLeastPrivilege).
__noinline int node_count(__u32 node, __u64 h, __u64 now, fp_t *min)
{
	if (!min)
		return -1;
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
