// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/* The ACK clock, the sender's side (docs/transport.md): the ACK of clocked
 * DATA is grown, in place, into the flow's next DATA (clock_send: a re-send
 * RACK finds lost first, else the next order position; clock_emit copies
 * its payload from ltp_sendbuf; clock_headers writes its headers) and sent
 * with XDP_TX; an ACK that cannot become DATA leaves the flight
 * (clock_consume, clock_drop). on_ack (ltp_ack.h) hands the ACKs here.
 */
#ifndef LTP_CLOCK_H
#define LTP_CLOCK_H

#include "ltp_util.h"
#include "ltp_parse.h"
#include "ltp_frame.h"

/* An ACK the clock does not turn into DATA: the packet it stood for leaves
 * the flight, counted in `consumed`. */
static __always_inline int clock_consume(struct ltp_tx *tx, __u32 why)
{
	__sync_fetch_and_add(&tx->consumed, 1);
	count(why);
	return XDP_DROP;
}

/* An ACK dropped without counting it in `consumed`: its packet takes the
 * place of one the control plane re-sent in place of a lost one without
 * counting it in `added` (a re-send the first ACK overtook), or the chunk
 * was not sent (a failed grow) and the control plane's re-send of it will
 * take this packet's place. */
static __always_inline int clock_drop(__u32 why)
{
	count(why);
	return XDP_DROP;
}

/* An ACK that could not become the DATA it was to carry: consumed, unless
 * it was to carry a re-send, for which it was counted consumed already. */
static __always_inline int clock_give_up(struct ltp_tx *tx, __u32 why, __u32 more_flags)
{
	if (more_flags & LTP_F_RETX)
		return clock_drop(why);
	return clock_consume(tx, why);
}

/* Rewrite the frame at ctx, an ACK grown to hold `len` payload bytes, into
 * DATA of `chunk` back to where the ACK came from; XDP_TX. */
static __always_inline int clock_headers(struct xdp_md *ctx, struct ltp_tx *tx,
					 struct ltp_sendslot *so, __u32 chunk, __u32 len, __u32 more_flags)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *iph = (void *)(eth + 1);
	struct udphdr *udp = (void *)(iph + 1);
	struct ltp_hdr *h = (void *)(udp + 1);
	if ((void *)(h + 1) > data_end)
		return clock_give_up(tx, LTP_C_GROW_FAIL, more_flags);
	turn_around(eth, iph, udp, len);

	__u32 flags = tx->flags | LTP_F_CLOCK | more_flags;
	if (so->chunk & LTP_SO_CRITICAL)
		flags |= LTP_F_CRITICAL;
	if (chunk + 1 == tx->nchunks)
		flags |= LTP_F_LAST;
	__u64 added = tx->added, consumed = tx->consumed;
	__u64 inflight = added > consumed ? added - consumed : 0;
	h->type = LTP_T_DATA;
	h->flags = bpf_htons(flags);
	h->chunk = bpf_htonl(chunk);
	h->len = bpf_htons(len);
	h->state = 0;
	h->pad = 0;
	h->rate = bpf_htonl(LTP_CLOCK_STAMP((__u32)(inflight > 0xffff ? 0xffff : inflight),
					    (__u32)tx->stops));
	h->token = tx->dtoken;  /* the flow's DATA token, not the ACK's */
	udp_csum(iph, udp, so->csum);  /* the payload's sum, from the control plane */
	__sync_fetch_and_add(&tx->sent, 1);
	count(LTP_C_CLOCK_TX);
	return XDP_TX;
}

/* Log a DATA this flow sends (order position pos, chunk), for RACK in XDP:
 * the log's next seq (fetch-add, so two CPUs never share one) holds pos,
 * and the chunk's ltp_sentat entry names that seq (+ 1): an older entry of
 * the chunk is superseded. */
static __always_inline void clock_log(struct ltp_tx *tx, __u32 flow, __u32 pos, __u32 chunk)
{
	__u64 seq = __sync_fetch_and_add(&tx->xseq, 1);
	__u32 lidx = flow * LTP_SENDLOG + (__u32)(seq % LTP_SENDLOG);
	__u32 *l = ltp_sendlog.lookup(&lidx);
	if (l)
		*l = pos;
	__u32 sidx = flow * LTP_MAX_CHUNKS + chunk;
	__u64 *sa = ltp_sentat.lookup(&sidx);
	if (sa)
		*sa = seq + 1;
}

/* Grow the ACK at ctx into DATA of order position pos (its payload from
 * ltp_sendbuf), logged for RACK when the flow has it on; XDP_TX. */
static __always_inline int clock_emit(struct xdp_md *ctx, struct ltp_tx *tx, __u32 bank,
				      __u32 flow, __u64 pos, __u32 more_flags)
{
	if (pos >= LTP_MAX_CHUNKS)
		return clock_give_up(tx, LTP_C_CLOCK_IDLE, more_flags);
	__u32 oidx = bank * LTP_MAX_CHUNKS + (__u32)pos;
	struct ltp_sendslot *so = ltp_sendorder.lookup(&oidx);
	if (!so)
		return clock_give_up(tx, LTP_C_CLOCK_IDLE, more_flags);
	__u32 chunk = so->chunk & LTP_SO_CHUNK;
	__u32 nch = tx->nchunks;
	if (chunk >= nch || chunk >= LTP_MAX_CHUNKS)
		return clock_give_up(tx, LTP_C_CLOCK_IDLE, more_flags);
	__u32 sidx = bank * LTP_MAX_CHUNKS + chunk;
	struct ltp_chunk *src = ltp_sendbuf.lookup(&sidx);
	if (!src)
		return clock_give_up(tx, LTP_C_CLOCK_IDLE, more_flags);
	__u64 n = chunk + 1 == nch ? tx->last_len : LTP_CHUNK_BYTES;
	barrier_var(n);
	if (n > LTP_CHUNK_BYTES)
		return clock_give_up(tx, LTP_C_GROW_FAIL, more_flags);
	barrier_var(n);  /* keeps clang from merging the two tests */
	if (n < 4)
		return clock_give_up(tx, LTP_C_GROW_FAIL, more_flags);
	__u32 plen = ctx->data_end - ctx->data;
	barrier_var(plen);  /* a length, not pointer arithmetic on pkt_end */
	/* A trim (clock_send grew it to a full chunk: none for a full one) and
	 * a copy into the room it made: neither fails in practice; if one did,
	 * the chunk waits for a re-send. */
	int trim = (int)(PAY_OFF + n) - (int)plen;
	if (trim && bpf_xdp_adjust_tail(ctx, trim))
		return clock_drop(LTP_C_GROW_FAIL);
	if (bpf_xdp_store_bytes(ctx, PAY_OFF, src, n))
		return clock_drop(LTP_C_GROW_FAIL);
	if (tx->rack)
		clock_log(tx, flow, (__u32)pos, chunk);
	return clock_headers(ctx, tx, so, chunk, (__u32)n, more_flags);
}

/* RACK over the flow's log: the order position of the oldest logged DATA
 * still unacknowledged while one logged more than LTP_RACK_REORDER later
 * was acked (lost: its DATA or its ACK), or -1. Looks at LTP_RACK_SCAN
 * entries at most, moving `scan` past those judged: acked ones, and those
 * superseded (sent again since, by XDP or by the control plane, which
 * zeroes ltp_sentat when it takes a chunk over). Two CPUs judging at once
 * may pick one entry twice: a duplicate re-send, never a lost one. */
static __always_inline __s64 rack_lost(struct ltp_tx *tx, struct ltp_bitmap *acked,
				     __u32 bank, __u32 flow)
{
	for (int i = 0; i < LTP_RACK_SCAN; i++) {
		__u64 at = tx->scan;
		if (at >= tx->xseq || at + LTP_RACK_REORDER >= tx->newest)
			return -1;
		tx->scan = at + 1;
		__u32 lidx = flow * LTP_SENDLOG + (__u32)(at % LTP_SENDLOG);
		__u32 *l = ltp_sendlog.lookup(&lidx);
		if (!l)
			return -1;
		__u32 pos = *l;
		if (pos >= LTP_MAX_CHUNKS)
			continue;
		__u32 oidx = bank * LTP_MAX_CHUNKS + pos;
		struct ltp_sendslot *so = ltp_sendorder.lookup(&oidx);
		if (!so)
			continue;
		__u32 chunk = so->chunk & LTP_SO_CHUNK;
		__u32 sidx = flow * LTP_MAX_CHUNKS + chunk;
		__u64 *sa = ltp_sentat.lookup(&sidx);
		if (!sa || *sa != at + 1)
			continue;  /* superseded */
		__u64 word = bitmap_word(chunk);
		if (word >= LTP_BM_WORDS)
			continue;
		if (acked->w[word] & (1ULL << (chunk & 63)))
			continue;
		return pos;
	}
	return -1;
}

/* Turn the ACK at ctx into DATA: first a re-send of a chunk RACK finds
 * lost, as TCP re-sends first (the ACK's packet leaves the flight and the
 * re-send takes the lost one's place, so the flow's clock keeps its ticks
 * and the control plane sees the true count in flight); else the next
 * order position (fetch-add, so two CPUs never send the same one); the ACK
 * is consumed when the order is exhausted. */
static __always_inline int clock_send(struct xdp_md *ctx, struct ltp_tx *tx,
				      struct ltp_bitmap *acked, __u32 bank, __u32 flow)
{
	/* Grow to a full chunk before anything is taken: a frame that cannot
	 * grow (too little tailroom) is consumed with nothing handed out, so
	 * the control plane sees one packet fewer in flight and sends it
	 * again. A position taken before a failed grow would leave its chunk
	 * unsent until the control plane's RTO (two of the flow's round trips,
	 * at least 2 ms: control/transport/ackclock.py), most often at a flow's
	 * end. clock_emit trims the frame to the chunk's length. */
	if (tx->next >= tx->tail && !(tx->rack && tx->scan < tx->xseq &&
				       tx->scan + LTP_RACK_REORDER < tx->newest))
		return clock_consume(tx, LTP_C_CLOCK_IDLE);  /* a peek: nothing to send */
	__u32 plen = ctx->data_end - ctx->data;
	barrier_var(plen);
	if (bpf_xdp_adjust_tail(ctx, (int)(PAY_OFF + LTP_CHUNK_BYTES) - (int)plen))
		return clock_consume(tx, LTP_C_GROW_FAIL);
	if (tx->rack) {
		__s64 lost = rack_lost(tx, acked, bank, flow);
		if (lost >= 0) {
			__sync_fetch_and_add(&tx->consumed, 1);
			__sync_fetch_and_add(&tx->rexmit, 1);
			count(LTP_C_CLOCK_RETX);
			return clock_emit(ctx, tx, bank, flow, (__u64)lost, LTP_F_RETX);
		}
	}
	__u64 pos = __sync_fetch_and_add(&tx->next, 1);
	if (pos < tx->tail)
		return clock_emit(ctx, tx, bank, flow, pos, 0);
	return clock_consume(tx, LTP_C_CLOCK_IDLE);
}

/* The newest log entry an ACK of `chunk` acknowledges (RACK's clock). */
static __always_inline void rack_acked(struct ltp_tx *tx, __u32 flow, __u32 chunk)
{
	__u32 sidx = flow * LTP_MAX_CHUNKS + chunk;
	__u64 *sa = ltp_sentat.lookup(&sidx);
	if (sa && *sa && *sa - 1 > tx->newest)
		tx->newest = *sa - 1;
}

#endif /* LTP_CLOCK_H */
