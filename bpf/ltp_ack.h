// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/* The sender: an ACK in. on_ack records it for the control plane (the
 * chunk acknowledged in ltp_acked, the round's state, the rate or credit
 * in ltp_tx) and drops it; the ACK of clocked DATA goes on to the ACK
 * clock (ltp_clock.h), which turns it into the flow's next DATA.
 */
#ifndef LTP_ACK_H
#define LTP_ACK_H

#include "ltp_util.h"
#include "ltp_clock.h"

/* The delivered bits an ACK carries for block `word` of a round of nchunks
 * chunks (LTP_F_SACK), or 0: none, or not whole in the frame. */
static __always_inline __u64 ack_sack(struct xdp_md *ctx, struct ltp_hdr *h, __u16 hflags,
				      __u64 word, __u32 nchunks)
{
	__u64 *sack = (void *)(h + 1);
	if (!(hflags & LTP_F_SACK) || h->len != bpf_htons(LTP_SACK_LEN) ||
	    (void *)(sack + 1) > (void *)(long)ctx->data_end)
		return 0;
	__u64 bits = sack_le64(*sack);
	__u64 first = word * 64;
	if (first + 64 > nchunks)
		bits &= nchunks > first ? (1ULL << (nchunks - first)) - 1 : 0;
	return bits;
}

/* Record an OPEN ACK: its chunk (`bit` of block `word`) and the block's
 * delivered bits it may carry (LTP_F_SACK: what ACKs lost before it would
 * have said, bits past the round's end left out) in ltp_acked, the new ones
 * counted in tx->acked; *had: its chunk was acked before. Returns the
 * chunks only the SACK bits named: their own ACKs were lost (or come
 * later, and are dropped as seen), so no ACK of theirs will ever become
 * DATA; on the clock their packets leave the flight then, else each lost
 * ACK would hold a place of the credit for the rest of the round and at
 * heavy loss the window would fill with packets that are gone (the control
 * plane grows the flow again into the places freed). */
static __always_inline __u64 ack_mark(struct xdp_md *ctx, struct ltp_hdr *h, __u16 hflags,
				      struct ltp_tx *tx, struct ltp_bitmap *acked, __u64 word,
				      __u64 bit, __u64 *had)
{
	__u64 mark = bit | ack_sack(ctx, h, hflags, word, tx->nchunks);
	__u64 old = __sync_fetch_and_or(&acked->w[word], mark);
	*had = old & bit;
	__u64 fresh = mark & ~old;
	if (fresh)
		__sync_fetch_and_add(&tx->acked, popcount64(fresh));
	return fresh & ~bit;
}

/* An ACK from the LTP port (its LTP header at h), for this host's flow in
 * ltp_tx at [its round's bank][its worker's slot]: checked against that
 * flow's round, token and chunk count, recorded, then dropped or handed to
 * the clock. */
static __always_inline int on_ack(struct xdp_md *ctx, struct ltp_hdr *h)
{
	__u32 slot;
	if (peer_slot(h, &slot))
		return drop(LTP_C_UNKNOWN_WORKER, h);
	struct ltp_slot_stats *st = ltp_stats.lookup(&slot);
	__u32 round = bpf_ntohl(h->round);
	__u32 bank = LTP_BANK_OF(round);
	__u32 bidx = bank * LTP_SLOTS + slot;
	struct ltp_tx *tx = ltp_tx.lookup(&bidx);
	struct ltp_bitmap *acked = ltp_acked.lookup(&bidx);
	if (!tx || !acked || !st)
		return XDP_DROP;
	/* A round this host is not sending: no token here to check it by. */
	if (tx->round != round)
		return drop_unauth(LTP_C_ACK_STALE);
	/* Only an ACK built by the receiver from our own DATA carries the token
	 * (the receiver's for this flow): a spoofed one, or another member's,
	 * neither closes the round nor marks a chunk nor sets the rate, nor
	 * grows into DATA on the clock. */
	if (h->token != tx->token)
		return drop_spoof();
	/* A chunk the round does not have: nothing recorded (a forged one
	 * could make every chunk acked unreachable, or close the round). */
	__u32 chunk = bpf_ntohl(h->chunk);
	if (chunk >= tx->nchunks || chunk >= LTP_MAX_CHUNKS) {
		st->out_of_range += 1;
		return drop(LTP_C_OUT_OF_RANGE, h);
	}
	__u16 hflags = bpf_ntohs(h->flags);
	if (h->state == LTP_RS_CLOSED)
		tx->closed = 1;
	__u32 rate = bpf_ntohl(h->rate);
	if (!(hflags & LTP_F_CLOCK)) {
		tx->rate_kbps = rate;
	} else if (h->state == LTP_RS_OPEN) {  /* a credit, in packets */
		tx->window = rate;
		if (!tx->window_min || rate < tx->window_min)
			tx->window_min = rate;
	}
	st->acks_rx += 1;
	count(LTP_C_ACK_RX);
	__u64 word = bitmap_word(chunk);
	if (word >= LTP_BM_WORDS)
		return XDP_DROP;
	__u64 bit = 1ULL << (chunk & 63);
	__u64 had = 0, unseen = 0;
	/* A CLOSED ACK for a late chunk does not mean it was delivered. */
	if (h->state != LTP_RS_CLOSED)
		unseen = ack_mark(ctx, h, hflags, tx, acked, word, bit, &had);
	if (!(hflags & LTP_F_CLOCK) || !tx->clock)
		return XDP_DROP;
	if (unseen)   /* gone from the flight: see ack_mark */
		__sync_fetch_and_add(&tx->consumed, popcount64(unseen));
	if (tx->closed)
		return clock_consume(tx, LTP_C_CLOCK_IDLE);
	/* A second ACK of one chunk (a re-send the first ACK overtook): the
	 * first kept the clock going, this copy leaves the flight. */
	if (had)
		return clock_drop(LTP_C_CLOCK_IDLE);
	if (tx->rack)
		rack_acked(tx, bidx, chunk);
	if (hflags & LTP_F_STOP) {
		__sync_fetch_and_add(&tx->stops, 1);
		return clock_consume(tx, LTP_C_CLOCK_STOP);
	}
	return clock_send(ctx, tx, acked, bank, bidx);
}

#endif /* LTP_ACK_H */
