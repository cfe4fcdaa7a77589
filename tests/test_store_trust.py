# SPDX-License-Identifier: Apache-2.0
"""The job key out of the store's reach; the store's values sealed and checked; its keys bounded.

A process that reaches the rendezvous store (torch's TCPStore: no
authentication) but was not given the job key must find nothing there from
which the key or a round token can be computed, and every value it forges
must end in a clear StoreValueError naming the key, never a crash or a
hang. Real TCPStores, real sockets, real ranks (tests/store_soak_job.py
over the TCP transport on loopback), no mocks.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from conftest import outputs

from ltpx.control.trust import jobkey
from ltpx.control.accept import accept_workers
from ltpx.control.trust.hello import mac_hello, mac_parser, MAC_HELLO
from ltpx.control.torchapi import storevalues
from ltpx.control.trust import sealing
from ltpx.control.torchapi.coord import KEY, Coord, Excluded
from ltpx.control.torchapi.ops import STEP, Go, Op
from ltpx.control.launcher.storehost import loopback_store
from ltpx.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent
SOAK = Path(__file__).resolve().parent / "store_soak_job.py"


def _key_file(tmp_path, mode: int = 0o600, text: str | None = None) -> str:
    p = tmp_path / "job.key"
    p.write_text(jobkey.new_key().hex() if text is None else text)
    os.chmod(p, mode)
    return str(p)


@pytest.fixture
def store():
    """A real TCPStore server (on 127.0.0.1 only)."""
    return loopback_store(30.0)


# --------------------------------------------------------------------------- the key file

@pytest.mark.unit
@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_group_or_world_readable_key_file_is_refused(tmp_path, mode):
    path = _key_file(tmp_path, mode)
    with pytest.raises(UsageError, match=f"mode {mode:04o}.*chmod 600 {path}"):
        jobkey.read_key_file(path)


@pytest.mark.unit
@pytest.mark.parametrize("text, word", [("not hex\n", "as hex"), ("ab" * 8 + "a", "as hex"),
                                        ("ab" * 15, "15 bytes")])
def test_a_key_file_that_is_not_a_long_enough_hex_key_is_refused(tmp_path, text, word):
    with pytest.raises(UsageError, match=word):
        jobkey.read_key_file(_key_file(tmp_path, 0o600, text))


@pytest.mark.unit
def test_the_launchers_key_file_is_private_and_gone_at_close(tmp_path):
    path, kf = jobkey.for_launch({})
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
    assert jobkey.read_key_file(path) == kf.key and len(kf.key) == jobkey.KEY_BYTES
    kf.close()
    assert not os.path.exists(os.path.dirname(path))
    mine = _key_file(tmp_path, 0o400)       # an operator's file is used as it is
    assert jobkey.for_launch({jobkey.ENV: mine}) == (mine, None)


@pytest.mark.unit
def test_tokens_verify_only_with_the_files_key_and_no_link_address_carries_it(tmp_path):
    from ltpx.control.torchapi.link_ltp import LtpServerLink
    from ltpx.control.torchapi.settings import Settings
    from ltpx.control.trust import tokens
    key = jobkey.read_key_file(_key_file(tmp_path))
    uses = [jobkey.token_secret(key), jobkey.token_secret(key, 1), jobkey.store_key(key),
            jobkey.hello_key(key).key, key]
    assert len(set(uses)) == len(uses)          # each use its own key
    link = LtpServerLink(Settings(dev="lo", ip="127.0.0.1"), 2, None,
                         secret=jobkey.token_secret(key))
    addr = link.address()       # the server's answers are signed: it says so, no key in it
    assert set(addr) - {"unix"} == {"compress", "chunk_bytes", "downlink_code", "answers",
                                    "signed", "ltp_port", "shared",
                                    # where it is, for a worker on its host (link_ltp_near.py)
                                    "proc", "host", "netns_id", "boot"}
    assert addr["signed"] is True
    other = jobkey.token_secret(jobkey.new_key())
    for r in (1, 2, 77):
        tok = tokens.derive(link.secret, 0x7472, r)
        assert tok == tokens.derive(jobkey.token_secret(key), 0x7472, r)
        assert tok != tokens.derive(other, 0x7472, r) and tok != tokens.derive(key, 0x7472, r)


# --------------------------------------------------------------------------- sealed values

@pytest.mark.unit
def test_a_sealed_value_opens_and_a_forged_moved_or_unsealed_one_is_refused():
    key = jobkey.store_key(jobkey.new_key())
    seal = sealing.Seal(key)
    v = seal.seal("a/go/1", b'{"x": 1}')
    assert seal.read("a/go/1", v, storevalues.json_dict) == {"x": 1}
    bad = [("a/go/1", sealing.Seal(jobkey.store_key(jobkey.new_key())).seal("a/go/1", b"{}"),
            "does not verify"),                              # another job's key
           ("a/go/2", v, "does not verify"),                 # moved to another key
           ("a/go/1", v[:-2] + b"2}", "does not verify"),    # garbled
           ("a/go/1", b'{"x": 1}', "no MAC"),                # unsealed
           ("a/go/1", b"", "no MAC")]
    for name, raw, word in bad:
        with pytest.raises(sealing.StoreValueError, match=f"store key {name}: .*{word}"):
            seal.read(name, raw, storevalues.json_dict)
    with pytest.raises(sealing.StoreValueError, match=r"a key file of this job \(LTP_SECRET_FILE"):
        sealing.Seal(None).read("a/go/1", v, storevalues.json_dict)
    keyless = sealing.Seal(None)          # no key: unsealed, still checked
    assert keyless.read("k", keyless.seal("k", "7"), storevalues.text_int(0, 9, "k")) == 7
    with pytest.raises(sealing.StoreValueError, match="store key k: refused: k must be"):
        keyless.read("k", b"70", storevalues.text_int(0, 9, "k"))


@pytest.mark.unit
def test_a_member_cannot_write_a_value_in_another_ranks_name():
    """Each rank signs what it writes (storeauth.py): worker 1, holding only
    its member file, cannot write worker 0's k, ack or meta, nor the
    server's floor, open, donor or fin, nor pass its signature off as
    another's; what it may write (its own k, a desc) is taken with its name.
    A worker checks another worker's value only once it learnt the
    directory the server publishes, and a shared-MAC value is no signature."""
    from ltpx.control.trust.storeauth import SERVER
    key = jobkey.new_key()
    auths = {"server": jobkey.store_auth(key)}
    for w in (0, 1):
        auths[w] = jobkey.store_auth(jobkey.member_keys(key, w))
    seals = {who: sealing.Seal(a, prefix=KEY, servers=1) for who, a in auths.items()}
    srv, w0, w1 = seals["server"], seals[0], seals[1]
    own = w1.seal(KEY + "k/5/1", "3")
    assert srv.read_from(KEY + "k/5/1", own, storevalues.text_int(0, 9, "k")) == (1, 3)
    for name in ("k/5/0", "meta/1", "floor", "open/4", "donor/2", "fin"):
        with pytest.raises(sealing.StoreValueError,
                           match=f"store key {KEY}{name}: written by worker 1, who may not"):
            srv.open(KEY + name, w1.seal(KEY + name, "1"))
    # worker 1's signature passed off as worker 0's (the writer field changed)
    raw = bytearray(w1.seal(KEY + "k/5/0", "3"))
    raw[4:6] = (0).to_bytes(2, "big")
    with pytest.raises(sealing.StoreValueError, match="signature is not worker 0's"):
        srv.open(KEY + "k/5/0", bytes(raw))
    desc = w1.seal(KEY + "desc/3", GOOD_OP.to_json())
    with pytest.raises(sealing.StoreValueError, match="signed by worker 1, whose key this rank "
                       "has not learnt"):
        w0.open(KEY + "desc/3", desc)
    auths[0].learn(auths["server"].directory(2))
    assert w0.read_from(KEY + "desc/3", desc, storevalues.op_value(2)) == (1, GOOD_OP)
    assert w0.read_from(KEY + "floor", srv.seal(KEY + "floor", "7"),
                        storevalues.text_int(0, 9, "f")) == (SERVER, 7)
    with pytest.raises(sealing.StoreValueError, match="carries no signature"):
        srv.open(KEY + "k/5/1", sealing.Seal(jobkey.store_key(key)).seal(KEY + "k/5/1", "3"))
    with pytest.raises(ValueError, match=r"store_pubs\[0\] is not this worker's key"):
        auths[0].learn(jobkey.store_auth(jobkey.new_key()).directory(2))
    assert "key" not in repr(auths[1]).lower().replace("knows", "")
    # a job that hands every rank the job key: a worker signs as itself, not the server
    as_w1 = sealing.Seal(jobkey.store_auth(key, 1), prefix=KEY)
    assert srv.read_from(KEY + "meta/2", as_w1.seal(KEY + "meta/2", "{}"), storevalues.json_dict) \
        == (1, {})
    with pytest.raises(sealing.StoreValueError, match="written by worker 1, who may not"):
        srv.open(KEY + "floor", as_w1.seal(KEY + "floor", "1"))


def _keyed_coords(store) -> tuple[Coord, dict[int, Coord]]:
    """A keyed job's server Coord and its W workers' (member keys), each
    worker knowing the others' store keys (the server's directory)."""
    key = jobkey.new_key()
    server = Coord(store, W, 5.0, key=jobkey.store_auth(key))
    member = {w: Coord(store, W, 5.0, key=jobkey.store_auth(jobkey.member_keys(key, w)))
              for w in range(W)}
    for co in member.values():
        co.seal.key.learn(server.seal.key.directory(W))
    return server, member


@pytest.mark.unit
def test_a_member_cannot_ask_to_join_as_another_nor_hand_a_joiner_a_state(store, caplog):
    """Worker 1 asks to join as worker 0: the server's poll ignores it,
    saying so, and the job goes on. A
    state under a ticket written by a worker other than the donor the
    server named: the joiner refuses it."""
    server, member = _keyed_coords(store)
    member[1].tickets.request_join(0)
    with caplog.at_level(logging.WARNING, logger="ltpx.torch.coord"):
        server.tickets.poll_joins()
    assert server.tickets.joins == {} and "worker 1 asked to join as worker 0" in caplog.text
    t = member[2].tickets.request_join(2)
    server.tickets.poll_joins()
    assert server.tickets.take_joins(donor=0) == {2: t}
    member[1].tickets.put_sync(t, b"poisoned model")          # worker 0 owes it, worker 1 wrote it
    with pytest.raises(sealing.StoreValueError, match="written by worker 1, not by worker 0, "
                       "its donor"):
        member[2].tickets.take_sync(t, 3.0)
    member[0].tickets.put_sync(t, b"the model")
    assert member[2].tickets.take_sync(t, 3.0) == b"the model"


@pytest.mark.unit
def test_a_state_written_before_the_donor_is_named_is_never_taken(store):
    """Worker 1 writes a state under worker 2's ticket right after worker 2
    asks to join, before the server names the donor: the joiner takes
    nothing while no donor is named, then refuses it as not its donor's;
    a state the named donor writes is taken."""
    server, member = _keyed_coords(store)
    t = member[2].tickets.request_join(2)
    member[1].tickets.put_sync(t, b"poisoned model")
    out: dict = {}

    def joiner():
        try:
            out["blob"] = member[2].tickets.take_sync(t, 10.0)
        except Exception as e:
            out["error"] = e
    th = threading.Thread(target=joiner, daemon=True)
    th.start()
    time.sleep(0.6)
    assert th.is_alive() and not out          # no donor named: nothing taken
    server.tickets.poll_joins()
    assert server.tickets.take_joins(donor=0) == {2: t}
    th.join(10)
    assert isinstance(out.get("error"), sealing.StoreValueError), out
    assert "written by worker 1, not by worker 0, its donor" in str(out["error"])
    t2 = member[2].tickets.request_join(2)
    server.tickets.poll_joins()
    server.tickets.take_joins(donor=0)
    member[0].tickets.put_sync(t2, b"the model")
    assert member[2].tickets.take_sync(t2, 3.0) == b"the model"


W = 3
GOOD_OP = Op(STEP, sizes=(10, 20))


def _forge(store, name: str, value) -> None:
    store.set(KEY + name, value)


# (name, what is forged: key -> raw value, how the Coord reads it); keyed: the
# forger has no key, so its values carry no MAC; keyless: they must still parse
FORGED = {
    "meta": ({"meta/0": json.dumps({"rank": 0, "role": "server", "ip": "198.18.0.1",
                                    "secret": "00" * 16})},
             {"meta/0": json.dumps({"rank": 0, "role": "worker", "ip": "x"})},
             lambda co: co.metas([0])),
    "go": ({"go/3": Go(GOOD_OP).to_json()},
           {"go/3": json.dumps({"op": {"kind": "step", "sizes": [10]}, "absent": [999]})},
           lambda co: co.read_go(3)),
    "desc": ({"desc/0": GOOD_OP.to_json()},
             {"desc/0": json.dumps({"kind": "step", "sizes": [-4]})},
             lambda co: co.take("desc/0", storevalues.op_value(W))),
    "join": ({"join/1": "1"}, {"join/1": "999"}, lambda co: co.tickets.poll_joins()),
    "donor": ({"donor/1": "0"}, {"donor/1": "-3"}, lambda co: co.tickets.take_sync(1, 3.0, w=1)),
    "sync": ({"sync/1": b"\x80\x02forged model"}, None, lambda co: co.tickets.take_sync(1, 3.0)),
    "k": ({"k/0/0": "1", "k/0/1": "1"}, {"k/0/0": "many", "k/0/1": "1"},
          lambda co: co.get_k(0, [0, 1])),
    "open": ({"open/5": "1"}, {"open/5": "0"}, lambda co: co.wait_open(5)),
    "fin": ({"fin": "{}"}, {"fin": "{not json"}, lambda co: co.get_json("fin")),
    "floor": ({"floor": "9"}, {"floor": "-1"}, lambda co: co.gone(4)),
}


@pytest.mark.unit
@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "keyless"])
@pytest.mark.parametrize("kind", sorted(FORGED))
def test_a_forged_value_of_each_kind_ends_in_a_clear_error(store, kind, keyed):
    forged_keyed, forged_keyless, read = FORGED[kind]
    values = forged_keyed if keyed else forged_keyless
    if values is None:
        pytest.skip("a keyless job's state blob is whatever its donor sent")
    co = Coord(store, W, 5.0, key=jobkey.store_auth(jobkey.new_key()) if keyed else None)
    if kind == "join":
        store.add(KEY + "join", 1)
    for name, raw in values.items():
        _forge(store, name, raw)
    t0 = time.monotonic()
    with pytest.raises(sealing.StoreValueError, match=f"store key {KEY}[a-z]+"):
        read(co)
    assert time.monotonic() - t0 < 4.0      # refused, not waited out


@pytest.mark.unit
def test_a_forged_join_count_neither_hangs_the_server_nor_is_taken(store):
    co = Coord(store, W, 5.0, key=jobkey.store_auth(jobkey.new_key()))
    store.add(KEY + "join", 2)              # two tickets, no worker ids behind them
    t0 = time.monotonic()
    co.tickets.poll_joins()
    assert time.monotonic() - t0 < 1.0 and co.tickets.joins == {} and set(co.tickets.unseen) == {1, 2}
    store.add(KEY + "join", 10**6)
    with pytest.raises(sealing.StoreValueError, match="join ticket count jumped"):
        co.tickets.poll_joins()


@pytest.mark.unit
def test_a_worker_left_behind_learns_it_from_the_floor_not_a_hang(store):
    key = jobkey.new_key()
    server = Coord(store, W, 5.0, key=jobkey.store_auth(key))
    worker = Coord(store, W, 5.0, key=jobkey.store_auth(jobkey.member_keys(key, 1)))
    worker.me = 1
    server.start_liveness(0)
    worker.start_liveness(2)
    try:
        worker.arrive(2, GOOD_OP)           # op 2, long reaped: the job is at op 7
        server.put("floor", "5")            # as the server's wait for op 7 publishes it
        t0 = time.monotonic()
        with pytest.raises(Excluded, match="op 2's keys are gone"):
            worker.wait_go(2)
        assert time.monotonic() - t0 < 2.0
        # what its late arrival made is gone again
        assert not any(store.check([KEY + k]) for k in ("desc/2", "ready/2/0"))
    finally:
        worker.stop_liveness()
        server.stop_liveness()


@pytest.mark.unit
def test_the_store_listens_on_loopback_only(store):
    port = f"{store.port:04X}"
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, st = line.split()[1], line.split()[3]
            if st == "0A" and local.endswith(":" + port):
                listening.append(local)
    assert listening == ["0100007F:" + port]     # 127.0.0.1 alone, no :: or 0.0.0.0


# --------------------------------------------------------------------------- strays

@pytest.mark.unit
def test_a_stray_connection_is_closed_and_counted_never_fatal():
    key = jobkey.hello_key(jobkey.new_key())
    ls = socket.create_server(("127.0.0.1", 0))
    addr = ls.getsockname()
    res = {}
    th = threading.Thread(target=lambda: res.update(got=accept_workers(
        ls, 2, MAC_HELLO.size, mac_parser([0, 1], key), 10.0, hello_s=0.5)))
    th.start()
    socks = [socket.create_connection(addr) for _ in range(6)]
    socks[0].sendall(b"GET / HTTP/1.0\r\n\r\n" * 3)          # garbage
    socks[1].sendall(mac_hello(0, jobkey.hello_key(jobkey.new_key())))  # another key
    socks[2].sendall(mac_hello(7, key))                     # no such worker
    # socks[3] says nothing
    socks[4].sendall(mac_hello(1, key))
    time.sleep(0.1)
    socks[5].sendall(mac_hello(1, key)[:10])                # worker 1 again, cut short
    socks[5].close()
    late = socket.create_connection(addr)
    late.sendall(mac_hello(0, key))
    th.join(15)
    got = res["got"]
    assert sorted(got.conns) == [0, 1] and got.strays == 5
    for s in [*socks, late, *got.conns.values(), ls]:
        s.close()


@pytest.mark.unit
def test_a_mid_job_doorway_never_waits_on_a_connection_and_takes_only_valid_hellos():
    """accept.Doorway (a TCP server's poll, at each op, for a restarted
    worker's new connection): a poll returns at once, with nothing there
    and with a silent connection there alike, whose hello may still come
    by a later poll; a valid hello is taken, a bad one closed and counted,
    a silent one closed after hello_s."""
    from ltpx.control.accept import Doorway
    key = jobkey.hello_key(jobkey.new_key())
    ls = socket.create_server(("127.0.0.1", 0))
    door = Doorway(ls, MAC_HELLO.size, mac_parser([0, 1], key), hello_s=1.0)
    assert door.poll().conns == {}
    socks = [socket.create_connection(ls.getsockname()) for _ in range(3)]
    socks[1].sendall(mac_hello(1, jobkey.hello_key(jobkey.new_key())))   # another key
    time.sleep(0.1)
    got = door.poll()      # socks[0] and [2] silent: not waited out (hello_s would close them)
    assert got.conns == {} and got.strays == 1 and door.pending == 2
    socks[0].sendall(mac_hello(1, key))        # a hello that comes later
    time.sleep(0.1)
    got = door.poll()
    assert sorted(got.conns) == [1] and got.strays == 0 and door.pending == 1
    time.sleep(1.1)
    assert door.poll().strays == 1 and door.pending == 0    # socks[2], silent past hello_s
    door.close()
    for c in [*socks, *got.conns.values(), ls]:
        c.close()


@pytest.mark.unit
def test_a_late_hello_is_taken_and_silent_connections_are_bounded():
    """A worker's hello that TCP re-sent for seconds (heavy loss: at 30 % on
    every rig port the TCP arm's workers were turned away at 5 s) is still
    taken, while connections that say nothing are bounded: beyond
    MAX_PENDING the oldest is closed, never fatal."""
    from ltpx.control import accept
    key = jobkey.hello_key(jobkey.new_key())
    ls = socket.create_server(("127.0.0.1", 0), backlog=accept.MAX_PENDING + 8)
    addr = ls.getsockname()
    res = {}
    th = threading.Thread(target=lambda: res.update(got=accept_workers(
        ls, 1, MAC_HELLO.size, mac_parser([0], key), 20.0)))
    th.start()
    silent = [socket.create_connection(addr) for _ in range(accept.MAX_PENDING + 3)]
    worker = socket.create_connection(addr)
    time.sleep(6.0)                                         # past the old 5 s limit
    worker.sendall(mac_hello(0, key))
    th.join(15)
    got = res["got"]
    assert sorted(got.conns) == [0] and got.strays == accept.MAX_PENDING + 3
    assert silent[0].recv(1) == b""                         # the oldest was closed
    for s in [*silent, worker, *got.conns.values(), ls]:
        s.close()


@pytest.mark.unit
def test_a_flood_of_silent_connections_never_evicts_a_worker_mid_hello(caplog):
    """A worker has sent part of its hello when MAX_PENDING + 6 silent
    connections arrive: the silent ones are closed to make room, never the
    worker's, whose hello then completes; the first few strays are logged
    each and the rest in one summary line, not one WARNING each."""
    from ltpx.control import accept
    key = jobkey.hello_key(jobkey.new_key())
    ls = socket.create_server(("127.0.0.1", 0), backlog=accept.MAX_PENDING + 16)
    addr = ls.getsockname()
    res = {}
    hello = mac_hello(0, key)
    with caplog.at_level(logging.WARNING, logger="ltpx.accept"):
        th = threading.Thread(target=lambda: res.update(got=accept_workers(
            ls, 1, MAC_HELLO.size, mac_parser([0], key), 20.0)))
        th.start()
        worker = socket.create_connection(addr)
        worker.sendall(hello[:10])
        time.sleep(0.3)                                     # the server has its first bytes
        flood = [socket.create_connection(addr) for _ in range(accept.MAX_PENDING + 6)]
        time.sleep(0.5)
        worker.sendall(hello[10:])
        th.join(15)
    got = res["got"]
    assert sorted(got.conns) == [0] and got.strays == accept.MAX_PENDING + 6
    each = [r for r in caplog.records if "was not a worker" in r.getMessage()]
    assert len(each) == accept.LOGGED
    assert any(f"{accept.MAX_PENDING + 6} connections in all were not workers" in r.getMessage()
               for r in caplog.records)
    for s in [*flood, worker, *got.conns.values(), ls]:
        s.close()


@pytest.mark.root     # the agents set TCP congestion control
def test_the_tcp_baseline_ps_runs_its_rounds_past_a_stray_connection():
    port = socket.create_server(("127.0.0.1", 0))
    p_num = port.getsockname()[1]
    port.close()
    agent = [sys.executable, "-m", "ltpx.control.bench.tcp"]
    ps = subprocess.Popen([*agent, "ps", "--bind", "127.0.0.1", "--port", str(p_num),
                           "--size", "4096", "--workers", "2", "--rounds", "3"],
                          stdout=subprocess.PIPE, text=True)
    assert ps.stdout.readline().strip() == "ready"
    stray = socket.create_connection(("127.0.0.1", p_num))
    stray.sendall(b"\xff\xff\xff\xff")                    # worker 4294967295
    ws = [subprocess.Popen([*agent, "worker", "--ps", "127.0.0.1", "--port", str(p_num),
                            "--size", "4096", "--id", str(i)], stdout=subprocess.PIPE)
          for i in (0, 1)]
    out = outputs([ps, *ws], 60)
    stray.close()
    lines = [json.loads(x) for x in out[0][0].splitlines()]
    assert ps.returncode == 0 and [x["round"] for x in lines if "round" in x] == [0, 1, 2]
    assert lines[-1] == {"done": True, "strays": 1}


@pytest.mark.unit
def test_bench_ranks_never_get_the_key_on_their_argv():
    for f in (ROOT / "control" / "bench").glob("*.py"):
        text = f.read_text()
        assert '"--secret"' not in text and "secret.hex()" not in text, f.name


# --------------------------------------------------------------------------- whole jobs

def _job(steps: int, key_path: str | None, workers: int = 2, during=None):
    """Run store_soak_job.py over TCP on loopback with this process hosting
    the store; during(store, stop) runs in a thread while it does."""
    store = loopback_store(120.0)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port),
               TORCHELASTIC_USE_AGENT_STORE="True", LTP_TRANSPORT="tcp", LTP_IP="127.0.0.1",
               LTP_WORLD_SIZE=str(workers + 1), WORLD_SIZE=str(workers + 1),
               OMP_NUM_THREADS="1", TORCH_CPP_LOG_LEVEL="ERROR")
    if key_path:
        env[jobkey.ENV] = key_path
    procs = [subprocess.Popen([sys.executable, str(SOAK), str(steps)], cwd=ROOT,
                              env=dict(env, LTP_RANK=str(r), RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(workers + 1)]
    stop = threading.Event()
    th = threading.Thread(target=during, args=(store, stop), daemon=True) if during else None
    if th:
        th.start()
    try:
        outs = outputs(procs, 300)
    finally:
        stop.set()
        if th:
            th.join(10)
    return procs, outs, store


def _scan(needles: list[bytes], found: list, seen: list):
    def run(store, stop):
        client = dist.TCPStore("127.0.0.1", store.port, None, False, timedelta(seconds=1))
        while not stop.wait(0.05):
            for k in client.list_keys():
                try:
                    v = client.get(k)
                except RuntimeError:        # deleted since it was listed
                    continue
                seen.append(k)
                found.extend((k, n) for n in needles if n in v or n in k.encode())
    return run


@pytest.mark.root
@pytest.mark.slow
def test_no_store_value_holds_the_key_and_the_store_stays_small(tmp_path):
    """A 300-step keyed job (600 ops): a process reading every key and value
    of the store every 50 ms finds neither the job key nor any key derived
    from it (raw or hex), nor "secret"; the store's key count stays flat."""
    path = _key_file(tmp_path)
    key = jobkey.read_key_file(path)
    found, seen, needles = [], [], [b"secret"]
    for k in (key, jobkey.token_secret(key), jobkey.store_key(key), jobkey.hello_key(key).key):
        needles.extend([k, k.hex().encode(), k.hex().upper().encode()])
    procs, outs, store = _job(300, path, during=_scan(needles, found, seen))
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert not found and len(seen) > 100
    assert "no job key" not in outs[0][1]
    counts = [json.loads(x) for x in outs[1][0].splitlines() if x.startswith('{"step"')]
    keys = [c["keys"] for c in counts]
    digests = {json.loads(o.splitlines()[-1])["digest"] for o, _ in outs[1:]}
    assert len(digests) == 1 and len(keys) == 12
    print("store keys by step:", {c["step"]: c["keys"] for c in counts},
          "at the end:", store.num_keys())
    # flat: the last 200 steps hold no more keys than the first 100 (+ a few
    # in flight), where 600 ops that kept theirs would leave thousands
    assert max(keys[4:]) <= max(keys[:4]) + 6 and store.num_keys() < 40


@pytest.mark.root
@pytest.mark.slow
def test_a_forged_join_in_a_keyed_job_ends_it_with_a_clear_error(tmp_path):
    """A process without the key asks to join as worker 999: the server
    refuses the value naming the key (no IndexError) and the job ends."""
    def during(store, stop):
        while not store.check([KEY + "floor"]) and not stop.is_set():   # a few ops in
            time.sleep(0.05)
        n = store.add(KEY + "join", 1)
        store.set(KEY + f"join/{n}", "999")
    procs, outs, store = _job(400, _key_file(tmp_path), during=during)
    server_err = outs[0][1]
    assert procs[0].returncode == 1, server_err[-2000:]
    assert f"store key {KEY}join/1: the value carries no signature" in server_err
    for _, err in outs:
        assert "IndexError" not in err and "KeyError" not in err


# `ltp launch`'s key files (servers the job key, each worker its own member
# file): tests/test_member_keys.py


def _state(**change):
    import torch
    st = {"params": [torch.ones(3, 2), torch.ones(4)], "optimizer": {}, "steps": 5,
          "ks": [1] * 5, "extra": {},
          "exchange": {"seq": 9, "up": 20,
                       "ahead": {"prev": GOOD_OP.to_json(),
                                 "after": [[GOOD_OP.to_json(), GOOD_OP.to_json()]]},
                       "view": {"members": [0, 1], "absent": []},
                       "lost": {}, "dropped": {}, "rejoined": {1: 3}}}
    for k, v in change.items():
        if k in st["exchange"]:
            st["exchange"][k] = v
        else:
            st[k] = v
    return st


@pytest.mark.unit
@pytest.mark.parametrize("change, word", [
    ({"params": "tensors"}, "no parameters"),
    ({"params": [1, 2]}, "parameter 0 is not"),
    ({"params": [__import__("torch").ones(2, 3), __import__("torch").ones(4)]}, "shape"),
    ({"params": [__import__("torch").ones(3, 2, dtype=__import__("torch").float64),
                 __import__("torch").ones(4)]}, "parameter 0"),
    ({"steps": -1}, "steps must be"), ({"steps": True}, "steps must be"),
    ({"ks": [1] * 9}, "ks must be"), ({"ks": [1, -2]}, "a k must be"),
    ({"seq": "9"}, "seq must be"),
    ({"ahead": {"prev": '{"kind": "step", "sizes": [-4]}', "after": []}}, "size"),
    ({"ahead": {"prev": None, "after": [[GOOD_OP.to_json(), '{"kind": "nope"}']]}}, "nope"),
    ({"ahead": {"prev": None, "after": [[GOOD_OP.to_json()]] * 65}}, "at most 64"),
    ({"ahead": {"prev": None, "step": '{"kind": "step", "sizes": [-1]}', "after": []}}, "size"),
    ({"view": {"members": [0, 7], "absent": []}}, "view.members"),
    ({"rejoined": {9: 1}}, "rejoined"), ({"lost": [1]}, "lost must map"),
    ({"optimizer": None}, "dicts"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_a_handed_over_state_is_checked_before_anything_is_loaded(change, word):
    """elastic.check_state, which load_blob and a checkpoint's resume call
    before they copy anything: types, shapes and ranges, each refusal a
    StoreValueError naming what was wrong."""
    import torch
    from ltpx.control.torchapi.elastic import check_state
    params = [torch.zeros(3, 2), torch.zeros(4)]
    check_state(_state(), params, 2)
    with pytest.raises(sealing.StoreValueError, match=f"state handed over is refused: .*{word}"):
        check_state(_state(**change), params, 2)


@pytest.mark.unit
def test_a_keyless_job_whose_store_is_not_on_loopback_refuses_to_start(monkeypatch):
    """require_secret's default: a rank with no key file refuses (one line
    naming the fix) where MASTER_ADDR is not a loopback address, or does
    not resolve; on loopback it runs keyless; an explicit 0 or 1 wins."""
    from ltpx.control.torchapi.job import job_key
    from ltpx.control.torchapi.settings import Settings
    monkeypatch.delenv("LTP_SECRET_FILE", raising=False)
    monkeypatch.delenv("LTP_REQUIRE_SECRET", raising=False)
    for addr, refused in [("127.0.0.1", False), ("localhost", False), ("::1", False),
                          ("198.18.99.1", True), ("no-such-host.invalid", True)]:
        monkeypatch.setenv("MASTER_ADDR", addr)
        s = Settings.resolve({})
        if refused:
            with pytest.raises(UsageError, match=f"the store \\(MASTER_ADDR={addr}\\) is not on "
                               "loopback and no job key was given: set LTP_SECRET_FILE"):
                job_key(s)
        else:
            assert job_key(s) is None
    assert job_key(Settings.resolve({"require_secret": False})) is None   # still 198.18/invalid
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    with pytest.raises(UsageError, match="require_secret is set"):
        job_key(Settings.resolve({"require_secret": True}))


@pytest.mark.slow
def test_init_without_a_key_against_a_store_off_loopback_exits_naming_the_fix(tmp_path):
    """The same through lt.init() in a rank of its own: it stops before it
    connects anywhere, with the usage error's one line."""
    script = tmp_path / "rank.py"
    script.write_text("import ltpx.torch as lt\nlt.init()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LTP_")}
    env.update(MASTER_ADDR="198.18.99.1", MASTER_PORT="29999", RANK="0", WORLD_SIZE="2",
               LTP_TRANSPORT="tcp")
    p = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode != 0
    assert "is not on loopback and no job key was given: set LTP_SECRET_FILE" in p.stderr


@pytest.mark.unit
def test_files_holding_tokens_models_or_traces_are_private_and_never_follow_a_symlink(
        tmp_path):
    """A capture, a checkpoint and a trace are made 0600 whatever the
    umask, and a symlink planted where one is to be written is never
    followed: its target stays as it was (a capture's name that is a
    symlink is refused, a temporary file's is replaced)."""
    from ltpx.control.torchapi import trace
    from ltpx.control.torchapi.checkpoint import write_durably
    from ltpx.dataplane.xdp.pcap import PcapError, Writer
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    old = os.umask(0o022)
    try:
        write_durably(str(tmp_path / "ck.pt"), b"model")
        trace.write(str(tmp_path / "t.json"), {"traceEvents": []})
        w = Writer(str(tmp_path / "c.pcap"))
        w.close()
        for name in ("ck.pt", "t.json", "c.pcap"):
            assert os.stat(tmp_path / name).st_mode & 0o777 == 0o600, name
        (tmp_path / "link.pcap").symlink_to(victim)
        with pytest.raises(PcapError, match="cannot write"):
            Writer(str(tmp_path / "link.pcap"))
        tmp = tmp_path / f"t2.json.{os.getpid()}.tmp"     # trace.write's temporary name
        tmp.symlink_to(victim)
        trace.write(str(tmp_path / "t2.json"), {"traceEvents": []})
        assert json.loads((tmp_path / "t2.json").read_text()) == {"traceEvents": []}
        assert victim.read_text() == "keep me"
    finally:
        os.umask(old)


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["meta", "go", "desc", "fin"])
def test_a_deeply_nested_or_huge_store_value_is_one_clear_error(store, kind):
    """A value nested past the JSON parser's depth, or larger than any of
    the job's, is refused with StoreValueError naming the key, never a
    RecursionError or a MemoryError from deep inside; an op may not declare
    more elements in all than MAX_OP_ELEMS."""
    co = Coord(store, W, 5.0)                     # keyless: the payload is parsed as is
    _, _, read = FORGED[kind]
    name = next(iter(FORGED[kind][0]))
    _forge(store, name, "[" * 200_000 + "]" * 200_000)
    with pytest.raises(sealing.StoreValueError, match=f"store key {KEY}{name}: .*too deeply"):
        read(co)
    with pytest.raises(ValueError, match="bytes of JSON, more than"):   # the store's own limit
        storevalues.json_dict(b" " * (storevalues.MAX_JSON + 1))
    huge = Op(STEP, sizes=(storevalues.MAX_ELEMS,) * 2)
    with pytest.raises(ValueError, match="elements in all"):
        storevalues.check_op(huge, W)
    # the loss policy's wire: carry is a bool, and only on a 2-byte wire
    assert storevalues.check_op(Op(STEP, sizes=(5,), wire="bf16", carry=True), W).carry
    for bad in (Op(STEP, sizes=(5,), carry=True), Op(STEP, sizes=(5,), wire="bf16", carry=1),
                Op(STEP, sizes=(5,), wire="uint8", carry=True)):
        with pytest.raises(ValueError, match="carry"):
            storevalues.check_op(bad, W)


@pytest.mark.unit
def test_the_exact_groups_store_values_are_sealed_as_the_jobs_are(store):
    """The `ltp` backend's gloo group rendezvouses through SealedStore: what
    a trainer sets is signed (over the run) under ltp-exact/, a value an
    outsider sets there, or one of an earlier run, is refused with
    StoreValueError naming the key, and counters pass through."""
    import torch.distributed as tdist
    from ltpx.control.torchapi.backend import EXACT_KEYS, SealedStore
    key = jobkey.new_key()

    def trainer(w, run):
        auth = jobkey.store_auth(jobkey.member_keys(key, w), w, run)
        auth.learn(jobkey.store_auth(key).directory(2))
        return SealedStore(tdist.PrefixStore(EXACT_KEYS, store),
                           sealing.Seal(auth, prefix=KEY))
    raw = tdist.PrefixStore(EXACT_KEYS, store)                       # what gloo's keys hold
    t0, t1 = trainer(0, b"r2"), trainer(1, b"r2")
    t0.set("0/0", b"198.18.0.10:4000")
    assert raw.get("0/0").startswith(sealing.SIGNED)
    assert t1.get("0/0") == b"198.18.0.10:4000"
    raw.set("0/1", b"10.6.6.6:4000")                                  # an outsider's
    with pytest.raises(sealing.StoreValueError, match=f"store key {EXACT_KEYS}0/1: .*no signature"):
        t0.get("0/1")
    trainer(1, b"r1").set("0/1", b"198.18.0.11:4000")                 # an earlier run's
    with pytest.raises(sealing.StoreValueError, match="replayed from an earlier run"):
        t0.get("0/1")
    assert t0.add("n", 2) == 2 and t1.add("n", 1) == 3 and t0.check(["0/0"])
