// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/* The receiving control plane's liveness as DATA sees it (docs/ARCHITECTURE.md,
 * "A hung receiver"): owner_stale judges its heartbeat (ltp_cfg.beat_ns)
 * with a clock read once a jiffy per CPU, not once a packet.
 */
#ifndef LTP_LIVE_H
#define LTP_LIVE_H

#include "ltp_util.h"

/* Is the receiving control plane's heartbeat (ltp_cfg.beat_ns) older than
 * its limit? No heartbeat yet, or no limit: not stale (programs nobody
 * beats for, e.g. `ltp load`ed ones, ACK whatever the time). Signed, so a
 * beat a little ahead of this CPU's clock is fresh. The clock is read only
 * when this CPU's last verdict (ltp_beatchk) was for another jiffy, another
 * beat or another limit, and the reading goes to *now; a frame with a
 * reading already (*now nonzero: the capture's) is judged by it. So a
 * stale owner is refused at most one jiffy (1/HZ) after its limit passed,
 * and an owner that beats again is judged afresh by its next frame. */
static __always_inline int owner_stale(struct ltp_cfg *cfg, __u64 *now)
{
	__u64 beat = cfg->beat_ns, limit = cfg->limit_ns;
	if (!beat || !limit)
		return 0;
	__u32 zero = 0;
	struct ltp_beatchk *bc = ltp_beatchk.lookup(&zero);
	__u64 jif = 0;
	if (!*now) {
		jif = bpf_jiffies64();
		if (bc && bc->jiffies == jif && bc->beat_ns == beat && bc->limit_ns == limit)
			return bc->stale;
		*now = bpf_ktime_get_ns();
	}
	int stale = (__s64)(*now - beat) > (__s64)limit;
	if (bc && jif) {
		bc->jiffies = jif;
		bc->beat_ns = beat;
		bc->limit_ns = limit;
		bc->stale = stale;
	}
	return stale;
}

#endif /* LTP_LIVE_H */
