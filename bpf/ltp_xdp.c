// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
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
 * Both must carry their flow's token (ltp_hdr.token: per worker, direction
 * and round, set by the control plane in ltp_slottok and ltp_tx; GROUP DATA
 * the round's group token in ltp_banks); others are dropped as bad_token.
 * other -> XDP_PASS untouched (LTP control types are passed up too).
 *
 * While `ltp capture` has switched capture on (ltp_capcfg), each LTP frame
 * is also copied, as it arrived, into the ring buffer ltp_capring with a
 * kernel timestamp and the verdict the program gave it.
 *
 * Every host loads this one program: a parameter server receives DATA and
 * sends ACKs; a worker receives the ACKs of its pushes and the DATA of the
 * parameter downlink. Compiled by bcc (dataplane/xdp/loader.py) with the
 * geometry as -D defines (Geometry.cflags, dataplane/xdp/mapstructs.py).
 *
 * The program's files, in the order a packet meets them:
 *   ltp_xdp.c      ltp_xdp, the entry: capture around ltp_run
 *   ltp_run.h      ltp_run: the checks every LTP packet passes, dispatch
 *   ltp_parse.h    ltp_parse: the one parser of an LTP frame
 *   ltp_data.h     on_data: DATA admitted, stored, turned into its ACK
 *   ltp_live.h     owner_stale: the owner's heartbeat, judged once a jiffy
 *   ltp_ack.h      on_ack: an ACK recorded; a clocked one goes on to
 *   ltp_clock.h    the ACK clock: an ACK grown into the flow's next DATA
 *   ltp_capture.h  cap_begin and cap_end: the capture's snapshot and verdict
 *   ltp_frame.h    a frame turned around in place, its checksums
 *   ltp_util.h     counters and drops, barrier_var, bitmap words, slots
 *   ltp_maps.h     the maps and their value structs
 *   ltp_wire.h     the packet layout and its constants
 */
/* The program's license string (bcc's footer puts it in the license
 * section): the dual licence of the SPDX line, GPL-compatible for the kernel. */
#define BPF_LICENSE Dual BSD/GPL

#include <uapi/linux/bpf.h>
#include <linux/in.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/udp.h>

#include "ltp_run.h"
#include "ltp_capture.h"

int ltp_xdp(struct xdp_md *ctx)
{
	/* Capture off (until_ns 0) costs this lookup and one test. On, the
	 * clock cap_begin reads serves ltp_run too (now; 0: not read). */
	__u32 zero = 0;
	struct ltp_capcfg *cc = ltp_capcfg.lookup(&zero);
	struct ltp_cap_rec *rec = NULL;
	__u64 now = 0;
	if (cc && cc->until_ns)
		rec = cap_begin(ctx, cc, &now);
	int verdict = ltp_run(ctx, now);
	if (rec && cc)
		cap_end(ctx, cc, rec, verdict);
	return verdict;
}
