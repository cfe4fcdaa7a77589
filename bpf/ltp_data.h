// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/* The receiver: DATA in, its ACK out. on_data admits a DATA packet
 * (data_admit: its sender, its round and token, its length, its chunk), stores its
 * payload (data_store: claim, copy, mark delivered) and turns the packet
 * into its ACK (ack_rewrite, before the copy; ack_send), which carries the
 * sender's rate or, for a clocked flow, its credit.
 */
#ifndef LTP_DATA_H
#define LTP_DATA_H

#include "ltp_util.h"
#include "ltp_parse.h"
#include "ltp_frame.h"
#include "ltp_live.h"

/* What data_admit found out about a DATA packet it let in (the ACK's
 * helpers read its slot, bank and ack_token). */
struct ltp_rx {
	struct ltp_slot_stats *st;  /* its sender's slot's counters */
	__u32 slot;
	__u32 bank;
	__u32 chunk;
	__u32 nchunks;              /* the bank's chunk count */
	__u32 len;                  /* payload bytes */
	__u32 thresh;               /* the bank's thresh (chunks per slot; 0: none) */
	__be64 ack_token;           /* what its ACK carries (ltp_slottok.ack) */
	__u32 csum;                 /* verify its UDP checksum (LTP_CFG_CSUM) */
	__u32 retx;                 /* a re-send (LTP_F_RETX): read before the ACK rewrite */
	__u64 now;                  /* bpf_ktime_get_ns if read for this frame, else 0 */
};

/* The flows sharing a bank once the chunk an ACK answers is marked: `ending`
 * (1) when that chunk is to end its flow, which the marking (data_mark)
 * takes off `active` after the ACK is written. */
static __always_inline __u32 flows_after(struct ltp_share *sh, __u32 ending)
{
	__u32 active = sh->active;
	return active > ending ? active - ending : 0;
}

/* The credit of a clocked flow (LTP_F_CLOCK DATA), as the ACK carries it:
 * each flow not finished may keep window / active packets in flight (at
 * least 1), so all of them together keep about the bank's window (the
 * bottleneck's buffer plus one BDP). The DATA's stamp says how many its flow
 * had in flight when it left and how many STOPs its sender had seen; less
 * the STOPs sent since, that is what it has now. More than its credit: this
 * ACK says STOP (the sender consumes it: one packet fewer in flight). */
static __always_inline __u32 credit(struct ltp_hdr *h, struct ltp_rx *rx, __u32 ending,
				    __u16 *extra)
{
	struct ltp_share *sh = ltp_share.lookup(&rx->bank);
	__u32 window = sh ? sh->window : 0;
	if (!window)
		return 0xffff;
	__u32 active = flows_after(sh, ending);
	__u32 allow = window / (active ? active : 1);
	if (!allow)
		allow = 1;
	__u32 bidx = rx->bank * LTP_SLOTS + rx->slot;
	struct ltp_progress *pr = ltp_progress.lookup(&bidx);
	if (!pr)
		return allow;
	__u32 stamp = bpf_ntohl(h->rate);
	__u32 owed = ((__u32)pr->stops - stamp) & 0xffff;  /* STOPs it had not seen */
	__u32 inflight = stamp >> 16;
	if (inflight > owed && inflight - owed > allow) {
		__sync_fetch_and_add(&pr->stops, 1);
		count(LTP_C_CREDIT_STOP);
		*extra |= LTP_F_STOP;
	}
	return allow;
}

/* The SACK bytes of the ACK the frame at ctx becomes: right after its LTP
 * header, or NULL where the frame has no room for them (a last chunk under
 * 8 bytes). */
static __always_inline __u64 *ack_sack_at(struct xdp_md *ctx, struct ltp_hdr *h)
{
	__u64 *sack = (void *)(h + 1);
	if ((void *)(sack + 1) > (void *)(long)ctx->data_end)
		return NULL;
	return sack;
}

/* Rewrite the DATA packet p in place into its ACK, all but the SACK
 * bytes and the trim (ack_send): addresses and ports swapped, the ACK's
 * token (rx->ack_token: its slot's, ltp_slottok.ack) in place of the
 * DATA's, IP and UDP checksums right. With LTP_F_SACK in extra_flags the
 * ACK carries `sack` (a 64-chunk block's delivered bits, as the payload
 * bytes hold them) in the first LTP_SACK_LEN payload bytes, which the
 * caller stores: the checksum counts them already, so DATA's payload can
 * still be copied out first. Returns the ACK's payload length. */
static __always_inline __u32 ack_rewrite(struct ltp_pkt *p, struct ltp_rx *rx, __u8 rstate,
					 __u16 extra_flags, __u64 sack, __u32 ending)
{
	struct ltp_hdr *h = p->h;
	__u32 pay = 0, pay_sum = 0;
	if (extra_flags & LTP_F_SACK) {
		pay = LTP_SACK_LEN;
		pay_sum = csum_u64(sack);
	}
	turn_around(p->eth, p->iph, p->udp, pay);

	/* The rate this sender may use: its share of the bank's capacity among
	 * the flows active right now, or the per-slot rate if none is set; a
	 * clocked flow's credit instead (in packets). */
	__u32 rate = 0;
	struct ltp_share *sh = ltp_share.lookup(&rx->bank);
	if ((h->flags & bpf_htons(LTP_F_CLOCK)) && rstate == LTP_RS_OPEN) {
		__u16 more = 0;
		rate = credit(h, rx, ending, &more);
		extra_flags |= more;
	} else if (sh && sh->share_kbps) {
		__u32 active = flows_after(sh, ending);
		rate = sh->share_kbps / (active ? active : 1);
	} else {
		__u32 *r = ltp_rate.lookup(&rx->slot);
		rate = r ? *r : 0;
	}
	h->type = LTP_T_ACK;
	h->flags = h->flags | bpf_htons(extra_flags);
	h->len = bpf_htons(pay);
	h->state = rstate;
	h->pad = 0;
	h->rate = bpf_htonl(rate);
	h->token = rx->ack_token;  /* the ACK's own: the receiver's, for this slot's flow */
	udp_csum(p->iph, p->udp, pay_sum);
	return pay;
}

/* Send the ACK ack_rewrite made, of `pay` payload bytes: the frame cut to
 * its length, counted; XDP_TX. */
static __always_inline int ack_send(struct xdp_md *ctx, struct ltp_rx *rx, __u32 pay)
{
	int delta = (int)(PAY_OFF + pay) - (int)(ctx->data_end - ctx->data);
	if (delta < 0 && bpf_xdp_adjust_tail(ctx, delta)) {
		count(LTP_C_ACK_FAIL);
		return XDP_DROP;
	}
	count(LTP_C_ACK_TX);
	struct ltp_slot_stats *st = ltp_stats.lookup(&rx->slot);
	if (st && !skipped(LTP_SKIP_COUNT))
		st->acks_tx += 1;
	return XDP_TX;
}

/* Turn the DATA packet at ctx into its ACK in place and return XDP_TX
 * (ack_rewrite, ack_send). With `done` (an OPEN ACK: the word of ltp_done
 * that holds the chunk's bit), the ACK carries the delivered bits of the
 * chunk's 64-chunk block (LTP_F_SACK) when the frame has room for them. */
static __always_inline int send_ack(struct xdp_md *ctx, struct ltp_pkt *p, struct ltp_rx *rx,
				    __u8 rstate, __u16 extra_flags, __u64 *done)
{
	__u64 *sack = ack_sack_at(ctx, p->h);
	__u64 bits = 0;
	if (done && sack) {
		bits = sack_le64(*done);
		*sack = bits;
		extra_flags |= LTP_F_SACK;
	}
	__u32 pay = ack_rewrite(p, rx, rstate, extra_flags, bits, 0);
	return ack_send(ctx, rx, pay);
}

#define LTP_ADMITTED (-1)           /* data_admit: store it (no verdict yet) */

/* `round` is the one bank b held just before (not GROUP DATA: no group token kept). */
static __always_inline int held_before(struct ltp_bank *b, __u32 round, __u16 group)
{
	return !group && b->prev && round == b->prev_round;
}

/* Fill what rx's ACK needs once the token checked: the ACK token, whether
 * to verify checksums, the slot's counters (nonzero: none, drop). */
static __always_inline int rx_bind(struct ltp_rx *rx, struct ltp_cfg *cfg, __be64 ack_token)
{
	rx->ack_token = ack_token;
	rx->csum = cfg->flags & LTP_CFG_CSUM;
	struct ltp_slot_stats *st = ltp_stats.lookup(&rx->slot);
	if (!st)
		return -1;
	rx->st = st;
	return 0;
}

/* Late for a closed round: never written, ACKed CLOSED so the sender stops. */
static __always_inline int ack_late(struct xdp_md *ctx, struct ltp_pkt *p, struct ltp_rx *rx)
{
	rx->st->late += 1;
	count(LTP_C_LATE);
	return send_ack(ctx, p, rx, LTP_RS_CLOSED, 0, NULL);
}

/* DATA of the round its bank held before the one it holds now (its sender
 * still pushing it): with that round's slot token, ACKed CLOSED with its ACK
 * token, so the push ends now, not at the next answer; never written. */
static __always_inline int data_late(struct xdp_md *ctx, struct ltp_pkt *p,
				     struct ltp_cfg *cfg, struct ltp_rx *rx)
{
	__u32 bidx = rx->bank * LTP_SLOTS + rx->slot;
	struct ltp_slot_tok *tk = ltp_slottok.lookup(&bidx);
	if (!tk)
		return XDP_DROP;
	if (p->h->token != tk->prev_data)
		return drop_spoof();
	if (rx_bind(rx, cfg, tk->prev_ack))
		return XDP_DROP;
	return ack_late(ctx, p, rx);
}

/* DATA flagged GROUP: this host takes it as addressed to itself, so its
 * slot is its own id's and the ACK (built by swapping) names this worker
 * and leaves from this host's MAC and address, not the group's. Nonzero
 * if this host has no id of its own set (ltp_cfg.self_*). */
static __always_inline int take_group(struct ltp_pkt *p, struct ltp_cfg *cfg)
{
	if (!(cfg->flags & LTP_CFG_SELF))
		return -1;
	/* The checksums follow what is rewritten, so the frame verifies as
	 * sent (udp_csum_ok sums the new words); a UDP sum of 0 is none. */
	__be16 worker = bpf_htons(cfg->self_worker);
	__u32 addr = csum_change32(p->iph->daddr, cfg->self_ip);
	if (p->udp->check)
		p->udp->check = csum_amend(p->udp->check, addr + csum_change(p->h->worker, worker));
	p->iph->check = csum_amend(p->iph->check, addr);
	p->h->worker = worker;
	__builtin_memcpy(p->eth->h_dest, cfg->self_mac, ETH_ALEN);
	p->iph->daddr = cfg->self_ip;
	return 0;
}

/* Admit a DATA packet: a known sender, the round its bank holds, its token
 * (its slot's, or the bank's group token for DATA flagged GROUP), lengths
 * that agree, a slot the round takes, a live owner, a chunk in range. Fills
 * rx and returns LTP_ADMITTED, or the verdict: a counted drop, or for a
 * closed round or slot an ACK that says CLOSED. Nothing but a per-CPU count
 * changes before the token is checked. */
static __always_inline int data_admit(struct xdp_md *ctx, struct ltp_pkt *p,
				      struct ltp_cfg *cfg, struct ltp_rx *rx)
{
	struct ltp_hdr *h = p->h;
	__u16 group = h->flags & bpf_htons(LTP_F_GROUP);
	if (group && take_group(p, cfg))
		return drop_unauth(LTP_C_NO_GROUP);
	if (peer_slot(h, &rx->slot))
		return drop(LTP_C_UNKNOWN_WORKER, h);

	__u32 round = bpf_ntohl(h->round);
	rx->bank = LTP_BANK_OF(round);
	struct ltp_bank *b = ltp_banks.lookup(&rx->bank);
	if (!b)
		return XDP_DROP;
	/* A round the bank does not hold: no token here to check it by. */
	if (b->state == LTP_BANK_FREE || (__s32)(round - b->round) > 0)
		return drop_unauth(LTP_C_FUTURE);
	if (round != b->round)
		return held_before(b, round, group) ? data_late(ctx, p, cfg, rx) : drop_unauth(LTP_C_STALE);
	/* Before anything is written or ACKed, closed rounds included: without
	 * its worker's token for this round (or the round's group token) a
	 * packet is a spoof, another member's, or from another secret. */
	__u32 bidx = rx->bank * LTP_SLOTS + rx->slot;
	struct ltp_slot_tok *tk = ltp_slottok.lookup(&bidx);
	if (!tk)
		return XDP_DROP;
	if (group ? (!b->group || h->token != b->token) : h->token != tk->data)
		return drop_spoof();
	if (rx_bind(rx, cfg, tk->ack))
		return XDP_DROP;

	struct iphdr *iph = p->iph;
	struct udphdr *udp = p->udp;
	__u32 len = bpf_ntohs(h->len);
	__u32 pkt_len = ctx->data_end - ctx->data;
	if (len == 0 || len > LTP_CHUNK_BYTES || (len & 3) ||
	    bpf_ntohs(udp->len) != sizeof(*udp) + sizeof(*h) + len ||
	    bpf_ntohs(iph->tot_len) != sizeof(*iph) + sizeof(*udp) + sizeof(*h) + len ||
	    pkt_len < PAY_OFF + len)
		return drop(LTP_C_MALFORMED, h);
	rx->len = len;

	if (b->state != LTP_BANK_OPEN)
		return ack_late(ctx, p, rx);
	if (!tk->open) {
		/* A worker this round does not take (dropped, or never in it):
		 * nothing written, no flow counted down; CLOSED stops it. */
		count(LTP_C_SLOT_CLOSED);
		return send_ack(ctx, p, rx, LTP_RS_CLOSED, 0, NULL);
	}
	/* An ACK promises a live reader: with a stale heartbeat the round's
	 * owner is hung, and its senders must hear nothing. */
	if (owner_stale(cfg, &rx->now))
		return drop(LTP_C_STALE_OWNER, h);

	rx->chunk = bpf_ntohl(h->chunk);
	rx->nchunks = b->nchunks;
	rx->thresh = b->thresh;
	if (rx->chunk >= LTP_MAX_CHUNKS || rx->chunk >= rx->nchunks ||
	    bpf_ntohl(h->nchunks) != rx->nchunks ||
	    (rx->chunk + 1 == rx->nchunks ? len != b->last_len : len != LTP_CHUNK_BYTES)) {
		rx->st->out_of_range += 1;
		return drop(LTP_C_OUT_OF_RANGE, h);
	}
	if (!skipped(LTP_SKIP_COUNT)) {
		rx->st->rx_packets += 1;
		rx->st->rx_bytes += len;
	}
	return LTP_ADMITTED;
}

/* Mark a stored chunk delivered: its done bit, its bank slot's progress
 * (chunks, bytes, re-sends, arrival times: first, last, threshold) and, for the flow's last
 * chunk, one flow fewer sharing the bank. */
static __always_inline void data_mark(struct ltp_rx *rx, struct ltp_bitmap *done,
				      struct ltp_progress *pr, __u64 word, __u64 bit)
{
	/* The done bit is what user space trusts: set only after the copy. */
	__sync_fetch_and_or(&done->w[word], bit);
	__sync_fetch_and_add(&pr->chunks, 1);
	/* This slot's last chunk ends its flow: one fewer to share with. The
	 * fetch-or on a flag makes that count once across CPUs (bcc's target has
	 * no fetch-add with a result). */
	struct ltp_share *sh = ltp_share.lookup(&rx->bank);
	if (sh && pr->chunks >= rx->nchunks &&
	    !(__sync_fetch_and_or(&pr->flow, LTP_FLOW_DONE) & LTP_FLOW_DONE) && sh->active)
		__sync_fetch_and_add(&sh->active, (__u32)-1);  /* no atomic sub in BPF */
	if (rx->retx)
		__sync_fetch_and_add(&pr->retx, 1);
	__sync_fetch_and_add(&pr->bytes, rx->len);
	/* Arrival times (ltp_progress): the clock is read for a flow's edges, so
	 * those stamps are exact: its first chunk, a re-send, and every chunk
	 * from the one that reaches the bank's threshold (Early Close's) to the
	 * one that completes the flow. Any other chunk stamps last_ns only if
	 * the frame has a reading already (the heartbeat check's, the capture's). */
	__u32 chunks = pr->chunks;
	__u64 now = rx->now;
	if (!now && (!pr->first_ns || rx->retx || chunks >= rx->nchunks ||
		     (rx->thresh && chunks >= rx->thresh)))
		now = bpf_ktime_get_ns();
	if (!now)
		return;
	if (!pr->first_ns)
		pr->first_ns = now;
	pr->last_ns = now;
	if (!pr->thresh_ns && rx->thresh && chunks >= rx->thresh)
		pr->thresh_ns = now;
}

/* Store an admitted DATA packet's payload in its bank's reassembly memory
 * (ltp_mem) and mark it delivered; returns the verdict, its ACK (a chunk
 * delivered already is ACKed DUP and not written again).
 *
 * The copy's 1424 bytes of stores are still draining when it returns: the
 * first locked operation after it (the done bit's) waits for them, and
 * any store after it waits for room. So the ACK is written before the
 * copy (all of it but its SACK bytes, which overlay the payload, and the
 * trim), and what follows the copy is only what must: the SACK's one
 * store, the marking (delivered only once copied) and the trim. With
 * checksums to verify (LTP_CFG_CSUM), which the copy feeds, the ACK is made
 * after it, as the ACK of a chunk that does not verify is never made. */
static __always_inline int data_store(struct xdp_md *ctx, struct ltp_pkt *p, struct ltp_rx *rx)
{
	struct ltp_slot_stats *st = rx->st;
	__u32 bidx = rx->bank * LTP_SLOTS + rx->slot;
	struct ltp_bitmap *claim = ltp_claim.lookup(&bidx);
	struct ltp_bitmap *done = ltp_done.lookup(&bidx);
	struct ltp_progress *pr = ltp_progress.lookup(&bidx);
	if (!claim || !done || !pr)
		return XDP_DROP;
	__u32 chunk = rx->chunk;
	__u64 word = bitmap_word(chunk);
	if (word >= LTP_BM_WORDS)
		return XDP_DROP;
	__u64 bit = 1ULL << (chunk & 63);

	/* Claim first: of two copies racing on two CPUs exactly one writes. */
	if (!skipped(LTP_SKIP_CLAIM) && (__sync_fetch_and_or(&claim->w[word], bit) & bit)) {
		st->dup += 1;
		count(LTP_C_DUP);
		return send_ack(ctx, p, rx, LTP_RS_OPEN, LTP_F_DUP, &done->w[word]);
	}

	__u32 midx = bidx * LTP_MAX_CHUNKS + chunk;
	struct ltp_chunk *dst = ltp_mem.lookup(&midx);
	if (!dst)
		return XDP_DROP;
	/* Re-bound the length in a register the verifier can see. */
	__u64 n = rx->len;
	barrier_var(n);
	if (n > LTP_CHUNK_BYTES)
		return XDP_DROP;
	barrier_var(n);  /* keeps clang from merging the two tests */
	if (n < 4)
		return XDP_DROP;

	/* The ACK first (see above), its SACK the block's delivered bits with
	 * this chunk's, which the marking below sets. */
	int early = !skipped(LTP_SKIP_ACK) && !rx->csum;
	__u32 pay = 0;
	__u64 sack = 0, *sackp = NULL;
	if (early) {
		sackp = ack_sack_at(ctx, p->h);
		if (sackp)
			sack = sack_le64(done->w[word] | bit);
		/* This chunk ends its flow: its ACK already counts the flow out. */
		__u32 ending = !skipped(LTP_SKIP_MARK) && pr->chunks + 1 >= rx->nchunks &&
			       !(pr->flow & LTP_FLOW_DONE);
		pay = ack_rewrite(p, rx, LTP_RS_OPEN, sackp ? LTP_F_SACK : 0, sack, ending);
	}
	if (!skipped(LTP_SKIP_COPY) && bpf_xdp_load_bytes(ctx, PAY_OFF, dst, n))
		return drop(LTP_C_MALFORMED, 0);
	/* Corrupted in flight: the copy is never marked delivered nor ACKed,
	 * and the claim is given back, so a re-send of the chunk is written. */
	if (rx->csum && !udp_csum_ok(p->iph, p->udp, dst, n)) {
		__sync_fetch_and_and(&claim->w[word], ~bit);
		count(LTP_C_BAD_CSUM);
		return XDP_DROP;
	}
	barrier_var(sackp);  /* tested as itself: clang would test what it derives from */
	if (sackp) {
		if ((void *)(sackp + 1) > (void *)(long)ctx->data_end)
			return XDP_DROP;
		*sackp = sack;
	}
	if (!skipped(LTP_SKIP_MARK))
		data_mark(rx, done, pr, word, bit);
	if (!skipped(LTP_SKIP_COUNT))
		st->delivered += 1;
	count(LTP_C_DATA);
	if (skipped(LTP_SKIP_ACK))
		return XDP_TX;
	if (early)
		return ack_send(ctx, rx, pay);
	return send_ack(ctx, p, rx, LTP_RS_OPEN, 0, &done->w[word]);
}

/* DATA to this host's port (a whole LTP header at p->h): admitted, stored,
 * ACKed; now: the clock as read already for this frame, or 0. */
static __always_inline int on_data(struct xdp_md *ctx, struct ltp_pkt *p, struct ltp_cfg *cfg,
				   __u64 now)
{
	struct ltp_rx rx = {.now = now, .retx = p->h->flags & bpf_htons(LTP_F_RETX)};
	int verdict = data_admit(ctx, p, cfg, &rx);
	if (verdict != LTP_ADMITTED)
		return verdict;
	return data_store(ctx, p, &rx);
}

#endif /* LTP_DATA_H */
