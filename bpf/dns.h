// DNS messages: walking the question of a query, and the per-CPU scratch space a
// slip's response is built in.
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

// Per CPU, the part of a query after its header, read in one load for a slip's
// response (XDP); indexes are masked to COOKIE_SCAN_MASK, so reads run into the slack.
struct cookie_scratch {
	__u8 b[COOKIE_SCAN + 32];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cookie_scratch);
} rrl_cookie_scratch SEC(".maps");

// question_end walks the name of the question at off from the network header (n
// bytes of the message there) label by label, and returns the offset just past the
// question's QTYPE and QCLASS from off, or 0 when the name ends in a compression
// pointer or an extended label type, or does not end within MAX_NAME_LEN or n bytes.
// The offset is not checked against n: a caller reads what follows only after its
// own check.
//
// A global function that reads each label's length from the packet: the verifier
// checks it once, its callers see one result of unknown value instead of a state for
// every label count, and it indexes no memory by a value it cannot know, which would
// make it compare every state exactly for a process without CAP_PERFMON (it masks
// such indexes against Spectre v1), and give up on this loop.
__noinline int question_end(struct rrl_ctx *ctx, __u32 off, __u64 n)
{
	__u64 i = 0;
#pragma clang loop unroll(disable)
	for (int k = 0; k <= MAX_NAME_LEN / 2; k++) {
		bounded_loop(k);
		__u8 l;
		if (load_net(ctx, off + i, &l, 1))
			return 0;
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
