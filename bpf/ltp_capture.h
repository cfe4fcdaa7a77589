// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/* Capture at the NIC (ltp_capcfg, ltp_capring; `ltp capture`). While
 * capture is on, ltp_xdp takes a snapshot of each LTP frame before ltp_run
 * (cap_begin), which may rewrite it, and outputs it stamped with the
 * verdict after (cap_end), with the frame XDP_TX sends when asked to.
 */
#ifndef LTP_CAPTURE_H
#define LTP_CAPTURE_H

#include "ltp_maps.h"
#include "ltp_util.h"
#include "ltp_parse.h"

/* Copy up to snaplen bytes of the frame at ctx into rec. Zero on success. */
static __always_inline int cap_copy(struct xdp_md *ctx, struct ltp_cap_rec *rec, __u32 snaplen)
{
	__u32 wire = ctx->data_end - ctx->data;
	__u64 n = wire < snaplen ? wire : snaplen;
	/* Re-bound in a register the verifier sees (as for the payload copy). */
	barrier_var(n);
	if (n > LTP_CAP_FRAME_MAX)
		n = LTP_CAP_FRAME_MAX;
	barrier_var(n);
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
	__u32 zero = 0;
	struct ltp_cap_stats *cs = ltp_capstat.lookup(&zero);
	__u64 n = rec->cap_len;
	barrier_var(n);
	if (n > LTP_CAP_FRAME_MAX)
		return;
	if (ltp_capring.ringbuf_output(rec, LTP_CAP_HDR_LEN + n, 0)) {
		if (cs)
			cs->lost += 1;
	} else if (cs) {
		cs->captured += 1;
	}
}

/* A snapshot of the frame at ctx if capture is on and the frame is LTP (as
 * ltp_parse judges it, as for ltp_run) and passes the filters; NULL
 * otherwise. Taken before ltp_run, which may rewrite the frame. Sets
 * *nowp to the clock it read. */
static __always_inline struct ltp_cap_rec *cap_begin(struct xdp_md *ctx, struct ltp_capcfg *cc,
						     __u64 *nowp)
{
	__u64 now = bpf_ktime_get_ns();
	*nowp = now;
	if (now >= cc->until_ns)
		return NULL;
	struct ltp_pkt p;
	int parsed = ltp_parse(ctx, &p);
	if (parsed == LTP_OTHER)
		return NULL;
	__u32 flags = cc->flags;
	if (flags & (LTP_CAP_F_JOB | LTP_CAP_F_WORKER | LTP_CAP_F_ROUND)) {
		if (parsed != LTP_WHOLE)
			return NULL;
		struct ltp_hdr *h = p.h;
		if ((flags & LTP_CAP_F_JOB) && bpf_ntohl(h->job) != cc->job)
			return NULL;
		if ((flags & LTP_CAP_F_WORKER) && bpf_ntohs(h->worker) != cc->worker)
			return NULL;
		if ((flags & LTP_CAP_F_ROUND) && bpf_ntohl(h->round) != cc->round)
			return NULL;
	}
	__u32 zero = 0;
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

#endif /* LTP_CAPTURE_H */
