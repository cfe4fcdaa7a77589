// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/* LTP wire format: the one definition of the packet layout and its constants.
 *
 * Shared by every BPF program in this folder; dataplane/xdp/wire.py mirrors it for
 * user space and tests/test_wire.py proves the two agree (sizes and offsets of
 * the structs bcc generates from these definitions).
 *
 * On the wire: [eth | ipv4 (no options) | udp | struct ltp_hdr | payload].
 * All multi-byte header fields are big-endian (network order). The payload of
 * a DATA packet is a run of whole float32 elements, little-endian as the
 * sender's memory holds them; its length is a multiple of 4.
 */
#ifndef LTP_WIRE_H
#define LTP_WIRE_H

#define LTP_MAGIC        0x4C54 /* "LT" */
#define LTP_VERSION      2      /* 2: the round token (struct ltp_hdr.token) */
#ifndef LTP_PORT
#define LTP_PORT         7410   /* UDP port a receiver listens on */
#endif

/* packet types (ltp_hdr.type); 3..15 are control types, passed to user space */
#define LTP_T_DATA       1
#define LTP_T_ACK        2
#define LTP_T_CTRL_MIN   3
#define LTP_T_CTRL_MAX   15

/* flags (ltp_hdr.flags, big-endian __u16) */
#define LTP_F_CRITICAL   0x0001 /* must arrive: the sender re-sends until acked */
#define LTP_F_LAST       0x0002 /* last chunk of the buffer */
#define LTP_F_RELIABLE   0x0004 /* the whole round is critical (parameter downlink) */
#define LTP_F_RETX       0x0008 /* a re-send: the receiver counts what arrived only this way */
#define LTP_F_GROUP      0x0010 /* DATA sent to a group (broadcast/multicast) address: each
                                   receiver takes it for its own id and ACKs from its own
                                   addresses (ltp_cfg.self_*) */
#define LTP_F_CLOCK      0x0020 /* DATA of an ACK-clocked sender (docs/transport.md): its
                                   `rate` carries the sender's window stamp
                                   (LTP_CLOCK_STAMP), its ACK the receiver's credit
                                   (window in packets, in `rate`) and LTP_F_STOP; the
                                   sender's XDP program turns that ACK into its next DATA */
#define LTP_F_DUP        0x0100 /* ACK: the receiver already had this chunk */
#define LTP_F_STOP       0x0200 /* ACK of clocked DATA: the flow has more in flight than the
                                   receiver's credit allows: the sender consumes this ACK
                                   instead of sending its next chunk */
#define LTP_F_SACK       0x0400 /* ACK: LTP_SACK_LEN bytes follow the header, the receiver's
                                   delivered bits of the 64-chunk block holding `chunk`
                                   (byte k bit i: chunk 64 * (chunk / 64) + 8k + i), so
                                   one ACK that arrives stands in for lost ones before it */
#define LTP_SACK_LEN     8

/* receiver round state carried in an ACK (ltp_hdr.state) */
#define LTP_RS_OPEN      1
#define LTP_RS_CLOSED    2

struct ltp_hdr {
	__be16 magic;    /* LTP_MAGIC */
	__u8   version;  /* LTP_VERSION */
	__u8   type;     /* LTP_T_* */
	__be16 flags;    /* LTP_F_* */
	__be16 worker;   /* flow owner: uplink = sending worker, downlink = receiving worker */
	__be32 job;      /* job cookie; a receiver drops other jobs' packets */
	__be32 round;    /* round number (monotonic per job) */
	__be32 chunk;    /* chunk index within the round's buffer */
	__be32 nchunks;  /* chunk count of the round's buffer */
	__be16 len;      /* payload bytes following the header (an ACK: 0, or LTP_SACK_LEN
	                    with LTP_F_SACK) */
	__u8   state;    /* ACK: receiver's round state LTP_RS_*; DATA: 0 */
	__u8   pad;      /* zero */
	__be32 rate;     /* ACK: advertised send rate for this worker, kbit/s (0 = none);
	                    ACK of LTP_F_CLOCK DATA: the flow's window, packets;
	                    DATA with LTP_F_CLOCK: the sender's stamp (LTP_CLOCK_STAMP) */
	__be64 token;    /* the flow's token for this round (control/trust/tokens.py),
	                    derived from the key of the flow's worker and its direction: DATA
	                    carries its sender's, an ACK the receiver's, GROUP DATA the round's
	                    group token. A receiver drops DATA, a sender ACKs, whose token is not
	                    the one its control plane set (ltp_slottok, ltp_banks, ltp_tx), so
	                    neither a host off the path nor a member holding only its own key
	                    can forge another's. 0: the job has no secret */
} __attribute__((packed));

/* The stamp clocked DATA carries in `rate`: the packets its flow had in
 * flight when it left (high 16 bits) and the STOPs its sender had received
 * by then (low 16 bits, wrapping). The receiver subtracts the STOPs it sent
 * since, so packets already in flight do not shed the same excess twice. */
#define LTP_CLOCK_STAMP(inflight, stops) (((inflight) << 16) | ((stops) & 0xffff))

/* A multiple of 8; with a 1424-byte chunk a frame is 20 + 8 + 40 + 1424 = 1492
 * IP bytes, inside a 1500-byte MTU. */
#define LTP_HDR_LEN      40

#endif /* LTP_WIRE_H */
