// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/* ltp_floor: the copy floor of the DATA path, for `ltp bench xdp`
 * (control/bench/xdp_stages.py). It does only what no LTP receive program
 * can skip: read a DATA packet's round and chunk, look up that chunk's slot
 * in ltp_mem (slot 0 of the round's bank: ltp_xdp's maps, geometry and
 * memory layout) and copy the payload there, then XDP_TX. No checks, no
 * bitmaps, no counters, no ACK: never loaded on a device. Built with
 * LTP_FLOOR_PUBLISH, it also sets the chunk's done bit (the bench's
 * published floor).
 */
/* The program's license string (bcc's footer puts it in the license
 * section): the dual licence of the SPDX line, GPL-compatible for the kernel. */
#define BPF_LICENSE Dual BSD/GPL

#include <uapi/linux/bpf.h>
#include <linux/in.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/udp.h>

#include "ltp_parse.h"
#include "ltp_maps.h"

int ltp_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ltp_hdr *h = data + LTP_OFF;
	if ((void *)(h + 1) > data_end)
		return XDP_DROP;
	__u32 chunk = bpf_ntohl(h->chunk);
	if (chunk >= LTP_MAX_CHUNKS)
		return XDP_DROP;
	__u32 midx = LTP_BANK_OF(bpf_ntohl(h->round)) * LTP_SLOTS * LTP_MAX_CHUNKS + chunk;
	struct ltp_chunk *dst = ltp_mem.lookup(&midx);
	if (!dst)
		return XDP_DROP;
	if (bpf_xdp_load_bytes(ctx, PAY_OFF, dst, LTP_CHUNK_BYTES))
		return XDP_DROP;
#ifdef LTP_FLOOR_PUBLISH
	/* The copy published as ltp_xdp publishes it: its done bit, a locked
	 * operation, which waits for the copy's stores to drain. */
	__u32 bidx = LTP_BANK_OF(bpf_ntohl(h->round)) * LTP_SLOTS;
	struct ltp_bitmap *done = ltp_done.lookup(&bidx);
	__u64 word = chunk >> 6;
	if (done && word < LTP_BM_WORDS)
		__sync_fetch_and_or(&done->w[word], 1ULL << (chunk & 63));
#endif
	return XDP_TX;
}
