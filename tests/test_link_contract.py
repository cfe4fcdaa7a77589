# SPDX-License-Identifier: Apache-2.0
"""The link contract (control/torchapi/links.py): every transport implements
ServerLink or WorkerLink, a link that misses a method cannot be made, and no
module reaches past the contract with hasattr/getattr on a link. And the
transport's A/B knobs (control/transport/options.py): a frozen PushOptions
per endpoint or push, never a class attribute set for the whole process."""
from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from ltpx.control.torchapi.link_ltp import LtpServerLink
from ltpx.control.torchapi.link_ltp_worker import LtpWorkerLink
from ltpx.control.torchapi.link_tcp import TcpServerLink, TcpWorkerLink
from ltpx.control.torchapi.links import ServerLink, WorkerLink
from ltpx.control.torchapi.settings import Settings
from ltpx.control.torchapi.shards import ShardLinks
from ltpx.control.transport.ackclock import ClockPush
from ltpx.control.transport.options import DEFAULTS, PushOptions
from ltpx.control.transport.push import Push
from ltpx.errors import CommError
from tcp_links import apart

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("cls, base", [(LtpServerLink, ServerLink), (TcpServerLink, ServerLink),
                                       (LtpWorkerLink, WorkerLink), (TcpWorkerLink, WorkerLink)])
def test_every_transport_implements_the_contract(cls, base):
    assert issubclass(cls, base) and not cls.__abstractmethods__
    assert cls.name in ("ltp", "tcp") and isinstance(cls.opens, bool)


def test_a_link_missing_a_method_cannot_be_made():
    class Half(WorkerLink):
        name, opens = "half", False

        def address(self):
            return {}

    with pytest.raises(TypeError, match="abstract"):
        Half()


def test_a_sharded_workers_links_add_up_their_counters():
    class Counting(WorkerLink):
        name, opens = "count", False

        def __init__(self, n):
            self.n = n

        @property
        def uplink(self):
            return {"pushes": self.n, "sent": 2 * self.n}

        address = connect = ensure = expect = expect_wire = pull = close = (
            lambda self, *a, **k: None)

        def push(self, r, buf, reliable, answer=None):
            return True

    a, b = Counting(1), Counting(3)
    links = ShardLinks([a, b])
    assert links.parts() == [a, b] and a.parts() == [a]
    assert links.uplink == {"pushes": 4, "sent": 8}
    assert a.push(1, np.zeros(2, np.float32), False)


@pytest.mark.parametrize("near", [False, True], ids=["sockets", "in-memory"])
def test_a_tcp_job_exchanges_a_round_through_the_contract_alone(near):
    """A real server link and two worker links over loopback, driven only by
    the contract's calls. TCP delivers every byte or fails, so an answer
    sent `to` one worker with a short `wait_s` reaches every connected
    worker (each stream must carry every answer), as ServerLink.send says.
    In memory (a co-located trainer's links, handoff.py) the same holds: a
    small piece is held for its taker as a socket's buffer would."""
    # the machine's own congestion control: one an unprivileged process may set
    cc = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    s = Settings.resolve({"ip": "127.0.0.1", "cc": cc})
    server: ServerLink = TcpServerLink(s, 2)
    workers: list[WorkerLink] = [TcpWorkerLink(s, w, 2) for w in range(2)]
    try:
        seen = (lambda m: m) if near else apart
        for w in workers:
            w.connect(seen({**server.address(), "ip": "127.0.0.1"}))
        server.connect({i: seen(w.address()) for i, w in enumerate(workers)})
        assert [w.local for w in workers] == [near, near]
        server.ensure(3)
        server.open(1, 3, [0, 1], False, key=("step", 0))
        for i, w in enumerate(workers):
            assert not w.push(1, np.full(3, i + 1, np.float32), False)
        got = server.gather(1, 3, [0, 1])
        total = got.values.sum(axis=0)
        assert total.tolist() == [3.0, 3.0, 3.0] and not got.early_closed
        server.send(2, total, False, to=[0], wait_s=0.5)
        for w in workers:
            w.expect(2, 3)
            out = np.zeros(3, np.float32)
            w.pull(2, out)
            assert out.tolist() == [3.0, 3.0, 3.0]
    finally:
        for w in workers:
            w.close()
        server.close()


@pytest.mark.unit
def test_a_tcp_worker_whose_server_is_silent_gets_a_comm_error_naming_the_wait():
    """A pull from a server that sends nothing ends after the link's
    timeout with a CommError (not the socket's bare TimeoutError)."""
    s = Settings.resolve({"ip": "127.0.0.1", "cc": Path(
        "/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip(), "timeout": 0.5})
    server, worker = TcpServerLink(s, 1), TcpWorkerLink(s, 0, 1)
    try:
        worker.connect(apart({**server.address(), "ip": "127.0.0.1"}))
        server.connect({0: apart(worker.address())})
        with pytest.raises(CommError, match="answer 3: the server's connection moved no byte "
                                            "for 0.5s"):
            worker.pull(3, np.zeros(4, np.float32))
    finally:
        worker.close()
        server.close()


def test_no_module_reaches_past_the_contract():
    bad = []
    for p in (ROOT / "control").rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") in (
                    "hasattr", "getattr", "setattr") and node.args:
                target = ast.unparse(node.args[0])
                if re.search(r"(^|\.)link(s)?$", target):
                    bad.append(f"{p.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Attribute) and re.search(
                            r"(^|\.)link$", ast.unparse(t.value)) and t.attr in ("peers", "wait_s"):
                        bad.append(f"{p.relative_to(ROOT)}:{node.lineno}: {ast.unparse(t)} = ...")
    assert not bad, "\n".join(bad)


def test_push_options_are_frozen_checked_and_default_to_what_a_job_runs():
    assert PushOptions(sender="auto", xdp_recovery=True, poll_s=None, rto_rtts=2) == DEFAULTS
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULTS.poll_s = 0.001
    for bad in ({"sender": "carrier-pigeon"}, {"poll_s": 0}, {"rto_rtts": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            PushOptions(**bad)
    # the knobs live on the options, not on the push classes
    for knob in ("xdp_recovery", "poll_s", "rto_rtts"):
        assert not hasattr(ClockPush, knob) and not hasattr(Push, knob)


def test_no_module_sets_a_push_class_or_an_endpoints_sender_kind():
    bad = []
    for p in [*(ROOT / "control").rglob("*.py"), *(ROOT / "tools").rglob("*.py"),
              *(ROOT / "tests").glob("*.py")]:
        for node in ast.walk(ast.parse(p.read_text())):
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            for t in targets:
                if isinstance(t, ast.Attribute) and (
                        ast.unparse(t.value) in ("ClockPush", "Push")
                        or ast.unparse(t).endswith("sender.kind")):
                    bad.append(f"{p.relative_to(ROOT)}:{node.lineno}: {ast.unparse(t)} = ...")
    assert not bad, "\n".join(bad)


class _FailingTcpLike(ServerLink):
    """A link that delivers every byte or fails (as TCP does), and fails."""
    name, opens = "tcp", False

    def __init__(self):
        self.sends = 0

    address = connect = configure = ensure = open = cancel = gather = close = (
        lambda self, *a, **k: None)

    def send(self, d, buf, group, *, to=None, wait_s=None, critical_from=None):
        from ltpx.errors import CommError
        self.sends += 1
        raise CommError("sending to worker 1: broken pipe")


def test_a_failed_send_of_a_link_that_delivers_every_byte_is_not_repeated():
    # a resend would put a second frame of the answer on the workers' streams
    import types
    from ltpx.control.torchapi.server import Server
    from ltpx.errors import CommError
    link = _FailingTcpLike()
    srv = Server(link, types.SimpleNamespace(view=None), workers=2, group_ok=False)
    with pytest.raises(CommError):
        srv.answer_to([0, 1], 5, np.zeros(4, np.float32), group=False)
    assert link.sends == 1


@pytest.mark.parametrize("metas, group", [
    ({0: {}, 1: {}}, True),                                  # every worker on 7410
    ({0: {"ltp_port": 7410, "shared": False}, 1: {}}, True),
    ({0: {"ltp_port": 7411, "shared": True}, 1: {}}, False),  # seated on a shared device
    ({0: {"ltp_port": 7410, "shared": True}, 1: {}}, True),   # ... on the group's port
    ({0: {}, 1: {"ltp_port": 7415}}, False)])                # a port of its own, unshared
def test_a_server_answers_by_unicast_where_a_group_frame_would_miss_a_worker(metas, group,
                                                                            capsys):
    """A group (broadcast) answer goes to port 7410 and reaches one program
    there: a worker seated on a shared device on another port, or one
    unshared on another LTP port, would never get it (one seated on 7410
    does), so the server answers every worker by unicast then,
    to each worker's own port, and says why."""
    link = LtpServerLink(Settings(dev="lo", ip="127.0.0.1"), 2, "10.9.9.255")
    link.connect({w: {"ip": f"198.18.0.{10 + w}", **m} for w, m in metas.items()})
    assert (link.group is not None) == group
    assert [p.port for p in link.peers] == [metas[w].get("ltp_port", 7410) for w in (0, 1)]
    err = capsys.readouterr().err
    assert ("answers go by unicast" in err) == (not group)
