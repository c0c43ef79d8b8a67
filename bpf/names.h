// Query names (names.go, names_learn.go, docs/names.md): the question's name read
// and keyed as readQName does, classified against the two tables the Go side learns
// from the server's responses, and the names judge's count in the zone sketch.
#pragma once

#include "cookie.h"

// names.go: the longest name on the wire and the most labels it can have.
#define NAME_MAX_WIRE 255
#define NAME_MAX_LABELS ((NAME_MAX_WIRE - 1) / 2)
#define NAME_MUL 0x9e3779b97f4a7c15ULL
// The question's bytes a read looks at: the name and QTYPE and QCLASS.
#define NAME_SCAN (NAME_MAX_WIRE + 4)
#define NAME_SCAN_MASK 255

// names_learn.go: the tables' shape and their entries' fields.
#define NAME_WAYS 4
#define NAME_BUCKET_SHIFT 14
#define APEX_BUCKET_SHIFT 8
#define NAME_GEN_SHIFT 35
#define NAME_GEN_LIVE 4
#define NAME_EXISTS 1
#define NAME_WILDCARD 2
#define APEX_DEPTH_MASK 0x3f
#define APEX_PINNED 0x40
#define NAME_WILD_UP 4

// Why a name does not read (nameErr in names.go); name_read returns them negated.
enum name_err {
	NAME_OK,
	NAME_SHORT,
	NAME_QUESTIONS,
	NAME_POINTER,
	NAME_LABEL_TYPE,
	NAME_TOO_LONG,
};

// One bucket of a table: NAME_WAYS entries of 64 bits (names_learn.go's layout: tag
// in bits 63..24, value in 23..16, generation in 15..0; 0 is an empty slot).
struct name_bucket {
	__u64 w[NAME_WAYS];
};

// The two tables the Go side writes in place (names_learn.go, filter_names.go): a
// memory map of each, written with atomic compare-and-swap, so that learning a name
// costs no system call; the program only reads them. rrl_apexes has one more
// bucket, after the table: its first word is the mask of the depths at which apexes
// exist (nameLearner.depths).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1 << NAME_BUCKET_SHIFT);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct name_bucket);
} rrl_names SEC(".maps");

#define APEX_DEPTHS_BUCKET (1 << APEX_BUCKET_SHIFT)

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, (1 << APEX_BUCKET_SHIFT) + 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct name_bucket);
} rrl_apexes SEC(".maps");

// Per CPU: the question's bytes, read in one load (indexes are masked to
// NAME_SCAN_MASK, so an 8-byte read runs into the slack), the key of every suffix
// of the name (qname.suffix: first the label hashes, then the chain over them in
// place), and what name_classify says of it.
struct name_scratch {
	// The state of name_read's and name_zone's loops, kept here rather than in a
	// context on the stack, whose every field a process without CAP_PERFMON pays a
	// speculation barrier to write. name_turn's: i the current length byte from the
	// end of the header, labels the labels read, seed and len (the message's length
	// after its header) its inputs, err a negated name_err (0 when the root was
	// read). name_link's: chain the last suffix's key, base the turn bpf_loop's
	// turn 0 is. zone_turn's (struct name_apexes).
	__u64 i, labels, seed, len;
	__s64 err;
	__u64 chain;
	struct name_apexes {
		__u64 m, labels, gen, depth;
	} apexes;
	__u64 index;              // suffix_at's index
	__u8 b[NAME_SCAN_MASK + 1 + 8];
	__u64 suffix[NAME_MAX_LABELS + 1];
	__u64 zone;
	__u64 unit;
	__u32 depth;              // the zone's apex's labels (0: the root)
	__u32 known;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct name_scratch);
} rrl_name_scratch SEC(".maps");

// The names judge's constant map keys, read from the object's read-only data rather
// than written to the stack: for a process without CAP_PERFMON the verifier puts a
// speculation barrier after a write to a stack slot it last saw uninitialised, and a
// key written to the stack is such a write at every call of a function.
static const __u32 name_key_zero = 0;
static const __u32 name_key_depths = APEX_DEPTHS_BUCKET;

// lower8 folds the ASCII capitals among the eight bytes of w (rrl.go's lower8).
static __always_inline __u64 lower8(__u64 w)
{
	const __u64 ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
	__u64 low7 = w & ~highs;
	__u64 ge_a = low7 + (0x80 - 'A') * ones;
	__u64 gt_z = low7 + (0x7f - 'Z') * ones;
	__u64 upper = (ge_a & ~gt_z) & ~w & highs;
	return w | upper >> 2;
}

// name_word hashes into h the label's word j bytes into it (the label l bytes long
// from at in the scratch), zero padded past its end.
static __always_inline __u64 name_word(struct name_scratch *sc, __u64 h, __u64 at, __u64 l, __u64 j)
{
	__u64 x;
	__builtin_memcpy(&x, &sc->b[(at + j) & NAME_SCAN_MASK], sizeof(x));
	x = le64(x);
	if (l - j < 8)
		x &= (1ULL << ((l - j) * 8)) - 1;
	h = (h ^ lower8(x)) * NAME_MUL;
	return h ^ h >> 31;
}

// name_turn is one turn of name_read's walk: it reads a length byte and hashes the
// whole label after it, 8 bytes at a time, zero padded (labelHash in names.go). Its
// state between turns (the scratch's i and labels) is kept in memory, and bpf_loop
// calls it, so that the verifier checks one turn rather than every sequence of label
// lengths. A label is at most 63 bytes, 8 words: the words are written out, each
// behind a test of the label's length.
static long name_turn(__u64 k, void *arg)
{
	struct name_scratch *sc = bpf_map_lookup_elem(&rrl_name_scratch, &name_key_zero);
	if (!sc)
		return 1;
	__u64 i = sc->i, len = sc->len;
	if (i >= len) {
		sc->err = -NAME_SHORT;
		return 1;
	}
	__u64 l = sc->b[i & NAME_SCAN_MASK];
	if (l == 0) {
		sc->err = 0;
		return 1;
	}
	if (l & 0xc0) {
		sc->err = (l >> 6) == 3 ? -NAME_POINTER : -NAME_LABEL_TYPE;
		return 1;
	}
	if (i + l + 2 > NAME_MAX_WIRE) {
		sc->err = -NAME_TOO_LONG;
		return 1;
	}
	if (i + 1 + l > len) {
		sc->err = -NAME_SHORT;
		return 1;
	}
	// The next length byte's index stored now, not kept in a register through the
	// hashing: a register spilled costs a speculation barrier without CAP_PERFMON.
	__u64 at = i + 1;
	sc->i = at + l;
	barrier();
	__u64 h = sc->seed ^ l;
	h = name_word(sc, h, at, l, 0);
	if (l > 8)
		h = name_word(sc, h, at, l, 8);
	if (l > 16)
		h = name_word(sc, h, at, l, 16);
	if (l > 24)
		h = name_word(sc, h, at, l, 24);
	if (l > 32)
		h = name_word(sc, h, at, l, 32);
	if (l > 40)
		h = name_word(sc, h, at, l, 40);
	if (l > 48)
		h = name_word(sc, h, at, l, 48);
	if (l > 56)
		h = name_word(sc, h, at, l, 56);
	__u64 labels = sc->labels;
	sc->suffix[labels & NAME_MAX_LABELS] = h;
	sc->labels = labels + 1;
	return 0;
}

// name_link_one links the suffix j labels down from the name: mix64(the suffix
// above ^ its label's hash).
static __always_inline void name_link_one(struct name_scratch *sc, __u64 j)
{
	j &= NAME_MAX_LABELS;
	__u64 s = mix64(sc->chain ^ sc->suffix[j]);
	sc->chain = s;
	sc->suffix[j] = s;
}

// name_link is turn k of the chain, from the root down: it links the four suffixes
// 4k+1 to 4k+4 labels up from the root, and stops at the name. Four a turn, written
// out: a turn's call costs more than a link.
static long name_link(__u64 k, void *arg)
{
	struct name_scratch *sc = bpf_map_lookup_elem(&rrl_name_scratch, &name_key_zero);
	if (!sc)
		return 1;
	__u64 labels = sc->labels, up = 4 * k;
	if (up >= labels)
		return 1;
	name_link_one(sc, labels - 1 - up);
	if (up + 1 >= labels)
		return 1;
	name_link_one(sc, labels - 2 - up);
	if (up + 2 >= labels)
		return 1;
	name_link_one(sc, labels - 3 - up);
	if (up + 3 >= labels)
		return 1;
	name_link_one(sc, labels - 4 - up);
	return 0;
}

// name_where is name_read's where for the packet p.
static __always_inline __u64 name_where(const struct packet *p)
{
	return (__u64)p->dns_off << 32 | (p->dns_counts >> 48) << 16 | (p->dns_len & 0xffff);
}

// name_read reads the question of the query whose DNS header is at dns_off (bits
// 32..63 of where) from the network header, dns_len bytes long (bits 0..15), with
// QDCOUNT in bits 16..31 (from the header the parser read), as
// readQName does with the name keyed by seed: it returns the name's labels and
// leaves the key of its every suffix in the scratch's suffix, or a negated
// name_err. The message is the UDP payload as its length gives it: a packet that
// holds less than that of the question is refused as short.
//
// A global function: the verifier checks its loops once, on their own, and the
// indexes into the scratch are values it cannot know (see node_count).
__noinline int name_read(struct rrl_ctx *ctx, __u64 where, __u64 seed)
{
	struct name_scratch *sc = bpf_map_lookup_elem(&rrl_name_scratch, &name_key_zero);
	if (!sc)
		return -NAME_SHORT;
	__u32 dns_off = where >> 32, dns_len = where & 0xffff;
	if (dns_len < DNS_HEADER_LEN)
		return -NAME_SHORT;
	if ((where >> 16 & 0xffff) != 1)
		return -NAME_QUESTIONS;
	__u64 len = dns_len - DNS_HEADER_LEN; // the message after its header
	__u64 n = len < NAME_SCAN ? len : NAME_SCAN;
	barrier_var(n);
	if (n < 1 || n > NAME_SCAN)
		return -NAME_SHORT;
	if (load_net(ctx, dns_off + DNS_HEADER_LEN, sc->b, n))
		return -NAME_SHORT;
	// The root's key first: the chain waits on it, and computed here it overlaps
	// the walk.
	__u64 root = mix64(seed);
	barrier_var(root);
	sc->i = 0;
	sc->labels = 0;
	sc->seed = seed;
	sc->len = len;
	sc->err = -NAME_TOO_LONG;
	// One turn per label and one for the root: a label takes at least 2 of the
	// name's 255 bytes, so the 128th turn reads the root or refuses the name.
	bpf_loop(NAME_MAX_LABELS + 1, name_turn, NULL, 0);
	if (sc->err)
		return sc->err;
	__u64 labels = sc->labels;
	if (sc->i + 1 + 4 > len)
		return -NAME_SHORT;
	if (labels > NAME_MAX_LABELS)
		return -NAME_TOO_LONG;
	// The chain, from the root down: suffix(i) = mix64(suffix(i+1) ^ label(i)).
	sc->chain = root;
	sc->suffix[labels & NAME_MAX_LABELS] = root;
	bpf_loop((labels + 3) / 4, name_link, NULL, 0);
	return labels;
}

// name_lookup returns the value of k's live entry in the bucket b (entryVal), or
// -1 when there is none (nameTable.lookup); pinned is the value bit that keeps an
// entry live whatever its age (0 for names).
static __always_inline int name_lookup(const struct name_bucket *b, __u64 k, __u64 gen, __u64 pinned)
{
	__u64 tag = k & ~0xffffffULL;
	if (!tag)
		tag = 1 << 24;
#pragma clang loop unroll(full)
	for (int i = 0; i < NAME_WAYS; i++) {
		__u64 e = b->w[i];
		if ((e & ~0xffffffULL) != tag)
			continue;
		__u64 val = e >> 16 & 0xff;
		if ((val & pinned) || (__s16)(__u16)(gen - e) < NAME_GEN_LIVE)
			return val;
	}
	return -1;
}

// fls64 returns the index of the highest bit set in m (not 0), without a branch:
// a branch per bit would make the verifier walk every combination of them at every
// turn of the caller's loop. m smeared right has that index plus one bits set.
static __always_inline __u64 fls64(__u64 m)
{
	m |= m >> 1;
	m |= m >> 2;
	m |= m >> 4;
	m |= m >> 8;
	m |= m >> 16;
	m |= m >> 32;
	m = m - (m >> 1 & 0x5555555555555555ULL);
	m = (m & 0x3333333333333333ULL) + (m >> 2 & 0x3333333333333333ULL);
	m = (m + (m >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
	return ((m * 0x0101010101010101ULL) >> 56) - 1;
}

// name_value looks k up in the names table: the value of its live entry, or -1.
// Inlined: a call costs more than the lookup.
static __always_inline int name_value(__u64 k, __u64 gen)
{
	__u32 idx = k & ((1 << NAME_BUCKET_SHIFT) - 1);
	struct name_bucket *b = bpf_map_lookup_elem(&rrl_names, &idx);
	if (!b)
		return -1;
	return name_lookup(b, k, gen, 0);
}

// apex_value is name_value for the apexes table.
static __always_inline int apex_value(__u64 k, __u64 gen)
{
	__u32 idx = k & ((1 << APEX_BUCKET_SHIFT) - 1);
	struct name_bucket *b = bpf_map_lookup_elem(&rrl_apexes, &idx);
	if (!b)
		return -1;
	return name_lookup(b, k, gen, APEX_PINNED);
}

// suffix_at returns the key of the suffix i labels down from the name. The index
// goes through memory, so that the verifier reads it back as a value it does not
// know: an index it knows, different on different paths or turns, into one
// addition to the scratch's address is refused to a process without CAP_PERFMON
// (see ptr_add).
static __always_inline __u64 suffix_at(struct name_scratch *sc, __u64 i)
{
	sc->index = i;
	barrier();
	return sc->suffix[sc->index & NAME_MAX_LABELS];
}

// zone_turn looks the deepest of the depths left up in the apexes table; it stops
// the loop at the first live apex of its depth, or when no depth is left.
static long zone_turn(__u64 k, void *arg)
{
	struct name_scratch *sc = bpf_map_lookup_elem(&rrl_name_scratch, &name_key_zero);
	if (!sc)
		return 1;
	struct name_apexes *a = &sc->apexes;
	if (!a->m)
		return 1;
	__u64 d = fls64(a->m);
	a->m &= ~(1ULL << d);
	int v = apex_value(suffix_at(sc, a->labels - d), a->gen);
	if (v >= 0 && (v & APEX_DEPTH_MASK) == d) {
		a->depth = d;
		return 1;
	}
	return 0;
}

// name_zone returns the depth of the zone of the name name_read left in the
// scratch, of labels labels, at generation gen: the deepest live apex above it,
// looked up only at the depths the apexes' mask names (nameLearner.zoneOf), 0 (the
// root) when none; -1 when a lookup fails. A global function, as name_wild: each
// is checked once, on its own, rather than once for every way the one before it
// ended; and the depths are turns of bpf_loop, checked once.
__noinline int name_zone(__u64 labels, __u64 gen)
{
	struct name_bucket *db = bpf_map_lookup_elem(&rrl_apexes, &name_key_depths);
	struct name_scratch *sc = bpf_map_lookup_elem(&rrl_name_scratch, &name_key_zero);
	if (!db || !sc || labels > NAME_MAX_LABELS)
		return -1;
	struct name_apexes *a = &sc->apexes;
	__u64 m = db->w[0] & ~1ULL;
	if (labels < 63)
		m &= (1ULL << (labels + 1)) - 1;
	a->m = m;
	a->labels = labels;
	a->gen = gen;
	a->depth = 0;
	bpf_loop(63, zone_turn, NULL, 0);
	return a->depth;
}

// wild_at reports whether the name's ancestor i labels up, at or below the zone's
// apex (depth labels), is a live wildcard parent.
static __always_inline int wild_at(struct name_scratch *sc, __u64 labels, __u64 depth, __u64 gen, __u64 i)
{
	if (labels < i + depth)
		return 0;
	int v = name_value(suffix_at(sc, i), gen);
	return v >= 0 && (v & NAME_WILDCARD);
}

// name_wild returns i (1 to NAME_WILD_UP) when the name's ancestor i labels up is
// a wildcard parent (wild_at), the nearest one; 0 when none is. Four steps written
// out rather than a loop: a loop this short leaves the verifier's walk of a
// mispredicted exit no room to bound its counter.
__noinline int name_wild(__u64 labels, __u64 depth, __u64 gen)
{
	struct name_scratch *sc = bpf_map_lookup_elem(&rrl_name_scratch, &name_key_zero);
	_Static_assert(NAME_WILD_UP == 4, "name_wild takes four steps");
	if (!sc)
		return 0;
	if (wild_at(sc, labels, depth, gen, 1))
		return 1;
	if (wild_at(sc, labels, depth, gen, 2))
		return 2;
	if (wild_at(sc, labels, depth, gen, 3))
		return 3;
	if (wild_at(sc, labels, depth, gen, 4))
		return 4;
	return 0;
}

// name_classify classifies the name name_read left in the scratch, of labels
// labels, at now (nameLearner.classify): it leaves the zone, its depth and the unit
// (the name when known, else the nearest wildcard parent, else the parent) in the
// scratch, and returns whether the name is known (1), or -1 when a lookup fails.
__noinline int name_classify(__u64 labels, __u64 now)
{
	struct name_scratch *sc = bpf_map_lookup_elem(&rrl_name_scratch, &name_key_zero);
	if (!sc || labels > NAME_MAX_LABELS)
		return -1;
	__u64 gen = now >> NAME_GEN_SHIFT & 0xffff;
	int depth = name_zone(labels, gen);
	if (depth < 0 || depth > labels)
		return -1;
	sc->zone = suffix_at(sc, labels - depth);
	sc->depth = depth;
	int v = name_value(sc->suffix[0], gen);
	if (v >= 0 && (v & NAME_EXISTS)) {
		sc->known = 1;
		sc->unit = sc->suffix[0];
		return 1;
	}
	sc->known = 0;
	int up = name_wild(labels, depth, gen);
	sc->unit = suffix_at(sc, up ? up : labels ? 1 : 0);
	return 0;
}

// names_count is the names judge's count (docs/names.md, "The rule") for the query
// whose DNS header is at where (as name_read takes it), judged with the settings
// slot slot at now: it reads and classifies the name, counts the query as known or
// unknown, and counts an unknown one in the zone sketch, whose estimate for the
// zone it returns; 0 for a known name or one that does not read (the names judge
// then lets the query go on as it is). A global function: it is all of the names
// judge but the draw, and only packets of a filter with names on call it.
__noinline __u64 names_count(struct rrl_ctx *ctx, __u64 where, __u64 now, __u32 slot)
{
	__u32 key = 1 + (slot & 1);
	struct settings *s = bpf_map_lookup_elem(&rrl_settings, &key);
	struct counters *c = bpf_map_lookup_elem(&rrl_counters, &name_key_zero);
	if (!s)
		return 0;
	int labels = name_read(ctx, where, s->name_seed);
	if (labels < 0)
		return 0;
	int known = name_classify(labels, now);
	if (known < 0) {
		count(c, COUNTER_ERROR);
		return 0;
	}
	if (known) {
		count(c, COUNTER_NAMES_KNOWN);
		return 0;
	}
	struct name_scratch *sc = bpf_map_lookup_elem(&rrl_name_scratch, &name_key_zero);
	if (!sc)
		return 0;
	fp_t min = 0;
	if (node_count(NODE_ZONES, mix64(s->seed_mix0 ^ sc->zone), now, &min)) {
		count(c, COUNTER_ERROR);
		return 0;
	}
	count(c, COUNTER_NAMES_UNKNOWN);
	return min;
}
