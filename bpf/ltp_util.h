// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/* What every part of ltp_xdp uses: the counters and the drops, the barrier
 * that keeps a bound test in the program, a chunk's bitmap word and a
 * packet's worker slot.
 */
#ifndef LTP_UTIL_H
#define LTP_UTIL_H

#include "ltp_wire.h"
#include "ltp_maps.h"

/* Make v's value opaque to clang (libbpf's name for this): a bound test on
 * v that follows stays in the program, in a register the verifier tracks,
 * instead of being merged with an earlier test or folded away. */
#define barrier_var(v) asm volatile("" : "+r"(v))

/* Stages `ltp bench xdp` leaves out of the DATA path to show where its time
 * goes (-DLTP_BENCH_SKIP=<bits>, control/bench/xdp_stages.py). 0, what
 * every real load compiles, leaves out nothing. */
#ifndef LTP_BENCH_SKIP
#define LTP_BENCH_SKIP 0
#endif
#define LTP_SKIP_ACK     1     /* no ACK rewrite: the DATA frame sent back as it came */
#define LTP_SKIP_MARK    2     /* no done bit, progress, share or clock read after the copy */
#define LTP_SKIP_COPY    4     /* no payload copy */
#define LTP_SKIP_COUNT   8     /* no counters (ltp_counters, ltp_stats) */
#define LTP_SKIP_CLAIM   16    /* no claim bit (every chunk taken as new) */
#define skipped(stage)   (LTP_BENCH_SKIP & (stage))

static __always_inline void count(__u32 idx)
{
	if (skipped(LTP_SKIP_COUNT))
		return;
	__u64 *v = ltp_counters.lookup(&idx);
	if (v)
		*v += 1;
}

/* Count a drop class and keep the offending header for `ltp flows`. */
static __always_inline int drop(__u32 idx, struct ltp_hdr *h)
{
	count(idx);
	struct ltp_hdr *last = ltp_lasthdr.lookup(&idx);
	if (last && h)
		__builtin_memcpy(last, h, sizeof(*last));
	return XDP_DROP;
}

/* A packet without its round's token: counted (per CPU) and nothing else.
 * No header is kept (ltp_lasthdr is shared by every CPU and read by the
 * operator's tools): a spoofer cannot write anything anyone reads. */
static __always_inline int drop_spoof(void)
{
	count(LTP_C_BAD_TOKEN);
	return XDP_DROP;
}

/* A frame of a known worker's flow that cannot be authenticated: a round
 * this host does not hold (stale, future, an ACK of a round not being
 * sent), whose token is not here to check. Counted per CPU and nothing
 * else: no per-slot count, no kept header, as for a spoof. */
static __always_inline int drop_unauth(__u32 idx)
{
	count(idx);
	return XDP_DROP;
}

/* Bitmap word of a chunk, opaque to clang so the bound test that follows
 * stays in the program for the verifier (LTP_BM_WORDS need not be a power
 * of two). */
static __always_inline __u64 bitmap_word(__u32 chunk)
{
	__u64 word = chunk >> 6;
	barrier_var(word);
	return word;
}

/* A bitmap word as an ACK's SACK bytes carry it (little-endian: byte k
 * bit i is bit 8k + i), and back. */
static __always_inline __u64 sack_le64(__u64 v)
{
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
	return __builtin_bswap64(v);
#else
	return v;
#endif
}

/* The set bits of x (BPF has no popcount instruction). */
static __always_inline __u64 popcount64(__u64 x)
{
	x = x - ((x >> 1) & 0x5555555555555555ULL);
	x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
	x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
	return (x * 0x0101010101010101ULL) >> 56;
}

/* The slot of the packet's worker id; nonzero if the worker is unknown. */
static __always_inline int peer_slot(struct ltp_hdr *h, __u32 *slot)
{
	__u32 worker = bpf_ntohs(h->worker);
	__u32 *slotp = ltp_peers.lookup(&worker);
	if (!slotp || *slotp == 0 || *slotp > LTP_SLOTS)
		return -1;
	*slot = *slotp - 1;
	return 0;
}

#endif /* LTP_UTIL_H */
