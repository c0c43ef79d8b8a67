// Live settings (filter_settings.go): the double-buffered configuration and the exempt tries.
#pragma once

#include "sketch.h"

// One node of a family's lattice, as the packets of that family judge it. The node's
// key is (source hi & mask_hi, (source lo & mask_lo) | (source port & port_mask)): a
// prefix of the source address for a level node, the source port for the port node
// (masks 0, port_mask 0xffff), nothing for the total node (all masks 0).
struct step {
	__u64 mask_hi;
	__u64 mask_lo;
	__u64 port_mask;
	fp_t trip;                // smallest count whose arrival_rate reaches limit
	fp_t limit;
	__u32 node;
	__u32 limited;            // this level's limited counter: COUNTER_LIMITED0 + limited
};

// Live settings, written by the Go side (settings.go) and read on every packet.
//
// rrl_settings holds three of them: entry 0 is a header whose slot field names the
// slot in force, entries 1 and 2 are the two slots. A packet reads the header and
// then only the slot it names (active_settings), and the exempt tries' entries of
// that slot. Go writes a new configuration into the other slot and its exempt
// entries, then flips the header's slot (one byte: a packet reads it whole, old or
// new); it rewrites a slot only a grace period after it stopped being in force, when
// no packet that read the old slot number can still be running. So every packet is
// judged entirely by one configuration, never by a mix of two.
struct settings {
	__u32 layout_version;
	__u8 report_only;
	__u8 has_exempt4;         // rrl_exempt4 holds prefixes of this slot: look sources up
	__u8 has_exempt6;
	__u8 slot;                // header: the slot in force (0 or 1); a slot: its own number
	__u32 slip_ratio;         // XDP answers one in slip_ratio request-limited queries (0: none)
	__u8 names_on;            // read query names, classify and judge them (bpf/names.h)
	__u8 pad[3];
	__u64 generation;         // header: flips so far (Go's readers check it did not move)
	__u64 flipped_ns;         // header: CLOCK_MONOTONIC of the last flip
	__u64 seed;
	__u64 seed_mix0;          // mix64(seed), the hash's first round for hi == 0
	__u64 tick_ns;            // length of a jiffy (the coarse clock's resolution); 0: unknown
	__u64 reflection_blocks;  // bit b: reflection_ports lists a port in b*1024 .. b*1024+1023
	__u64 name_seed;          // nameSeed(seed): keys the query names and the names tables
	fp_t names_limit;         // the unknown tier's level per zone (FP_MAX: no limit)
	fp_t names_trip;          // tripCount(names_limit)
	__u32 steps[2];           // active nodes of IPv6 ([0]) and IPv4 ([1]) sources
	struct step step[2][MAX_STEPS]; // in judging order: levels finest first, port, total
	__u64 reflection_ports[65536 / 64]; // bitmap of source ports to drop
};

// The exempt tries hold the prefixes of both settings slots, told apart by the slot
// byte that precedes the address: an entry's prefixlen is 8 plus its prefix length,
// so a lookup matches only entries of the slot it names.
struct exempt4_key {
	__u32 prefixlen;
	__u8 slot;
	__u8 addr[4];
	__u8 pad[3];
};

struct exempt6_key {
	__u32 prefixlen;
	__u8 slot;
	__u8 addr[16];
	__u8 pad[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 3);   // the header, then the two slots
	__type(key, __u32);
	__type(value, struct settings);
} rrl_settings SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 2048); // 1024 prefixes for each slot
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct exempt4_key);
	__type(value, __u8);
} rrl_exempt4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 2048); // 1024 prefixes for each slot
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct exempt6_key);
	__type(value, __u8);
} rrl_exempt6 SEC(".maps");

// family_steps returns the first of the steps of a family (IPv4 if v4, else IPv6)
// and sets *n to their number, without an addition the verifier would mask (ptr_add).
static __always_inline const struct step *family_steps(const struct settings *s, __u32 v4, __u32 *n)
{
	const struct step *st = s->step[0];
	__u32 steps = s->steps[0];
	if (v4) {
		ptr_add(st, sizeof(s->step[0]));
		steps = s->steps[1];
	}
	*n = steps;
	return st;
}

// active_settings returns the settings slot in force (see struct settings), NULL
// when a lookup fails.
static __always_inline struct settings *active_settings(void)
{
	__u32 key = 0;
	struct settings *h = bpf_map_lookup_elem(&rrl_settings, &key);
	if (!h)
		return NULL;
	key = 1 + (h->slot & 1);
	return bpf_map_lookup_elem(&rrl_settings, &key);
}
