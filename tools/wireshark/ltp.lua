-- SPDX-License-Identifier: Apache-2.0
-- Wireshark / tshark dissector for LTP, the loss-tolerant gradient transport
-- of the ltpx project (not RFC 5326's "ltp", which Wireshark has built in).
--
--   tshark -X lua_script:tools/wireshark/ltp.lua -r capture.pcapng -V
--   (or copy this file into ~/.local/lib/wireshark/plugins/)
--
-- Registered as "ltpx" on UDP port 7410 (Preferences > Protocols > LTPX to
-- change it; `-d udp.port==N,ltpx` on the command line). The header is
-- bpf/ltp_wire.h's struct ltp_hdr: 40 bytes, every field big-endian. FIELDS
-- below follows the Python description dataplane/xdp/wire.LtpHdr field by
-- field (tests/test_capture.py holds the two equal); filter names are
-- ltpx.<field>, ltpx.flags.<flag>, ltpx.payload_len.

local PORT = 7410
local MAGIC = 0x4c54
local VERSION = 2
local HDR_LEN = 40

local TYPES = {[1] = "DATA", [2] = "ACK"}
for t = 3, 15 do TYPES[t] = "CTRL" .. t end    -- control types, passed to user space
local STATES = {[0] = "-", [1] = "open", [2] = "closed"}

-- flag name, bit, meaning (ltp_hdr.flags)
local FLAGS = {
    {"critical", 0x0001, "must arrive: the sender re-sends until acked"},
    {"last", 0x0002, "last chunk of the buffer"},
    {"reliable", 0x0004, "the whole round is critical (parameter downlink)"},
    {"retx", 0x0008, "a re-send"},
    {"group", 0x0010, "DATA sent to a group address: each receiver takes it for its own id"},
    {"clock", 0x0020, "ACK-clocked DATA (rate = stamp) or its ACK (rate = credit, packets)"},
    {"dup", 0x0100, "ACK: the receiver already had this chunk"},
    {"stop", 0x0200, "ACK: over the credit: the sender consumes it instead of sending on"},
    {"sack", 0x0400, "ACK: 8 bytes follow, the delivered bits of the chunk's 64-chunk block"},
}

-- header field, size in bytes, label, display base, value names: struct ltp_hdr in order
local FIELDS = {
    {"magic", 2, "Magic", base.HEX},
    {"version", 1, "Version", base.DEC},
    {"type", 1, "Type", base.DEC, TYPES},
    {"flags", 2, "Flags", base.HEX},
    {"worker", 2, "Worker", base.DEC},
    {"job", 4, "Job cookie", base.HEX},
    {"round", 4, "Round", base.DEC},
    {"chunk", 4, "Chunk", base.DEC},
    {"nchunks", 4, "Chunks in the round", base.DEC},
    {"len", 2, "Payload length", base.DEC},
    {"state", 1, "Receiver state", base.DEC, STATES},
    {"pad", 1, "Pad", base.DEC},
    {"rate", 4, "Advertised rate (kbit/s); clocked: credit (ACK) or stamp (DATA)", base.DEC},
    {"token", 8, "Round token", base.HEX},
}

local ltpx = Proto("ltpx", "LTP (ltpx)")
local pf, uint = {}, {[1] = ProtoField.uint8, [2] = ProtoField.uint16, [4] = ProtoField.uint32,
                      [8] = ProtoField.uint64}
for _, f in ipairs(FIELDS) do
    pf[f[1]] = uint[f[2]]("ltpx." .. f[1], f[3], f[4], f[5])
end
for _, fl in ipairs(FLAGS) do
    pf["flags." .. fl[1]] = ProtoField.bool("ltpx.flags." .. fl[1], fl[1], 16, nil, fl[2], fl[3])
end
pf.payload_len = ProtoField.uint32("ltpx.payload_len", "Payload bytes in the frame", base.DEC)
pf.payload = ProtoField.bytes("ltpx.payload", "Payload (float32 elements, little-endian)")
pf.sack = ProtoField.uint64("ltpx.sack", "SACK: delivered bits of the chunk's block (bit i: chunk 64 * (chunk / 64) + i)", base.HEX)
local fields = {}
for _, f in pairs(pf) do fields[#fields + 1] = f end
ltpx.fields = fields

local ef = {
    magic = ProtoExpert.new("ltpx.bad_magic", "Not LTP's magic", expert.group.MALFORMED,
                            expert.severity.ERROR),
    version = ProtoExpert.new("ltpx.bad_version", "Unknown LTP version", expert.group.MALFORMED,
                              expert.severity.WARN),
    len = ProtoExpert.new("ltpx.bad_len", "Payload length disagrees with the frame",
                          expert.group.MALFORMED, expert.severity.WARN),
}
ltpx.experts = {ef.magic, ef.version, ef.len}

ltpx.prefs.port = Pref.uint("UDP port", PORT, "UDP port LTP receivers listen on")

local function flag_names(v)
    local out = {}
    for _, fl in ipairs(FLAGS) do
        if bit.band(v, fl[2]) ~= 0 then out[#out + 1] = fl[1] end
    end
    return #out > 0 and table.concat(out, ",") or "-"
end

function ltpx.dissector(tvb, pinfo, tree)
    if tvb:len() < HDR_LEN then return 0 end
    local v = {}
    local off = 0
    for _, f in ipairs(FIELDS) do
        local r = tvb(off, f[2])
        v[f[1]] = f[2] == 8 and r:uint64() or r:uint()
        off = off + f[2]
    end
    local tname = TYPES[v.type] or ("TYPE" .. v.type)
    pinfo.cols.protocol = "LTPX"
    local info = string.format("%s w=%d r=%d c=%d/%d len=%d flags=%s", tname, v.worker, v.round,
                               v.chunk, v.nchunks, v.len, flag_names(v.flags))
    if v.type == 2 then
        info = info .. string.format(" state=%s rate=%dk", STATES[v.state] or v.state, v.rate)
    end
    pinfo.cols.info = info
    local t = tree:add(ltpx, tvb(0, HDR_LEN), "LTP (ltpx), " .. tname)
    off = 0
    for _, f in ipairs(FIELDS) do
        local item = t:add(pf[f[1]], tvb(off, f[2]))
        if f[1] == "magic" and v.magic ~= MAGIC then item:add_proto_expert_info(ef.magic) end
        if f[1] == "version" and v.version ~= VERSION then
            item:add_proto_expert_info(ef.version)
        end
        if f[1] == "flags" then
            item:append_text(" (" .. flag_names(v.flags) .. ")")
            for _, fl in ipairs(FLAGS) do item:add(pf["flags." .. fl[1]], tvb(off, f[2])) end
        end
        off = off + f[2]
    end
    local rest = tvb:len() - HDR_LEN
    local item = t:add(pf.payload_len, rest):set_generated()
    if rest ~= v.len then item:add_proto_expert_info(ef.len) end
    if v.type == 2 and rest == 8 then
        t:add_le(pf.sack, tvb(HDR_LEN, 8))
    elseif rest > 0 then
        local p = t:add(pf.payload, tvb(HDR_LEN, rest))
        local shown = {}
        for i = 0, math.min(math.floor(rest / 4), 4) - 1 do
            shown[#shown + 1] = string.format("%g", tvb(HDR_LEN + 4 * i, 4):le_float())
        end
        if #shown > 0 then p:append_text(" [" .. table.concat(shown, ", ") ..
                                         (rest > 16 and ", ...]" or "]")) end
    end
    return tvb:len()
end

local registered = PORT
DissectorTable.get("udp.port"):add(PORT, ltpx)

function ltpx.prefs_changed()
    if ltpx.prefs.port ~= registered then
        DissectorTable.get("udp.port"):remove(registered, ltpx)
        registered = ltpx.prefs.port
        DissectorTable.get("udp.port"):add(registered, ltpx)
    end
end
