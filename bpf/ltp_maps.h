// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/* LTP map layout: value structs, counter indices and the maps themselves.
 *
 * Geometry comes from the loader as -D defines (dataplane/xdp/mapstructs.py,
 * Geometry.cflags): LTP_SLOTS peers, LTP_MAX_CHUNKS chunks of LTP_CHUNK_BYTES
 * each, LTP_BANKS round banks. dataplane/xdp/maps.py reads these maps (and
 * takes the counter names, map names and #defines from this file); the names
 * below are the pin names under /sys/fs/bpf.
 */
#ifndef LTP_MAPS_H
#define LTP_MAPS_H

#include "ltp_wire.h"

#ifndef LTP_SLOTS
#define LTP_SLOTS        16
#endif
#ifndef LTP_MAX_CHUNKS
#define LTP_MAX_CHUNKS   256     /* multiple of 64 */
#endif
#ifndef LTP_CHUNK_BYTES
#define LTP_CHUNK_BYTES  1424    /* multiple of 8; fits a 1500-byte MTU */
#endif
#ifndef LTP_BANKS
#define LTP_BANKS        2       /* round r uses bank (r / LTP_BANK_STRIDE) % LTP_BANKS */
#endif
#ifndef LTP_BANK_STRIDE
#define LTP_BANK_STRIDE  1       /* S on a server of S whose rounds are r·S + s (its own s):
                                    two banks hold all of them (control/transport/roundspace.py) */
#endif
#define LTP_BANK_OF(round) (((round) / LTP_BANK_STRIDE) % LTP_BANKS)
#define LTP_BM_WORDS     (LTP_MAX_CHUNKS / 64)
#define LTP_MAX_WORKER_ID 65536  /* worker ids are 16 bits */

/* bank state (struct ltp_bank.state) */
#define LTP_BANK_FREE    0
#define LTP_BANK_OPEN    1
#define LTP_BANK_CLOSED  2

/* global counters (ltp_counters index); dataplane/xdp/maps.py reads the names (COUNTERS) */
enum ltp_counter {
	LTP_C_PASS = 0,        /* not LTP: passed up untouched */
	LTP_C_DATA,            /* DATA chunks accepted and written */
	LTP_C_ACK_TX,          /* ACKs sent (XDP_TX) */
	LTP_C_ACK_RX,          /* ACKs recorded by a sender */
	LTP_C_CTRL,            /* control packets passed to user space */
	LTP_C_MALFORMED,       /* too short, IP options/fragments, bad length */
	LTP_C_BAD_MAGIC,
	LTP_C_BAD_VERSION,
	LTP_C_FOREIGN_JOB,
	LTP_C_UNKNOWN_WORKER,
	LTP_C_STALE,           /* round older than the bank's round */
	LTP_C_FUTURE,          /* round not opened yet */
	LTP_C_LATE,            /* round already closed: not written, ACKed CLOSED */
	LTP_C_OUT_OF_RANGE,    /* chunk index or chunk count disagree with the bank */
	LTP_C_DUP,             /* chunk already delivered: not rewritten, re-ACKed */
	LTP_C_ACK_STALE,       /* ACK for a round this sender is not sending */
	LTP_C_ACK_FAIL,        /* could not build the ACK (tail adjust failed) */
	LTP_C_BAD_TOKEN,       /* DATA or ACK whose token is not its round's: a spoof, or a peer
	                          with another secret; never written, never ACKed, no header kept */
	LTP_C_CLOCK_TX,        /* sender: ACKs turned into the flow's next DATA (XDP_TX) */
	LTP_C_CLOCK_STOP,      /* sender: ACKs consumed because the receiver's credit said STOP */
	LTP_C_CLOCK_IDLE,      /* sender: ACKs consumed with nothing to send (all handed out,
	                          round closed, or a second ACK of one chunk) */
	LTP_C_GROW_FAIL,       /* sender: an ACK could not grow into DATA (too little tailroom:
	                          consumed, nothing handed out; on the rig about 1 ACK in 10,000;
	                          every one: the device cannot run the clock). Also the trim or
	                          copy after it failing (never seen): that chunk waits for a re-send */
	LTP_C_CREDIT_STOP,     /* receiver: ACKs that told a clocked flow to STOP */
	LTP_C_STALE_OWNER,     /* receiver: DATA of an open round dropped without an ACK because
	                          the control plane's heartbeat (ltp_cfg.beat_ns) is older than its
	                          limit: the process that would read it is hung or stopped */
	LTP_C_CLOCK_RETX,      /* sender: ACKs turned into a re-send of a chunk RACK found lost
	                          (also in clock_tx) */
	LTP_C_SLOT_CLOSED,     /* receiver: DATA with its token from a worker the round does not
	                          take (not in it, or dropped: ltp_slottok.open 0): never written,
	                          ACKed CLOSED */
	LTP_C_BAD_CSUM,        /* receiver: DATA whose UDP checksum does not verify (corrupted in
	                          flight; only with LTP_CFG_CSUM): never marked delivered, never
	                          ACKed, so it is re-sent or filled */
	LTP_C_NO_GROUP,        /* receiver: DATA flagged GROUP at an endpoint with no identity of
	                          its own (ltp_cfg.self_*: a server): a group answer meant for the
	                          workers, seen where a segment floods it to every host (another
	                          server of a sharded job). Not this host's traffic: dropped,
	                          no header kept */
	LTP_C_MAX,
};

/* ltp_cfg.flags */
#define LTP_CFG_SELF     1       /* self_* below are set: group DATA is accepted */
#define LTP_CFG_CSUM     2       /* verify each DATA frame's UDP checksum before its chunk
                                    counts (frames from a NIC; a veth hands socket-sent
                                    frames over with the sum left to offload) */

/* receiver config, written by the control plane at load; mmapable for the
 * heartbeat.
 *
 * Liveness of the receiving control plane (docs/transport.md, "A hung
 * receiver"). While its rounds are open, the endpoint's control thread
 * writes beat_ns (CLOCK_MONOTONIC, which bpf_ktime_get_ns reads) from the
 * loops that drive them (waiting for a round, pushing); XDP ACKs DATA of an
 * open round only while now - beat_ns <= limit_ns, and drops it as
 * stale_owner otherwise, so the senders of a hung receiver hear nothing and
 * end in DeadPeerError. beat_ns 0 (nothing ever beat: `ltp load`, tests of
 * the packet path) or limit_ns 0 turns the check off. `now` is read once a
 * jiffy per CPU, or when the beat or the limit changed (ltp_beatchk keeps
 * the verdict in between): a stale owner is refused within its limit plus
 * one jiffy (1/HZ, 4 ms at HZ 250). */
struct ltp_cfg {
	__u32 job;             /* job cookie in host order; 0 accepts any job */
	__u32 flags;           /* LTP_CFG_* */
	__be32 self_ip;        /* this host's address, network order ... */
	__u16 self_worker;     /* ... its worker id, host order ... */
	__u8 self_mac[6];      /* ... and its device's MAC: what a group DATA's ACK comes from */
	__u32 pad;
	__u64 beat_ns;         /* control plane (mmapped): the latest heartbeat */
	__u64 limit_ns;        /* control plane: the oldest heartbeat that still counts */
};

/* The heartbeat's verdict as one CPU last judged it (ltp_data.h, owner_stale). */
struct ltp_beatchk {
	__u64 jiffies;         /* bpf_jiffies64 when judged (0: never) */
	__u64 beat_ns;         /* ltp_cfg.beat_ns it judged */
	__u64 limit_ns;        /* ... and limit_ns */
	__u64 stale;           /* 1: stale */
};

struct ltp_bank {
	__u32 round;           /* round this bank holds */
	__u32 state;           /* LTP_BANK_* */
	__u32 nchunks;         /* chunk count of the buffer */
	__u32 last_len;        /* payload bytes of the last chunk */
	__be64 token;          /* the token DATA flagged GROUP of this round carries (network
	                          order); each worker's own DATA carries its slot's (ltp_slottok) */
	__u32 thresh;          /* chunks per slot at which its progress records thresh_ns
	                          (Early Close's threshold of nchunks; 0: none) */
	__u32 group;           /* 1: GROUP DATA is taken with `token`; 0: this endpoint holds no
	                          group token (a member key): GROUP DATA is dropped bad_token */
	__u32 prev_round;      /* the round this bank held before `round` (if prev) */
	__u32 prev;            /* 1: it held one, whose slots' tokens are ltp_slottok's prev_*:
	                          a late sender's DATA of it is ACKed CLOSED, not dropped stale */
};

/* The tokens of one [bank][slot] (tokens.py): what the slot's DATA of the
 * bank's round must carry (derived from that worker's own key and the
 * flow's direction, so a member cannot write another's slot) and what its
 * ACK carries back (so a member cannot close another's push). */
struct ltp_slot_tok {
	__be64 data;           /* the token this slot's DATA carries (network order) */
	__be64 ack;            /* the token its ACK carries (network order) */
	__u32 open;            /* 1: the round takes this slot's DATA; 0: a worker not in the
	                          round, or dropped: its DATA is never written, ACKed CLOSED */
	__u32 pad;
	__be64 prev_data;      /* the bank's previous round's (ltp_bank.prev_round) data ... */
	__be64 prev_ack;       /* ... and ACK tokens for this slot */
};

struct ltp_bitmap {
	__u64 w[LTP_BM_WORDS]; /* bit c set: chunk c */
};

struct ltp_chunk {
	__u8 b[LTP_CHUNK_BYTES];
};

struct ltp_progress {
	__u32 chunks;          /* distinct chunks delivered in this bank */
	__u32 retx;            /* ... of which arrived as a re-send (LTP_F_RETX): loss seen */
	__u64 bytes;           /* payload bytes delivered */
	/* Arrival times at the NIC (bpf_ktime_get_ns, CLOCK_MONOTONIC; 0: none
	 * yet), exact where they matter: the clock is read for a flow's first
	 * chunk, its re-sends and every chunk from the one reaching thresh to the
	 * one completing the flow (ltp_data.h, data_mark). Other chunks stamp
	 * last_ns only with a reading the frame has anyway (the heartbeat
	 * check's, once a jiffy per CPU, or the capture's). So last_ns is exact
	 * for a flow that completed or passed thresh; for one that did neither,
	 * it is its latest stamped chunk's. */
	__u64 first_ns;        /* the first delivered chunk (approx.: racing CPUs) */
	__u64 last_ns;         /* the latest stamped chunk (above) */
	__u64 thresh_ns;       /* the chunk that brought chunks to ltp_bank.thresh */
	__u64 flow;            /* LTP_FLOW_*: set once each (64 bits: bcc's target
	                          has a 64-bit fetch-or only) */
	__u64 stops;           /* STOPs this flow's ACKs carried (the credit, ltp_data.h) */
};

#define LTP_FLOW_DONE    2ULL    /* every chunk delivered: taken off ltp_share.active */

struct ltp_slot_stats {
	__u64 rx_packets;      /* DATA packets for this slot that passed validation */
	__u64 rx_bytes;        /* their payload bytes */
	__u64 delivered;       /* distinct chunks written */
	__u64 acks_tx;
	__u64 dup;
	__u64 late;
	__u64 stale;
	__u64 future;
	__u64 out_of_range;
	__u64 acks_rx;         /* sender side: ACKs recorded */
	__u64 acks_stale;
};

/* Round times (open to close) in ltp_round_stats.time_hist: bucket i counts
 * rounds that took at most LTP_ROUND_TIME_BASE_US << i microseconds, the last
 * bucket every longer round (0.1 ms .. 26.2 s, then the rest). User space
 * only: `ltp exporter` serves them as a histogram. */
#define LTP_ROUND_TIME_BUCKETS 20
#define LTP_ROUND_TIME_BASE_US 100

/* A slot's lateness in a round (its last chunk's arrival at the NIC minus
 * the round's median last arrival, control/transport/straggler.py) in
 * ltp_round_stats.late_hist: bucket 0 counts rounds it was at most
 * LTP_LATE_BASE_US late (on time or early included), bucket i > 0 at most
 * LTP_LATE_BASE_US << i, the last every later one (0.1 ms .. 1.6 s). */
#define LTP_LATE_BUCKETS 15
#define LTP_LATE_BASE_US 100

/* Round outcomes per slot, decided in user space (control/transport/receiver.py
 * Receiver.collect) and recorded with LtpMaps.record_round. Counts are in
 * rounds, chunk sums in chunks; "filled" = chunks that did not arrive and
 * were Bubble-Filled (every strategy fills every hole). */
struct ltp_round_stats {
	__u64 complete;        /* rounds closed with every chunk in */
	__u64 early;           /* ... closed by Early Close */
	__u64 deadline;        /* ... closed by the deadline */
	__u64 timeout;         /* ... closed by the hard timeout */
	__u64 delivered;       /* chunks delivered, summed over recorded rounds */
	__u64 filled;          /* chunks filled (missing), summed over recorded rounds */
	__u32 last_round;      /* round number of the latest record */
	__u32 last_delivered;  /* chunks delivered in that round */
	__u32 last_filled;     /* chunks filled in that round */
	__u32 last_budget_ppm; /* that round's Early Close loss budget, parts per million (the
	                          loss policy's: docs/transport.md, "The loss policy") */
	__u64 time_us;         /* round times summed, microseconds (rounds recorded with one) */
	__u64 time_hist[LTP_ROUND_TIME_BUCKETS];  /* rounds per time bucket, see above */
	__u64 straggler;       /* rounds that named this slot's worker their straggler */
	__u64 late_hist[LTP_LATE_BUCKETS];  /* rounds per lateness bucket, see above */
};

/* Per-bank rate sharing. The control plane opens a round with `active` =
 * the flows it expects and share_kbps = the capacity to divide (kbit/s); the
 * XDP program takes one off `active` as each flow's last chunk lands and
 * advertises share_kbps / active in every ACK, so the flows still sending
 * speed up on their very next ACK, with no control plane in the loop.
 * share_kbps 0 falls back to the per-slot ltp_rate. */
struct ltp_share {
	__u32 active;          /* flows not finished: set at open, XDP decrements */
	__u32 share_kbps;      /* control plane: capacity divided among active flows */
	__u32 window;          /* control plane: packets all clocked flows together may keep
	                          in flight (bottleneck buffer + one BDP); each active flow's
	                          credit is window / active (at least 1); 0 = no limit */
	__u32 pad;
};

struct ltp_tx {
	__u32 round;           /* round this sender bank is sending */
	__u32 closed;          /* 1 once an ACK said the receiver closed the round */
	__u32 rate_kbps;       /* latest advertised rate */
	__u32 acked;           /* distinct chunks acked */
	__be64 token;          /* the round's token as its ACKs carry it (network order) */
	/* The ACK clock (docs/transport.md). The control plane writes clock,
	 * flags, nchunks, last_len, tail and added; XDP the rest. */
	__u32 clock;           /* 1: XDP turns this flow's clocked ACKs into its next DATA */
	__u32 flags;           /* LTP_F_* every DATA of the round carries (host order) */
	__u32 nchunks;         /* chunk count of the round's buffer */
	__u32 last_len;        /* payload bytes of its last chunk */
	__u32 tail;            /* XDP sends order positions [next, tail); the control plane
	                          takes positions from the tail down for a growing window */
	__u32 window;          /* the latest credit (packets) an ACK carried */
	__u32 window_min;      /* the smallest (the share with every flow active): what the
	                          next push primes with */
	__u32 pad;
	__u64 next;            /* next order position XDP sends (fetch-add) */
	__u64 added;           /* packets the control plane put in flight (priming, growth) */
	__u64 consumed;        /* ACKs XDP consumed, and chunks only a SACK named: in flight = added - consumed */
	__u64 stops;           /* STOP ACKs received (stamped into DATA, LTP_CLOCK_STAMP) */
	__u64 sent;            /* DATA XDP made from ACKs */
	/* Recovery in XDP (rack = 1, docs/transport.md): every DATA XDP sends is
	 * logged (ltp_sendlog: its order position at log index xseq, and
	 * ltp_sentat[chunk] = xseq + 1); an ACK is turned into a re-send of a
	 * logged chunk still unacknowledged and more than LTP_RACK_REORDER log
	 * entries older than the newest acked one, before any new chunk. */
	__u64 xseq;            /* XDP: DATA logged so far (the log's head) */
	__u64 scan;            /* XDP: the oldest log entry not yet judged */
	__u64 newest;          /* XDP: the newest log entry acked */
	__u64 rexmit;          /* XDP: re-sends it made */
	__u32 rack;            /* control plane: 1 lets XDP recover this flow's losses */
	__u32 pad2;
	__be64 dtoken;         /* control plane: the token this flow's DATA carries (network
	                          order; `token` is its ACKs'): the clock writes it into the
	                          DATA it grows */
};

#define LTP_RACK_REORDER 3       /* log entries an ACK may overtake before loss is judged */
#define LTP_RACK_SCAN    8       /* log entries one ACK looks at, at most */
#define LTP_SENDLOG      (2 * LTP_MAX_CHUNKS)  /* log entries per flow (a ring) */

/* ltp_sendorder entries: the chunk at a send position, and its payload's
 * checksum (16-bit ones' complement sum of its native 16-bit words, so XDP
 * completes the UDP checksum without reading the payload) */
#define LTP_SO_CHUNK     0x00ffffff
#define LTP_SO_CRITICAL  0x80000000 /* the chunk is critical (DATA flagged LTP_F_CRITICAL) */
struct ltp_sendslot {
	__u32 chunk;           /* chunk index | LTP_SO_CRITICAL */
	__u32 csum;            /* payload sum, folded to 16 bits */
};

/* Capture at the NIC (`ltp capture`, dataplane/xdp/capring.py). While
 * ltp_capcfg.until_ns is in the future, every LTP frame that passes the
 * filters is copied (at most snaplen bytes) into a per-CPU scratch record
 * before the program runs, stamped with its verdict afterwards, and output
 * into the ring buffer ltp_capring. until_ns is a lease the capturing
 * process renews: a capture killed without clean-up switches itself off. */
#ifndef LTP_CAP_RING_PAGES
#define LTP_CAP_RING_PAGES 2048  /* ring buffer pages (power of 2): 8 MiB */
#endif
#define LTP_CAP_HDR_LEN  24      /* bytes of struct ltp_cap_rec before the frame */
/* largest frame a record holds: eth + ip + udp + ltp headers (82 bytes) and
 * a chunk, rounded up to 8; longer frames are cut (wire_len keeps their size) */
#define LTP_CAP_FRAME_MAX (LTP_CHUNK_BYTES + ((14 + 20 + 8 + LTP_HDR_LEN + 7) & ~7))

/* ltp_capcfg.flags: which filters apply, and whether to record XDP_TX frames */
#define LTP_CAP_F_JOB    1       /* only frames whose header names job */
#define LTP_CAP_F_WORKER 2       /* ... worker */
#define LTP_CAP_F_ROUND  4       /* ... round */
#define LTP_CAP_F_TX     8       /* also record the frame XDP_TX sends (the ACK), after the rewrite */

/* record direction (ltp_cap_rec.dir) */
#define LTP_CAP_RX       0       /* the frame as it arrived */
#define LTP_CAP_TX       1       /* the frame the program sent back with XDP_TX */

struct ltp_capcfg {
	__u64 until_ns;        /* capture while bpf_ktime_get_ns() < until_ns; 0 = off */
	__u32 owner;           /* pid of the capturing process (one capture per program) */
	__u32 snaplen;         /* bytes of each frame to keep */
	__u32 flags;           /* LTP_CAP_F_* */
	__u32 job;             /* filters, host order */
	__u32 round;
	__u16 worker;
	__u16 pad;
};

struct ltp_cap_rec {
	__u64 ts_ns;           /* bpf_ktime_get_ns (CLOCK_MONOTONIC) as the frame came in */
	__u32 wire_len;        /* bytes of the whole frame */
	__u16 cap_len;         /* bytes of it in data[] */
	__u8  verdict;         /* XDP_* the program returned for it */
	__u8  dir;             /* LTP_CAP_RX or LTP_CAP_TX */
	__u32 ifindex;         /* device it arrived on */
	__u32 cpu;             /* CPU that ran the program */
	__u8  data[LTP_CAP_FRAME_MAX];
};

struct ltp_cap_stats {
	__u64 captured;        /* records output into ltp_capring */
	__u64 lost;            /* records the ring had no room for (the capture's drops) */
};

/* ltp_cfg: control plane writes at load, and beats beat_ns (mmapped) while it drives rounds; XDP reads every packet */
BPF_F_TABLE("array", __u32, struct ltp_cfg, ltp_cfg, 1, BPF_F_MMAPABLE);
/* ltp_beatchk: XDP's per-CPU heartbeat verdict, the jiffy, beat and limit it was for (owner_stale); nobody else */
BPF_PERCPU_ARRAY(ltp_beatchk, struct ltp_beatchk, 1);
/* ltp_peers: control plane writes worker id -> slot + 1 (0 = unknown); XDP reads */
BPF_ARRAY(ltp_peers, __u32, LTP_MAX_WORKER_ID);
/* ltp_banks: control plane opens/closes rounds; XDP reads to validate DATA */
BPF_ARRAY(ltp_banks, struct ltp_bank, LTP_BANKS);
/* ltp_slottok: control plane writes per [bank][slot] at open (mmapped; open 0 closes a slot); XDP reads to check DATA and sign its ACK */
BPF_F_TABLE("array", __u32, struct ltp_slot_tok, ltp_slottok, LTP_BANKS * LTP_SLOTS, BPF_F_MMAPABLE);
/* ltp_mem: XDP writes payloads at [bank][slot][chunk]; control plane maps it with numpy */
BPF_F_TABLE("array", __u32, struct ltp_chunk, ltp_mem, LTP_BANKS * LTP_SLOTS * LTP_MAX_CHUNKS, BPF_F_MMAPABLE);
/* ltp_claim: XDP sets a chunk's bit before copying (dedupe); control plane clears on open */
BPF_F_TABLE("array", __u32, struct ltp_bitmap, ltp_claim, LTP_BANKS * LTP_SLOTS, BPF_F_MMAPABLE);
/* ltp_done: XDP sets a chunk's bit after its copy finished; control plane reads as the delivery mask */
BPF_F_TABLE("array", __u32, struct ltp_bitmap, ltp_done, LTP_BANKS * LTP_SLOTS, BPF_F_MMAPABLE);
/* ltp_progress: XDP adds per [bank][slot]; control plane polls it for Early Close */
BPF_F_TABLE("array", __u32, struct ltp_progress, ltp_progress, LTP_BANKS * LTP_SLOTS, BPF_F_MMAPABLE);
/* ltp_share: control plane sets flows and capacity per bank at open (mmapped); XDP counts flows down */
BPF_F_TABLE("array", __u32, struct ltp_share, ltp_share, LTP_BANKS, BPF_F_MMAPABLE);
/* ltp_rate: control plane writes the rate (kbit/s) advertised to each slot; XDP copies it into ACKs */
BPF_ARRAY(ltp_rate, __u32, LTP_SLOTS);
/* ltp_counters: XDP counts by class (enum ltp_counter); CLI and tests read */
BPF_PERCPU_ARRAY(ltp_counters, __u64, LTP_C_MAX);
/* ltp_stats: XDP counts per slot; `ltp flows` reads */
BPF_PERCPU_ARRAY(ltp_stats, struct ltp_slot_stats, LTP_SLOTS);
/* ltp_tx: sender control plane sets round per [bank][slot]; XDP records ACK state */
BPF_F_TABLE("array", __u32, struct ltp_tx, ltp_tx, LTP_BANKS * LTP_SLOTS, BPF_F_MMAPABLE);
/* ltp_acked: XDP sets a chunk's bit when its ACK arrives; sender control plane reads */
BPF_F_TABLE("array", __u32, struct ltp_bitmap, ltp_acked, LTP_BANKS * LTP_SLOTS, BPF_F_MMAPABLE);
/* ltp_sendbuf: sender control plane writes the round's payload per [bank][chunk] (mmapped); XDP copies it into the DATA it makes of ACKs */
BPF_F_TABLE("array", __u32, struct ltp_chunk, ltp_sendbuf, LTP_BANKS * LTP_MAX_CHUNKS, BPF_F_MMAPABLE);
/* ltp_sendorder: sender control plane writes the round's send order per [bank][position] (mmapped); XDP reads it */
BPF_F_TABLE("array", __u32, struct ltp_sendslot, ltp_sendorder, LTP_BANKS * LTP_MAX_CHUNKS, BPF_F_MMAPABLE);
/* ltp_sendlog: XDP logs the order position of each DATA it sends per [bank][slot][seq % LTP_SENDLOG]; XDP reads it to find losses */
BPF_ARRAY(ltp_sendlog, __u32, LTP_BANKS * LTP_SLOTS * LTP_SENDLOG);
/* ltp_sentat: XDP writes per [bank][slot][chunk] its latest log seq + 1 (64 bits: an array map's values are 8-byte aligned, so the mmapped view is dense); the control plane reads it (mmapped) and writes 0 when it re-sends the chunk itself (it then owns its recovery) and at the push's start */
BPF_F_TABLE("array", __u32, __u64, ltp_sentat, LTP_BANKS * LTP_SLOTS * LTP_MAX_CHUNKS, BPF_F_MMAPABLE);
/* ltp_rounds: control plane writes per slot as it closes a round (LtpMaps.record_round); `ltp flows` reads; XDP never touches it */
BPF_ARRAY(ltp_rounds, struct ltp_round_stats, LTP_SLOTS);
/* ltp_lasthdr: XDP keeps the latest header per counter class (what was dropped and why; never for a frame of a known worker that is not authenticated: bad_token, stale, future, ack_stale); CLI reads */
BPF_ARRAY(ltp_lasthdr, struct ltp_hdr, LTP_C_MAX);

/* ltp_capcfg: `ltp capture` writes (on/off lease, snaplen, filters); XDP reads every packet */
BPF_ARRAY(ltp_capcfg, struct ltp_capcfg, 1);
/* ltp_capbuf: XDP's per-CPU scratch record while it runs a captured frame; nobody else */
BPF_PERCPU_ARRAY(ltp_capbuf, struct ltp_cap_rec, 1);
/* ltp_capstat: XDP counts records output and lost; `ltp capture` reads */
BPF_PERCPU_ARRAY(ltp_capstat, struct ltp_cap_stats, 1);
/* ltp_capring: XDP outputs capture records; `ltp capture` consumes them (mmap) */
BPF_RINGBUF_OUTPUT(ltp_capring, LTP_CAP_RING_PAGES);

#endif /* LTP_MAPS_H */
