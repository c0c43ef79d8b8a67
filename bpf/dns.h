// DNS messages: walking the question of a query read into per-CPU scratch space.
#pragma once

#include "parse.h"

// How much of a query after its header the cookie lookup reads in one load: room
// for the longest question name (255 bytes), the OPT record and options before the
// cookie. A cookie that ends further in is not looked at.
#define COOKIE_SCAN 512
#define COOKIE_SCAN_MASK (COOKIE_SCAN - 1)
#define MAX_NAME_LEN 255
// The longest question: the name, QTYPE and QCLASS.
#define QUESTION_MAX (MAX_NAME_LEN + 4)

// Per CPU, the part of a query after its header, read in one load for the cookie
// lookup (and a slip's response); indexes are masked to COOKIE_SCAN_MASK, so reads run into the slack.
struct cookie_scratch {
	__u8 b[COOKIE_SCAN + 32];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cookie_scratch);
} rrl_cookie_scratch SEC(".maps");

// question_end walks the name of the question at the start of b (n bytes of it
// read) label by label, and returns the offset just past the question's QTYPE and
// QCLASS, or 0 when the name ends in a compression pointer or an extended label
// type, or does not end within MAX_NAME_LEN or n bytes. The offset is not checked
// against n: a caller reads what follows only after its own check.
static __always_inline __u64 question_end(const __u8 *b, __u64 n)
{
	__u64 i = 0;
#pragma clang loop unroll(disable)
	for (int k = 0; k <= MAX_NAME_LEN / 2; k++) {
		__u8 l = b[i & COOKIE_SCAN_MASK];
		if (l == 0)
			return i + 1 + 4; // the root label, QTYPE, QCLASS
		if (l & 0xc0)
			return 0;
		i += l + 1;
		if (i >= MAX_NAME_LEN || i >= n)
			return 0;
	}
	return 0;
}
