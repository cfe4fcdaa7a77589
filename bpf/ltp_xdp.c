/* ltp_xdp: the LTP receive path at the NIC, for both roles.
 *
 * DATA  -> validate, drop-and-count bad classes, copy the payload into the
 *          round bank's reassembly memory (ltp_mem), mark the chunk in the
 *          delivery bitmaps, rewrite the packet into its ACK and XDP_TX it.
 *          DATA flagged GROUP (one packet to many receivers) is taken
 *          for this host's own worker id (ltp_cfg.self_*).
 * ACK   -> record the chunk as acknowledged for the sender (ltp_acked,
 *          ltp_tx) and XDP_DROP; the ACK of clocked DATA (LTP_F_CLOCK) is
 *          instead grown into the flow's next chunk from ltp_sendbuf and
 *          sent with XDP_TX, unless the receiver's credit said STOP or
 *          nothing is left (the ACK clock, docs/transport.md).
 * Both must carry the round's token (ltp_hdr.token, set per round by the
 * control plane in ltp_banks and ltp_tx); others are dropped as bad_token.
 * other -> XDP_PASS untouched (LTP control types are passed up too).
 *
 * While `ltp capture` has switched capture on (ltp_capcfg), each LTP frame
 * is also copied, as it arrived, into the ring buffer ltp_capring with a
 * kernel timestamp and the verdict the program gave it (ltp_xdp, at the end).
 *
 * Every host loads this one program: a parameter server receives DATA and
 * sends ACKs; a worker receives the ACKs of its pushes and the DATA of the
 * parameter downlink. Compiled by bcc (dataplane/loader.py) with geometry
 * passed as -D defines.
 */
#include <uapi/linux/bpf.h>
#include <linux/in.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/udp.h>

#include "ltp_wire.h"
#include "ltp_maps.h"

#define L3_OFF   (sizeof(struct ethhdr))
#define L4_OFF   (L3_OFF + sizeof(struct iphdr))
#define LTP_OFF  (L4_OFF + sizeof(struct udphdr))
#define PAY_OFF  (LTP_OFF + sizeof(struct ltp_hdr))

#ifndef LTP_BENCH_ALWAYS_COPY
#define LTP_BENCH_ALWAYS_COPY 0
#endif

static __always_inline void count(u32 idx)
{
	u64 *v = ltp_counters.lookup(&idx);
	if (v)
		*v += 1;
}

/* Count a drop class and keep the offending header for `ltp flows`. */
static __always_inline int drop(u32 idx, struct ltp_hdr *h)
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

/* Bitmap word of a chunk, opaque to clang so the bound test that follows
 * stays in the program for the verifier (LTP_BM_WORDS need not be a power
 * of two). */
static __always_inline u64 bitmap_word(u32 chunk)
{
	u64 word = chunk >> 6;
	asm volatile("" : "+r"(word));
	return word;
}

static __always_inline __u16 ltp_csum_fold(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

struct pseudo_hdr {
	__be32 saddr;
	__be32 daddr;
	__u8 zero;
	__u8 proto;
	__be16 len;
};

/* The UDP checksum of an LTP frame: pseudo header, UDP and LTP headers,
 * plus the payload's sum (0 for an ACK, which has none). */
static __always_inline void udp_csum(struct iphdr *iph, struct udphdr *udp, __u32 payload_sum)
{
	struct pseudo_hdr ph = {
		.saddr = iph->saddr,
		.daddr = iph->daddr,
		.zero = 0,
		.proto = IPPROTO_UDP,
		.len = udp->len,
	};
	udp->check = 0;
	__u64 sum = (__u32)bpf_csum_diff(0, 0, (__be32 *)&ph, sizeof(ph), 0);
	sum = (__u32)bpf_csum_diff(0, 0, (__be32 *)udp, sizeof(*udp) + sizeof(struct ltp_hdr),
				   (__u32)sum);
	sum += payload_sum;
	sum = (sum & 0xffffffff) + (sum >> 32);
	__u16 c = ltp_csum_fold((__u32)sum);
	udp->check = c ? c : 0xffff;
}

/* The credit of a clocked flow (LTP_F_CLOCK DATA), as the ACK carries it:
 * each flow not finished may keep window / active packets in flight (at
 * least 1), so all of them together keep about the bank's window (the
 * bottleneck's buffer plus one BDP). The DATA's stamp says how many its flow
 * had in flight when it left and how many STOPs its sender had seen; less
 * the STOPs sent since, that is what it has now. More than its credit: this
 * ACK says STOP (the sender consumes it: one packet fewer in flight). */
/* Turn a frame around: swap MACs, addresses and ports, size it for an LTP
 * header plus `payload` bytes, and checksum the IP header (the UDP checksum
 * comes last, once the LTP header is written: udp_csum). */
static __always_inline void turn_around(struct ethhdr *eth, struct iphdr *iph,
					struct udphdr *udp, u32 payload)
{
	unsigned char mac[ETH_ALEN];
	__builtin_memcpy(mac, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, mac, ETH_ALEN);

	__be32 a = iph->saddr;
	iph->saddr = iph->daddr;
	iph->daddr = a;
	iph->tot_len = bpf_htons(sizeof(*iph) + sizeof(*udp) + sizeof(struct ltp_hdr) + payload);
	iph->ttl = 64;
	iph->check = 0;
	iph->check = ltp_csum_fold(bpf_csum_diff(0, 0, (__be32 *)iph, sizeof(*iph), 0));

	__be16 p = udp->source;
	udp->source = udp->dest;
	udp->dest = p;
	udp->len = bpf_htons(sizeof(*udp) + sizeof(struct ltp_hdr) + payload);
}

static __always_inline u32 credit(struct ltp_hdr *h, u32 bank, u32 slot, u16 *extra)
{
	struct ltp_share *sh = ltp_share.lookup(&bank);
	u32 window = sh ? sh->window : 0;
	if (!window)
		return 0xffff;
	u32 active = sh->active;
	u32 allow = window / (active ? active : 1);
	if (!allow)
		allow = 1;
	u32 bidx = bank * LTP_SLOTS + slot;
	struct ltp_progress *pr = ltp_progress.lookup(&bidx);
	if (!pr)
		return allow;
	u32 stamp = bpf_ntohl(h->rate);
	u32 owed = ((u32)pr->stops - stamp) & 0xffff;  /* STOPs it had not seen */
	u32 inflight = stamp >> 16;
	if (inflight > owed && inflight - owed > allow) {
		__sync_fetch_and_add(&pr->stops, 1);
		count(LTP_C_CREDIT_STOP);
		*extra |= LTP_F_STOP;
	}
	return allow;
}

/* Turn the DATA packet at ctx into its ACK in place and return XDP_TX:
 * addresses and ports swapped, payload cut off, IP and UDP checksums right. */
static __always_inline int send_ack(struct xdp_md *ctx, struct ethhdr *eth,
				    struct iphdr *iph, struct udphdr *udp,
				    struct ltp_hdr *h, u8 rstate, u16 extra_flags,
				    u32 slot, u32 bank)
{
	turn_around(eth, iph, udp, 0);

	/* The rate this sender may use: its share of the bank's capacity among
	 * the flows active right now, or the per-slot rate if none is set; a
	 * clocked flow's credit instead (in packets). */
	u32 rate = 0;
	struct ltp_share *sh = ltp_share.lookup(&bank);
	if ((h->flags & bpf_htons(LTP_F_CLOCK)) && rstate == LTP_RS_OPEN) {
		u16 more = 0;
		rate = credit(h, bank, slot, &more);
		extra_flags |= more;
	} else if (sh && sh->share_kbps) {
		u32 active = sh->active;
		rate = sh->share_kbps / (active ? active : 1);
	} else {
		u32 *r = ltp_rate.lookup(&slot);
		rate = r ? *r : 0;
	}
	h->type = LTP_T_ACK;
	h->flags = h->flags | bpf_htons(extra_flags);
	h->len = 0;
	h->state = rstate;
	h->pad = 0;
	h->rate = bpf_htonl(rate);
	udp_csum(iph, udp, 0);

	int delta = (int)(PAY_OFF) - (int)(ctx->data_end - ctx->data);
	if (delta < 0 && bpf_xdp_adjust_tail(ctx, delta)) {
		count(LTP_C_ACK_FAIL);
		return XDP_DROP;
	}
	count(LTP_C_ACK_TX);
	struct ltp_slot_stats *st = ltp_stats.lookup(&slot);
	if (st)
		st->acks_tx += 1;
	return XDP_TX;
}

/* Is the receiving control plane's heartbeat (ltp_cfg.beat_ns) older than
 * its limit? Sets *now when it read the clock. No heartbeat yet, or no
 * limit: not stale (programs nobody beats for, e.g. `ltp load`ed ones, ACK
 * as before). Signed, so a beat a little ahead of this CPU's clock is fresh. */
static __always_inline int owner_stale(struct ltp_cfg *cfg, u64 *now)
{
	u64 beat = cfg->beat_ns, limit = cfg->limit_ns;
	if (!beat || !limit)
		return 0;
	*now = bpf_ktime_get_ns();
	return (s64)(*now - beat) > (s64)limit;
}

/* The slot of the packet's worker id; nonzero if the worker is unknown. */
static __always_inline int peer_slot(struct ltp_hdr *h, u32 *slot)
{
	u32 worker = bpf_ntohs(h->worker);
	u32 *slotp = ltp_peers.lookup(&worker);
	if (!slotp || *slotp == 0 || *slotp > LTP_SLOTS)
		return -1;
	*slot = *slotp - 1;
	return 0;
}

static __always_inline int on_data(struct xdp_md *ctx, struct ethhdr *eth,
				   struct iphdr *iph, struct udphdr *udp,
				   struct ltp_hdr *h, struct ltp_cfg *cfg)
{
	if (h->flags & bpf_htons(LTP_F_GROUP)) {
		/* Sent to a group: this host takes it as addressed to itself, so
		 * its slot is its own id's and the ACK (built by swapping) names
		 * this worker and leaves from this host's MAC and address, not
		 * the group's. */
		if (!(cfg->flags & LTP_CFG_SELF))
			return drop(LTP_C_UNKNOWN_WORKER, h);
		h->worker = bpf_htons(cfg->self_worker);
		__builtin_memcpy(eth->h_dest, cfg->self_mac, ETH_ALEN);
		iph->daddr = cfg->self_ip;
	}
	u32 slot;
	if (peer_slot(h, &slot))
		return drop(LTP_C_UNKNOWN_WORKER, h);
	struct ltp_slot_stats *st = ltp_stats.lookup(&slot);
	if (!st)
		return XDP_DROP;

	u32 len = bpf_ntohs(h->len);
	u32 pkt_len = ctx->data_end - ctx->data;
	if (len == 0 || len > LTP_CHUNK_BYTES || (len & 3) ||
	    bpf_ntohs(udp->len) != sizeof(*udp) + sizeof(*h) + len ||
	    bpf_ntohs(iph->tot_len) != sizeof(*iph) + sizeof(*udp) + sizeof(*h) + len ||
	    pkt_len < PAY_OFF + len)
		return drop(LTP_C_MALFORMED, h);

	u32 round = bpf_ntohl(h->round);
	u32 bank = round % LTP_BANKS;
	struct ltp_bank *b = ltp_banks.lookup(&bank);
	if (!b)
		return XDP_DROP;
	if (b->state == LTP_BANK_FREE || (s32)(round - b->round) > 0) {
		st->future += 1;
		return drop(LTP_C_FUTURE, h);
	}
	if (round != b->round) {
		st->stale += 1;
		return drop(LTP_C_STALE, h);
	}
	/* Before anything is written or ACKed, closed rounds included: without
	 * the round's token a packet is a spoof (or from another secret). */
	if (h->token != b->token)
		return drop_spoof();
	if (b->state != LTP_BANK_OPEN) {
		/* Late for a closed round: never written, but ACKed CLOSED so the
		 * sender stops at once. */
		st->late += 1;
		count(LTP_C_LATE);
		return send_ack(ctx, eth, iph, udp, h, LTP_RS_CLOSED, 0, slot, bank);
	}
	/* An ACK promises a live reader: with a stale heartbeat the round's
	 * owner is hung, and its senders must hear nothing. */
	u64 now = 0;
	if (owner_stale(cfg, &now))
		return drop(LTP_C_STALE_OWNER, h);

	u32 chunk = bpf_ntohl(h->chunk);
	u32 nchunks = b->nchunks;
	if (chunk >= LTP_MAX_CHUNKS || chunk >= nchunks ||
	    bpf_ntohl(h->nchunks) != nchunks ||
	    (chunk + 1 == nchunks ? len != b->last_len : len != LTP_CHUNK_BYTES)) {
		st->out_of_range += 1;
		return drop(LTP_C_OUT_OF_RANGE, h);
	}

	st->rx_packets += 1;
	st->rx_bytes += len;

	u32 bidx = bank * LTP_SLOTS + slot;
	struct ltp_bitmap *claim = ltp_claim.lookup(&bidx);
	struct ltp_bitmap *done = ltp_done.lookup(&bidx);
	struct ltp_progress *pr = ltp_progress.lookup(&bidx);
	if (!claim || !done || !pr)
		return XDP_DROP;
	u64 word = bitmap_word(chunk);
	if (word >= LTP_BM_WORDS)
		return XDP_DROP;
	u64 bit = 1ULL << (chunk & 63);

	/* Claim first: of two copies racing on two CPUs exactly one writes.
	 * (LTP_BENCH_ALWAYS_COPY: `ltp bench xdp` repeats one packet and wants
	 * every repetition to take the full copy path.) */
	if ((__sync_fetch_and_or(&claim->w[word], bit) & bit) && !LTP_BENCH_ALWAYS_COPY) {
		st->dup += 1;
		count(LTP_C_DUP);
		return send_ack(ctx, eth, iph, udp, h, LTP_RS_OPEN, LTP_F_DUP, slot, bank);
	}

	u32 midx = bidx * LTP_MAX_CHUNKS + chunk;
	struct ltp_chunk *dst = ltp_mem.lookup(&midx);
	if (!dst)
		return XDP_DROP;
	/* Re-bound the length in a register the verifier can see. */
	u64 n = len;
	asm volatile("" : "+r"(n));
	if (n > LTP_CHUNK_BYTES)
		return XDP_DROP;
	asm volatile("" : "+r"(n));  /* keeps clang from merging the two tests */
	if (n < 4)
		return XDP_DROP;
	if (bpf_xdp_load_bytes(ctx, PAY_OFF, dst, n))
		return drop(LTP_C_MALFORMED, 0);

	/* The done bit is what user space trusts: set only after the copy. */
	__sync_fetch_and_or(&done->w[word], bit);
	__sync_fetch_and_add(&pr->chunks, 1);
	/* This slot's last chunk ends its flow: one fewer to share with. The
	 * fetch-or on a flag makes that count once across CPUs (bcc's target has
	 * no fetch-add with a result). */
	struct ltp_share *sh = ltp_share.lookup(&bank);
	if (sh && pr->chunks >= nchunks &&
	    !(__sync_fetch_and_or(&pr->flow, LTP_FLOW_DONE) & LTP_FLOW_DONE) && sh->active)
		__sync_fetch_and_add(&sh->active, (u32)-1);  /* no atomic sub in BPF */
	if (h->flags & bpf_htons(LTP_F_RETX))
		__sync_fetch_and_add(&pr->retx, 1);
	__sync_fetch_and_add(&pr->bytes, len);
	if (!now)
		now = bpf_ktime_get_ns();
	if (!pr->first_ns)
		pr->first_ns = now;
	pr->last_ns = now;
	st->delivered += 1;
	count(LTP_C_DATA);
	return send_ack(ctx, eth, iph, udp, h, LTP_RS_OPEN, 0, slot, bank);
}

/* ---- the ACK clock (sender side; docs/transport.md) ---- */

/* An ACK the clock does not turn into DATA: the packet it stood for leaves
 * the flight, counted in `consumed`. */
static __always_inline int clock_consume(struct ltp_tx *tx, u32 why)
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
static __always_inline int clock_drop(u32 why)
{
	count(why);
	return XDP_DROP;
}

/* An ACK that could not become the DATA it was to carry: consumed, unless
 * it was to carry a re-send, for which it was counted consumed already. */
static __always_inline int clock_give_up(struct ltp_tx *tx, u32 why, u32 more_flags)
{
	if (more_flags & LTP_F_RETX)
		return clock_drop(why);
	return clock_consume(tx, why);
}

/* Rewrite the frame at ctx, an ACK grown to hold `len` payload bytes, into
 * DATA of `chunk` back to where the ACK came from; XDP_TX. */
static __always_inline int clock_headers(struct xdp_md *ctx, struct ltp_tx *tx,
					 struct ltp_sendslot *so, u32 chunk, u32 len, u32 more_flags)
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

	u32 flags = tx->flags | LTP_F_CLOCK | more_flags;
	if (so->chunk & LTP_SO_CRITICAL)
		flags |= LTP_F_CRITICAL;
	if (chunk + 1 == tx->nchunks)
		flags |= LTP_F_LAST;
	u64 added = tx->added, consumed = tx->consumed;
	u64 inflight = added > consumed ? added - consumed : 0;
	h->type = LTP_T_DATA;
	h->flags = bpf_htons(flags);
	h->chunk = bpf_htonl(chunk);
	h->len = bpf_htons(len);
	h->state = 0;
	h->pad = 0;
	h->rate = bpf_htonl(LTP_CLOCK_STAMP((u32)(inflight > 0xffff ? 0xffff : inflight),
					    (u32)tx->stops));
	udp_csum(iph, udp, so->csum);  /* the payload's sum, from the control plane */
	__sync_fetch_and_add(&tx->sent, 1);
	count(LTP_C_CLOCK_TX);
	return XDP_TX;
}

/* Log a DATA this flow sends (order position pos, chunk), for RACK in XDP:
 * the log's next seq (fetch-add, so two CPUs never share one) holds pos,
 * and the chunk's ltp_sentat entry names that seq (+ 1): an older entry of
 * the chunk is superseded. */
static __always_inline void clock_log(struct ltp_tx *tx, u32 flow, u32 pos, u32 chunk)
{
	u64 seq = __sync_fetch_and_add(&tx->xseq, 1);
	u32 lidx = flow * LTP_SENDLOG + (u32)(seq % LTP_SENDLOG);
	u32 *l = ltp_sendlog.lookup(&lidx);
	if (l)
		*l = pos;
	u32 sidx = flow * LTP_MAX_CHUNKS + chunk;
	u64 *sa = ltp_sentat.lookup(&sidx);
	if (sa)
		*sa = seq + 1;
}

/* Grow the ACK at ctx into DATA of order position pos (its payload from
 * ltp_sendbuf), logged for RACK when the flow has it on; XDP_TX. */
static __always_inline int clock_emit(struct xdp_md *ctx, struct ltp_tx *tx, u32 bank,
				      u32 flow, u64 pos, u32 more_flags)
{
	if (pos >= LTP_MAX_CHUNKS)
		return clock_give_up(tx, LTP_C_CLOCK_IDLE, more_flags);
	u32 oidx = bank * LTP_MAX_CHUNKS + (u32)pos;
	struct ltp_sendslot *so = ltp_sendorder.lookup(&oidx);
	if (!so)
		return clock_give_up(tx, LTP_C_CLOCK_IDLE, more_flags);
	u32 chunk = so->chunk & LTP_SO_CHUNK;
	u32 nch = tx->nchunks;
	if (chunk >= nch || chunk >= LTP_MAX_CHUNKS)
		return clock_give_up(tx, LTP_C_CLOCK_IDLE, more_flags);
	u32 sidx = bank * LTP_MAX_CHUNKS + chunk;
	struct ltp_chunk *src = ltp_sendbuf.lookup(&sidx);
	if (!src)
		return clock_give_up(tx, LTP_C_CLOCK_IDLE, more_flags);
	u64 n = chunk + 1 == nch ? tx->last_len : LTP_CHUNK_BYTES;
	asm volatile("" : "+r"(n));
	if (n > LTP_CHUNK_BYTES)
		return clock_give_up(tx, LTP_C_GROW_FAIL, more_flags);
	asm volatile("" : "+r"(n));  /* keeps clang from merging the two tests */
	if (n < 4)
		return clock_give_up(tx, LTP_C_GROW_FAIL, more_flags);
	u32 plen = ctx->data_end - ctx->data;
	asm volatile("" : "+r"(plen));  /* a length, not pointer arithmetic on pkt_end */
	/* A trim (clock_send grew it) and a copy into the room it made: neither
	 * fails in practice; if one did, the chunk waits for a re-send. */
	if (bpf_xdp_adjust_tail(ctx, (int)(PAY_OFF + n) - (int)plen))
		return clock_drop(LTP_C_GROW_FAIL);
	if (bpf_xdp_store_bytes(ctx, PAY_OFF, src, n))
		return clock_drop(LTP_C_GROW_FAIL);
	if (tx->rack)
		clock_log(tx, flow, (u32)pos, chunk);
	return clock_headers(ctx, tx, so, chunk, (u32)n, more_flags);
}

/* RACK over the flow's log: the order position of the oldest logged DATA
 * still unacknowledged while one logged more than LTP_RACK_REORDER later
 * was acked (lost: its DATA or its ACK), or -1. Looks at LTP_RACK_SCAN
 * entries at most, moving `scan` past those judged: acked ones, and those
 * superseded (sent again since, by XDP or by the control plane, which
 * zeroes ltp_sentat when it takes a chunk over). Two CPUs judging at once
 * may pick one entry twice: a duplicate re-send, never a lost one. */
static __always_inline s64 rack_lost(struct ltp_tx *tx, struct ltp_bitmap *acked,
				     u32 bank, u32 flow)
{
	for (int i = 0; i < LTP_RACK_SCAN; i++) {
		u64 at = tx->scan;
		if (at >= tx->xseq || at + LTP_RACK_REORDER >= tx->newest)
			return -1;
		tx->scan = at + 1;
		u32 lidx = flow * LTP_SENDLOG + (u32)(at % LTP_SENDLOG);
		u32 *l = ltp_sendlog.lookup(&lidx);
		if (!l)
			return -1;
		u32 pos = *l;
		if (pos >= LTP_MAX_CHUNKS)
			continue;
		u32 oidx = bank * LTP_MAX_CHUNKS + pos;
		struct ltp_sendslot *so = ltp_sendorder.lookup(&oidx);
		if (!so)
			continue;
		u32 chunk = so->chunk & LTP_SO_CHUNK;
		u32 sidx = flow * LTP_MAX_CHUNKS + chunk;
		u64 *sa = ltp_sentat.lookup(&sidx);
		if (!sa || *sa != at + 1)
			continue;  /* superseded */
		u64 word = bitmap_word(chunk);
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
				      struct ltp_bitmap *acked, u32 bank, u32 flow)
{
	/* Grow to a full chunk before anything is taken: a frame that cannot
	 * grow (too little tailroom) is consumed with nothing handed out, so
	 * the control plane sees one packet fewer in flight and sends it
	 * again. Taking a position first and failing after lost that chunk
	 * until the control plane's RTO (2 ms a round, most often at a flow's
	 * end). clock_emit trims the frame to the chunk's length. */
	if (tx->next >= tx->tail && !(tx->rack && tx->scan < tx->xseq &&
				       tx->scan + LTP_RACK_REORDER < tx->newest))
		return clock_consume(tx, LTP_C_CLOCK_IDLE);  /* a peek: nothing to send */
	u32 plen = ctx->data_end - ctx->data;
	asm volatile("" : "+r"(plen));
	if (bpf_xdp_adjust_tail(ctx, (int)(PAY_OFF + LTP_CHUNK_BYTES) - (int)plen))
		return clock_consume(tx, LTP_C_GROW_FAIL);
	if (tx->rack) {
		s64 lost = rack_lost(tx, acked, bank, flow);
		if (lost >= 0) {
			__sync_fetch_and_add(&tx->consumed, 1);
			__sync_fetch_and_add(&tx->rexmit, 1);
			count(LTP_C_CLOCK_RETX);
			return clock_emit(ctx, tx, bank, flow, (u64)lost, LTP_F_RETX);
		}
	}
	u64 pos = __sync_fetch_and_add(&tx->next, 1);
	if (pos < tx->tail)
		return clock_emit(ctx, tx, bank, flow, pos, 0);
	return clock_consume(tx, LTP_C_CLOCK_IDLE);
}

/* The newest log entry an ACK of `chunk` acknowledges (RACK's clock). */
static __always_inline void rack_acked(struct ltp_tx *tx, u32 flow, u32 chunk)
{
	u32 sidx = flow * LTP_MAX_CHUNKS + chunk;
	u64 *sa = ltp_sentat.lookup(&sidx);
	if (sa && *sa && *sa - 1 > tx->newest)
		tx->newest = *sa - 1;
}

static __always_inline int on_ack(struct xdp_md *ctx, struct ltp_hdr *h)
{
	u32 slot;
	if (peer_slot(h, &slot))
		return drop(LTP_C_UNKNOWN_WORKER, h);
	struct ltp_slot_stats *st = ltp_stats.lookup(&slot);
	u32 round = bpf_ntohl(h->round);
	u32 bank = round % LTP_BANKS;
	u32 bidx = bank * LTP_SLOTS + slot;
	struct ltp_tx *tx = ltp_tx.lookup(&bidx);
	struct ltp_bitmap *acked = ltp_acked.lookup(&bidx);
	if (!tx || !acked || !st)
		return XDP_DROP;
	if (tx->round != round) {
		st->acks_stale += 1;
		return drop(LTP_C_ACK_STALE, h);
	}
	/* Only an ACK built from our own DATA carries the token: a spoofed one
	 * neither closes the round nor marks a chunk nor sets the rate. */
	if (h->token != tx->token)
		return drop_spoof();
	u16 hflags = bpf_ntohs(h->flags);
	if (h->state == LTP_RS_CLOSED)
		tx->closed = 1;
	u32 rate = bpf_ntohl(h->rate);
	if (!(hflags & LTP_F_CLOCK)) {
		tx->rate_kbps = rate;
	} else if (h->state == LTP_RS_OPEN) {  /* a credit, in packets */
		tx->window = rate;
		if (!tx->window_min || rate < tx->window_min)
			tx->window_min = rate;
	}
	st->acks_rx += 1;
	count(LTP_C_ACK_RX);
	u32 chunk = bpf_ntohl(h->chunk);
	if (chunk >= LTP_MAX_CHUNKS)
		return XDP_DROP;
	u64 word = bitmap_word(chunk);
	if (word >= LTP_BM_WORDS)
		return XDP_DROP;
	u64 bit = 1ULL << (chunk & 63);
	u64 had = 0;
	/* A CLOSED ACK for a late chunk does not mean it was delivered. */
	if (h->state != LTP_RS_CLOSED) {
		had = __sync_fetch_and_or(&acked->w[word], bit) & bit;
		if (!had)
			__sync_fetch_and_add(&tx->acked, 1);
	}
	if (!(hflags & LTP_F_CLOCK) || !tx->clock)
		return XDP_DROP;
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

/* The program proper: parse, dispatch, and the verdict. */
static __always_inline int ltp_run(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;

	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		goto pass;
	struct iphdr *iph = (void *)(eth + 1);
	if ((void *)(iph + 1) > data_end || iph->protocol != IPPROTO_UDP)
		goto pass;
	struct udphdr *udp = (void *)iph + sizeof(*iph);
	if (iph->ihl != 5)  /* LTP never sends IP options */
		goto pass;
	if ((void *)(udp + 1) > data_end)
		goto pass;
	if (udp->dest != bpf_htons(LTP_PORT) && udp->source != bpf_htons(LTP_PORT))
		goto pass;
	/* From here on the packet is addressed to or from our port. */
	if (iph->frag_off & bpf_htons(0x3fff))
		return drop(LTP_C_MALFORMED, 0);
	struct ltp_hdr *h = (void *)(udp + 1);
	if ((void *)(h + 1) > data_end)
		return drop(LTP_C_MALFORMED, 0);
	if (h->magic != bpf_htons(LTP_MAGIC))
		return drop(LTP_C_BAD_MAGIC, h);
	if (h->version != LTP_VERSION)
		return drop(LTP_C_BAD_VERSION, h);
	u32 zero = 0;
	struct ltp_cfg *cfg = ltp_cfg.lookup(&zero);
	if (!cfg)
		return XDP_DROP;
	if (cfg->job && bpf_ntohl(h->job) != cfg->job)
		return drop(LTP_C_FOREIGN_JOB, h);

	if (h->type == LTP_T_DATA && udp->dest == bpf_htons(LTP_PORT))
		return on_data(ctx, eth, iph, udp, h, cfg);
	if (h->type == LTP_T_ACK && udp->source == bpf_htons(LTP_PORT))
		return on_ack(ctx, h);
	if (h->type >= LTP_T_CTRL_MIN && h->type <= LTP_T_CTRL_MAX) {
		count(LTP_C_CTRL);
		return XDP_PASS;
	}
	return drop(LTP_C_MALFORMED, h);
pass:
	count(LTP_C_PASS);
	return XDP_PASS;
}

/* ---- capture (ltp_capcfg, ltp_capring; `ltp capture`) ---- */

/* Copy up to snaplen bytes of the frame at ctx into rec. Zero on success. */
static __always_inline int cap_copy(struct xdp_md *ctx, struct ltp_cap_rec *rec, u32 snaplen)
{
	u32 wire = ctx->data_end - ctx->data;
	u64 n = wire < snaplen ? wire : snaplen;
	/* Re-bound in a register the verifier sees (as for the payload copy). */
	asm volatile("" : "+r"(n));
	if (n > LTP_CAP_FRAME_MAX)
		n = LTP_CAP_FRAME_MAX;
	asm volatile("" : "+r"(n));
	if (n < 1)
		return -1;
	if (bpf_xdp_load_bytes(ctx, 0, rec->data, n))
		return -1;
	rec->wire_len = wire;
	rec->cap_len = n;
	return 0;
}

/* Output rec into the ring; a full ring is counted as lost, not retried. */
static __always_inline void cap_emit(struct ltp_cap_rec *rec)
{
	u32 zero = 0;
	struct ltp_cap_stats *cs = ltp_capstat.lookup(&zero);
	u64 n = rec->cap_len;
	asm volatile("" : "+r"(n));
	if (n > LTP_CAP_FRAME_MAX)
		return;
	if (ltp_capring.ringbuf_output(rec, LTP_CAP_HDR_LEN + n, 0)) {
		if (cs)
			cs->lost += 1;
	} else if (cs) {
		cs->captured += 1;
	}
}

/* A snapshot of the frame at ctx if capture is on and the frame is LTP
 * (UDP to or from the port, as ltp_run judges it) and passes the filters;
 * NULL otherwise. Taken before ltp_run, which may rewrite the frame. */
static __always_inline struct ltp_cap_rec *cap_begin(struct xdp_md *ctx, struct ltp_capcfg *cc)
{
	u64 now = bpf_ktime_get_ns();
	if (now >= cc->until_ns)
		return NULL;
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return NULL;
	struct iphdr *iph = (void *)(eth + 1);
	if ((void *)(iph + 1) > data_end || iph->protocol != IPPROTO_UDP || iph->ihl != 5)
		return NULL;
	struct udphdr *udp = (void *)(iph + 1);
	if ((void *)(udp + 1) > data_end)
		return NULL;
	if (udp->dest != bpf_htons(LTP_PORT) && udp->source != bpf_htons(LTP_PORT))
		return NULL;
	u32 flags = cc->flags;
	if (flags & (LTP_CAP_F_JOB | LTP_CAP_F_WORKER | LTP_CAP_F_ROUND)) {
		struct ltp_hdr *h = (void *)(udp + 1);
		if ((void *)(h + 1) > data_end)
			return NULL;
		if ((flags & LTP_CAP_F_JOB) && bpf_ntohl(h->job) != cc->job)
			return NULL;
		if ((flags & LTP_CAP_F_WORKER) && bpf_ntohs(h->worker) != cc->worker)
			return NULL;
		if ((flags & LTP_CAP_F_ROUND) && bpf_ntohl(h->round) != cc->round)
			return NULL;
	}
	u32 zero = 0;
	struct ltp_cap_rec *rec = ltp_capbuf.lookup(&zero);
	if (!rec || cap_copy(ctx, rec, cc->snaplen))
		return NULL;
	rec->ts_ns = now;
	rec->dir = LTP_CAP_RX;
	rec->ifindex = ctx->ingress_ifindex;
	rec->cpu = bpf_get_smp_processor_id();
	return rec;
}

/* Stamp the verdict on the snapshot and output it; with LTP_CAP_F_TX also
 * the frame XDP_TX sends (the ACK the program made of it). */
static __always_inline void cap_end(struct xdp_md *ctx, struct ltp_capcfg *cc,
				    struct ltp_cap_rec *rec, int verdict)
{
	rec->verdict = verdict;
	cap_emit(rec);
	if (verdict != XDP_TX || !(cc->flags & LTP_CAP_F_TX))
		return;
	if (cap_copy(ctx, rec, cc->snaplen))
		return;
	rec->ts_ns = bpf_ktime_get_ns();
	rec->dir = LTP_CAP_TX;
	cap_emit(rec);
}

int ltp_xdp(struct xdp_md *ctx)
{
	/* Capture off (until_ns 0) costs this lookup and one test. */
	u32 zero = 0;
	struct ltp_capcfg *cc = ltp_capcfg.lookup(&zero);
	struct ltp_cap_rec *rec = NULL;
	if (cc && cc->until_ns)
		rec = cap_begin(ctx, cc);
	int verdict = ltp_run(ctx);
	if (rec && cc)
		cap_end(ctx, cc, rec, verdict);
	return verdict;
}
