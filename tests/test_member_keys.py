# SPDX-License-Identifier: Apache-2.0
"""Per-rank key files (issue 26): servers read the job key, each worker a
member key file of its own (control/trust/jobkey.py), so a hostile member cannot
derive the job key or another worker's tokens.

Here: the file on its own (what it holds and what it refuses, `ltp key
member`); a TCP job on loopback whose workers hold member files trains to
the job-key digest, and a worker handed another's file stops with a clear
error; on a rig, the files `ltp launch` hands (real ranks), a group answer
a member takes only with the group key, and `ltp train` with the group and
the unicast downlink training to the same digest.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from conftest import outputs, reap, star_rig
from ltpx.control.trust import jobkey
from ltpx.control.trust.hello import mac_hello, worker_key
from ltpx.control.launcher.storehost import loopback_store
from ltpx.control.trust import tokens
from ltpx.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SOAK = Path(__file__).resolve().parent / "store_soak_job.py"
RIG = f"mk{os.getpid() % 100000}"
KINDS = (tokens.UP, tokens.UP_ACK, tokens.DOWN, tokens.DOWN_ACK)
JOB = 0x2626


def _key_file(folder, key: bytes | None = None, name: str = "job.key") -> str:
    p = Path(folder) / name
    p.write_text((key or jobkey.new_key()).hex() + "\n")
    os.chmod(p, 0o600)
    return str(p)


def _not_derivable(text: str, key: bytes, worker: int, workers: int, servers: int) -> None:
    """`text` holds neither the job key nor anything derived from it but the
    worker's own keys and the shared store key."""
    forbidden = [key, jobkey.hello_key(key).key]
    for i in range(servers):
        s = jobkey.token_secret(key, i)
        forbidden += [s] + [tokens.member_key(s, w) for w in range(workers) if w != worker]
        forbidden.append(tokens.answer_key(s).private_bytes(   # the server's signing key
            Encoding.Raw, PrivateFormat.Raw, NoEncryption()))
    forbidden += [worker_key(jobkey.hello_key(key).key, w) for w in range(workers) if w != worker]
    for k in forbidden:
        assert k.hex() not in text.lower() and k.hex().upper() not in text


def _own_flows_only(m: jobkey.MemberKeys, key: bytes, workers: int, servers: int) -> None:
    """Every token the member's keys make is its own flows' (for each shard),
    equal to the server's; another worker's flow it cannot make."""
    for i in range(servers):
        ms, full = jobkey.token_secret(m, i), jobkey.token_secret(key, i)
        for r in (0, 7, 2**31):
            assert [tokens.derive(ms, JOB, r, m.worker, k) for k in KINDS] == \
                [tokens.derive(full, JOB, r, m.worker, k) for k in KINDS]
            for w in range(workers):
                if w != m.worker:
                    with pytest.raises(ValueError, match=f"worker {w}'s flows"):
                        tokens.derive(ms, JOB, r, w, tokens.UP)


# --------------------------------------------------------------------------- the file

@pytest.mark.unit
@pytest.mark.parametrize("group", [True, False])
def test_a_member_file_holds_its_own_keys_only(tmp_path, group):
    key = jobkey.new_key()
    m = jobkey.member_keys(key, 2, servers=2, group=group)
    text = jobkey.member_text(m)
    _not_derivable(text, key, 2, 5, 2)
    _own_flows_only(m, key, 5, 2)
    path = _key_file(tmp_path, name="w2.key")
    Path(path).write_text(text)
    assert jobkey.read_key_file(path) == m and json.loads(text)["ltpx_member_key"] == 1
    assert repr(m) == f"MemberKeys(worker=2, shards=2, group={group})"   # no keys in logs
    assert jobkey.store_key(m) == jobkey.store_key(key)     # shared: documented
    assert mac_hello(2, jobkey.hello_key(m)) == mac_hello(2, jobkey.hello_key(key))
    with pytest.raises(ValueError, match="worker 2's hello"):
        mac_hello(1, jobkey.hello_key(m))
    server = tokens.RoundTokens(jobkey.token_secret(key, 1), JOB)
    worker = tokens.RoundTokens(jobkey.token_secret(m, 1), JOB, self_id=2)
    assert worker.send(9, 2) == server.receive(9, 2) and worker.receive(9, 2) == server.send(9, 2)
    assert worker.group(9) == (server.group(9) if group else None)
    assert ("group" in text) == group
    with pytest.raises(UsageError, match="keys for 2 server"):
        jobkey.token_secret(m, 2)
    gloo = jobkey.member_keys(key, 2, servers=0)           # no LTP server: no token keys
    assert jobkey.parse_member(jobkey.member_text(gloo), "gloo") == gloo and not gloo.tokens


@pytest.mark.unit
def test_the_group_token_comes_from_a_group_key_not_the_secret():
    s = tokens.new_secret()
    g = tokens.group_key(s)
    assert len(g) == 32 and g != s and g not in (tokens.member_key(s, w) for w in range(4))
    with_g, without = tokens.member(s, 1, group=True), tokens.member(s, 1)
    assert with_g.group == g and without.group is None
    t = tokens.derive(s, JOB, 3, kind=tokens.GROUP)
    assert tokens.derive(with_g, JOB, 3, kind=tokens.GROUP) == t
    assert tokens.derive(without, JOB, 3, kind=tokens.GROUP) is None
    with pytest.raises(ValueError, match="32 bytes"):
        tokens.RoundTokens(tokens.MemberSecret(1, with_g.key, b"short"), JOB, self_id=1)


GOOD = jobkey.member_text(jobkey.member_keys(bytes(32), 1))


def _edit(**kw) -> str:
    doc = json.loads(GOOD)
    doc.update(kw)
    return json.dumps({k: v for k, v in doc.items() if v is not None})


@pytest.mark.unit
@pytest.mark.parametrize("text,words", [
    ("{not json", "bad JSON"),
    (_edit(ltpx_member_key=2), '"ltpx_member_key": 1'),
    ('{"worker": 1}', '"ltpx_member_key": 1'),
    (_edit(worker=-1), "'worker' must be 0..65534"),
    (_edit(worker="1"), "'worker' must be 0..65534"),
    (_edit(tokens=None), "'tokens' must be a list"),
    (_edit(tokens=["abcd"]), "'tokens' must be a list"),
    (_edit(tokens="00" * 32), "'tokens' must be a list"),
    (_edit(store="zz"), "'store' must be"),
    (_edit(hello=None), "'hello' must be"),
    (_edit(group=["00" * 32] * 2), "1 token keys and 2 group keys"),
    (_edit(sign=None), "'sign' must be a list"),        # made before answers were signed
    (_edit(sign=["00" * 32] * 2), "1 token keys and 2 server answer keys"),
])
def test_a_malformed_member_file_is_refused_in_one_line(tmp_path, text, words):
    p = tmp_path / "w1.key"
    p.write_text(text)
    os.chmod(p, 0o600)
    with pytest.raises(UsageError) as e:
        jobkey.read_key_file(str(p))
    msg = str(e.value)
    assert words in msg and str(p) in msg and "\n" not in msg and "ltp key member" in msg


@pytest.mark.unit
def test_a_readable_member_file_is_refused(tmp_path):
    p = tmp_path / "w1.key"
    p.write_text(GOOD)
    os.chmod(p, 0o644)
    with pytest.raises(UsageError, match=f"mode 0644.*chmod 600 {p}"):
        jobkey.read_key_file(str(p))


@pytest.mark.unit
def test_a_rank_refuses_a_member_file_not_its_own():
    m = jobkey.member_keys(jobkey.new_key(), 1, servers=2)
    jobkey.check_member(m, False, 1, 2)                     # its own: fine
    jobkey.check_member(jobkey.new_key(), True, None, 2)    # a job key: fine anywhere
    with pytest.raises(UsageError, match="worker 1's member key file, but this rank is "
                       "worker 0.*--worker 0"):
        jobkey.check_member(m, False, 0, 2)
    with pytest.raises(UsageError, match="this rank is a server: a server rank needs the job"):
        jobkey.check_member(m, True, None, 2)
    with pytest.raises(UsageError, match="keys for 2 server.*not for server 2"):
        jobkey.check_member(m, False, 1, 3)


@pytest.mark.unit
def test_launcher_keys_servers_the_job_key_workers_their_own_file(tmp_path):
    key = jobkey.new_key()
    job = _key_file(tmp_path, key)
    Path(tmp_path / "w0.key").write_text(GOOD)
    os.chmod(tmp_path / "w0.key", 0o600)
    with pytest.raises(UsageError, match="member key file: a launcher needs the job key"):
        jobkey.for_launch({jobkey.ENV: str(tmp_path / "w0.key")})
    keys = jobkey.RankKeys(servers=2, group=False, environ={jobkey.ENV: job})
    try:
        assert keys.path("server", 0) == keys.path("server", 1) == job
        paths = [keys.path("worker", w) for w in range(3)]
        assert len(set(paths)) == 3 and keys.path("worker", 1) == paths[1]   # a restart: again
        for w, p in enumerate(paths):
            assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
            assert stat.S_IMODE(os.stat(os.path.dirname(p)).st_mode) == 0o700
            assert jobkey.read_key_file(p) == jobkey.member_keys(key, w, 2, group=False)
    finally:
        keys.close()
    assert not any(os.path.exists(p) for p in paths) and jobkey.read_key_file(job) == key
    made = jobkey.RankKeys(servers=1, environ={})     # no LTP_SECRET_FILE: one is made
    p = made.path("worker", 0)
    assert jobkey.read_key_file(p) == jobkey.member_keys(made.made.key, 0)
    made.close()
    assert not os.path.exists(made.job_path) and not os.path.exists(p)


def _ltp(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "ltp"), *argv], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


@pytest.mark.unit
def test_ltp_key_member_writes_a_workers_file(tmp_path):
    key = jobkey.new_key()
    job = _key_file(tmp_path, key)
    out = _ltp("key", "member", "--worker", "3", "--servers", "2", job)
    assert out.returncode == 0, out.stderr
    assert jobkey.parse_member(out.stdout, "stdout") == jobkey.member_keys(key, 3, 2)
    dest = tmp_path / "w1.key"
    assert _ltp("key", "member", "-w", "1", "--downlink", "unicast", job, "-o",
                str(dest)).returncode == 0
    assert stat.S_IMODE(dest.stat().st_mode) == 0o600
    assert jobkey.read_key_file(str(dest)) == jobkey.member_keys(key, 1, group=False)
    for argv, words in ((["-w", "1", job, "-o", str(dest)], "the file exists"),
                        (["-w", "x", job], "not a worker id"),
                        (["-w", "1", "--servers", "0", job], "not a server count"),
                        (["-w", "1", "--downlink", "multicast", job], "invalid choice"),
                        (["-w", "1", str(dest)], "worker 1's member key file: give the job"),
                        (["-w", "1", str(tmp_path / "none")], "cannot open"),
                        ([job], "--worker")):
        bad = _ltp("key", "member", *argv)
        assert bad.returncode == 2 and words in bad.stderr, (argv, bad.stderr)
    assert "ltp key member --worker 0 job.key -o w0.key" in _ltp("key", "member", "-h").stdout


# ------------------------------------------------------------- a TCP job on loopback

def _tcp_job(files: list[str], steps: int = 30, timeout: float = 300):
    """store_soak_job.py over TCP on loopback, rank r reading files[r]; the
    job is ended (every rank stopped) once the first rank exits nonzero."""
    store = loopback_store(120.0)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port),
               TORCHELASTIC_USE_AGENT_STORE="True", LTP_TRANSPORT="tcp", LTP_IP="127.0.0.1",
               LTP_WORLD_SIZE=str(len(files)), WORLD_SIZE=str(len(files)),
               LTP_TIMEOUT="60", OMP_NUM_THREADS="1", TORCH_CPP_LOG_LEVEL="ERROR")
    procs = [subprocess.Popen([sys.executable, str(SOAK), str(steps)], cwd=ROOT,
                              env=dict(env, LTP_RANK=str(r), RANK=str(r),
                                       **{jobkey.ENV: f}),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r, f in enumerate(files)]
    try:
        return procs, outputs(procs, timeout)
    finally:
        reap(procs)


def _digests(outs) -> set[str]:
    return {json.loads(o.splitlines()[-1])["digest"] for o, _ in outs[1:]}


@pytest.mark.root
@pytest.mark.slow
def test_a_tcp_job_with_member_files_trains_as_with_the_job_key(tmp_path):
    """Server: the job key; each worker its member file (its own TCP hello,
    the store's MAC key): the same digest as every rank holding the job key."""
    key = jobkey.new_key()
    job = _key_file(tmp_path, key)
    members = []
    for w in range(2):
        members.append(_key_file(tmp_path, name=f"w{w}.key"))
        Path(members[-1]).write_text(jobkey.member_text(jobkey.member_keys(key, w)))
    procs, outs = _tcp_job([job, *members])
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    procs2, outs2 = _tcp_job([job, job, job])
    for p, (_, err) in zip(procs2, outs2):
        assert p.returncode == 0, err[-3000:]
    assert len(_digests(outs)) == 1 and _digests(outs) == _digests(outs2)


@pytest.mark.root
@pytest.mark.slow
def test_a_worker_given_another_workers_file_stops_with_a_clear_error(tmp_path):
    key = jobkey.new_key()
    w1 = _key_file(tmp_path, name="w1.key")
    Path(w1).write_text(jobkey.member_text(jobkey.member_keys(key, 1)))
    store = loopback_store(60.0)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port),
               TORCHELASTIC_USE_AGENT_STORE="True", LTP_TRANSPORT="tcp", LTP_IP="127.0.0.1",
               LTP_WORLD_SIZE="3", WORLD_SIZE="3", LTP_RANK="1", RANK="1",
               **{jobkey.ENV: w1}, OMP_NUM_THREADS="1", TORCH_CPP_LOG_LEVEL="ERROR")
    # worker 0 (rank 1) alone: the rendezvous places it without the others
    p = subprocess.Popen([sys.executable, str(SOAK), "5"], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = outputs([p], 120)[0]
    assert p.returncode == 1, err[-3000:]
    assert ("names worker 1's member key file, but this rank is worker 0: give each worker "
            "its own file (`ltp key member --worker 0 JOBKEYFILE`)") in err
    assert "Traceback" not in err or "UsageError" in err


# --------------------------------------------------------------------------- on a rig

@pytest.fixture(scope="module")
def rig():
    yield from star_rig(name=RIG, workers=2, buffer_bytes=2_000_000)


PROBE = ("import json, os, stat; p = os.environ['LTP_SECRET_FILE']; t = open(p).read(); "
         "print(json.dumps({'role': os.environ['LTP_ROLE'], 'path': p, 'text': t, "
         "'mode': stat.S_IMODE(os.stat(p).st_mode), "
         "'in_env': any(t.strip()[:40] in v for k, v in os.environ.items()), "
         "'on_argv': t.strip()[:40] in open('/proc/self/cmdline').read()}))")


@pytest.mark.rig
@pytest.mark.parametrize("downlink", ["group", "unicast"])
def test_ltp_launch_hands_each_worker_its_own_file(rig, tmp_path, downlink):
    """Real ranks of `ltp launch` (the operator's job key in LTP_SECRET_FILE):
    the server reads the job key file; each worker a 0600 file of its own
    holding its id, from which neither the job key nor the other worker's
    keys follow and whose tokens are its own flows' only; the group key is
    there only for the group downlink. The files go with the job."""
    key = jobkey.new_key()
    job = _key_file(tmp_path, key)
    # the group downlink as LTP_DOWNLINK says it, the unicast one by --downlink
    how = ["--downlink", downlink] if downlink == "unicast" else []
    env = dict(os.environ, **{jobkey.ENV: job})
    env.pop("LTP_DOWNLINK", None)
    if not how:
        env["LTP_DOWNLINK"] = downlink
    out = subprocess.run([str(BIN / "ltp"), "launch", "--rig", RIG, "--workers", "2", "-j",
                          *how, "--", "python", "-c", PROBE], capture_output=True, text=True,
                         timeout=240, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = json.loads(out.stdout)["ranks"]
    seen = {r["rank"]: r["last_json"] for r in ranks}      # servers first
    assert [seen[r]["role"] for r in range(3)] == ["server", "worker", "worker"]
    assert seen[0]["path"] == job and seen[0]["text"].strip() == key.hex()
    workers = [seen[1 + w] for w in range(2)]
    assert len({s["path"] for s in workers}) == 2 and job not in {s["path"] for s in workers}
    for w, s in enumerate(workers):
        assert s["mode"] == 0o600 and not s["in_env"] and not s["on_argv"]
        m = jobkey.parse_member(s["text"], s["path"])
        assert m == jobkey.member_keys(key, w, 1, group=downlink == "group")
        _not_derivable(s["text"], key, w, 2, 1)
        _own_flows_only(m, key, 2, 1)
        assert not os.path.exists(s["path"])                 # removed with the job
    assert jobkey.read_key_file(job) == key                  # the operator's stays


@pytest.mark.rig
def test_a_member_takes_a_group_answer_only_with_the_group_key(rig):
    """The server's group answer (real endpoints, the rig's broadcast
    address): worker 0's endpoint, holding its member key and the group key,
    takes it with no frame refused; worker 1's, without the group key,
    counts the group frames bad_token and gets the answer by the server's
    repair to it alone. Both end with the answer bit-exact."""
    from ltpx.control.transport import Endpoint, Peer
    from ltpx.dataplane.rig.star import BROADCAST
    from ltpx.dataplane.xdp import wire as W
    secret, n = tokens.new_secret(), 20_000
    mode, ps_h = rig.config.mode, rig.ps
    eps = []
    try:
        ps = Endpoint(ps_h.ifname, ps_h.ip, {0: 0, 1: 1}, n, ns=ps_h.netns, mode=mode, job=JOB,
                      secret=secret, publish=False)
        eps.append(ps)
        for w, h in enumerate(rig.workers):
            eps.append(Endpoint(h.ifname, h.ip, {w: 0}, n, ns=h.netns, mode=mode, job=JOB,
                                secret=tokens.member(secret, w, group=w == 0), self_id=w,
                                publish=False))
        g = np.random.default_rng(26).standard_normal(n).astype(np.float32)
        wk = eps[1:]
        for w, e in enumerate(wk):
            e.expect(5, n, w)
        before = [e.counters() for e in wk]
        ps.push_reliable(5, g, [Peer(w, h.ip) for w, h in enumerate(rig.workers)],
                         timeout_s=60.0, group=(BROADCAST, W.PORT))
        got = [e.receive(5, timeout_s=60.0) for e in wk]
        after = [e.counters() for e in wk]
        for values in got:
            assert np.array_equal(values, g)
        assert after[0]["bad_token"] == before[0]["bad_token"]
        assert after[1]["bad_token"] > before[1]["bad_token"]
    finally:
        for e in reversed(eps):
            e.close()


WHOLE = {"threshold_min": 1.0, "threshold_max": 1.0, "min_deadline_s": 2.0}


@pytest.mark.rig
def test_ltp_train_with_member_files_trains_the_same_over_group_and_unicast(rig):
    """`ltp train`'s ranks with per-rank key files, lossless: the group
    downlink (workers hold the group key) and the unicast one (they do not)
    train bit-identical parameters, every replica equal to the server's."""
    from ltpx.control.training.config import TrainConfig
    from ltpx.control.training.onrig import train_on_rig
    runs = {}
    for downlink in ("group", "unicast"):
        cfg = TrainConfig(iterations=10, seed=5, verify_versions=True, transport="ltp",
                          downlink=downlink)
        runs[downlink] = r = train_on_rig(rig, cfg, timeout_s=300, early_close=WHOLE)
        assert r["downlink"] == downlink and r["replicas_identical"]
        assert set(r["worker_digests"].values()) == {r["ps_digest"]}
    assert runs["group"]["ps_digest"] == runs["unicast"]["ps_digest"]
    assert runs["group"]["version_chain"]["ps"] == runs["unicast"]["version_chain"]["ps"]


@pytest.mark.unit
def test_launch_downlink_comes_from_the_flag_then_the_environment():
    import argparse
    from ltpx.tools.cmd_launch import downlink, group_keys
    a = argparse.Namespace(transport="ltp", downlink=None)
    assert downlink(a, {}) == "group" and group_keys(a, {})
    assert downlink(a, {"LTP_DOWNLINK": "unicast"}) == "unicast"
    assert not group_keys(a, {"LTP_DOWNLINK": "unicast"})
    a.downlink = "group"                      # the flag wins over the environment
    assert group_keys(a, {"LTP_DOWNLINK": "unicast"})
    a.downlink = "unicast"
    assert not group_keys(a, {})
    assert not group_keys(argparse.Namespace(transport="tcp", downlink=None), {})


@pytest.mark.unit
def test_launch_refuses_an_unknown_downlink():
    r = _ltp("launch", "--workers", "2", "--downlink", "multicast", "--", "true")
    assert r.returncode == 2 and "--downlink" in r.stderr


# ------------------------------------------------------------- signed answers

@pytest.mark.unit
def test_only_the_server_signs_an_answer_a_member_checks():
    """A member's file holds the server's public answer key, not a way to
    sign: what the server signs verifies; a flipped bit, another round or
    job, or a signature made with anything a member holds does not."""
    from ltpx.control.trust import signing
    key = jobkey.new_key()
    m = jobkey.member_keys(key, 1, servers=2)
    assert m.sign == tuple(tokens.answer_pub(jobkey.token_secret(key, i)) for i in range(2))
    assert m.sign[0] != m.sign[1]                           # one key per shard
    ms, full = jobkey.token_secret(m, 1), jobkey.token_secret(key, 1)
    assert tokens.answer_pub(ms) == tokens.answer_pub(full)
    v = signing.Verifier(tokens.answer_pub(ms), JOB)
    buf = np.random.default_rng(26).standard_normal(5000).astype(np.float32)
    signed = signing.Signer(full, JOB).sign(9, buf)
    assert len(signed) == len(buf) + signing.SIG_ELEMS
    assert np.array_equal(v.check(9, signed), buf)
    flipped = signed.copy()
    flipped.view(np.uint8)[123] ^= 1
    forged_sigs = [signing.Signer(k, JOB).sign(9, buf)       # keys a member holds or derives
                   for k in (ms.key, ms.group, m.store, jobkey.token_secret(key, 0))]
    for bad, d, job in [(flipped, 9, JOB), (signed, 10, JOB)] + [(f, 9, JOB) for f in forged_sigs]:
        with pytest.raises(signing.ForgedAnswerError, match=f"answer {d}'s signature is not"):
            signing.Verifier(tokens.answer_pub(ms), job).check(d, bad)
    with pytest.raises(signing.ForgedAnswerError):
        signing.Verifier(tokens.answer_pub(ms), JOB + 1).check(9, signed)
    with pytest.raises(signing.ForgedAnswerError, match="too short"):
        v.check(9, buf[:3])
    big = np.ones(3 * signing.PIECE_BYTES // 4 + 7, np.float32)   # hashed in pieces
    assert np.array_equal(v.check(4, signing.Signer(full, JOB).sign(4, big)), big)


@pytest.mark.rig
def test_a_members_forged_group_answer_is_refused_and_never_used(rig):
    """The server's links on the rig, the group downlink, member keys with
    the group key: a signed group answer reaches both workers' links bit
    for bit. Then worker 1 sends worker 0 a whole GROUP answer of its own
    (its frames carry the true group token, so worker 0's XDP takes them,
    counting no bad_token): worker 0's pull refuses it, and its output
    keeps what it held."""
    from ltpx.control.torchapi.link_ltp import LtpServerLink
    from ltpx.control.torchapi.link_ltp_worker import LtpWorkerLink
    from ltpx.control.torchapi.settings import Settings
    from ltpx.control.transport.layout import ChunkLayout
    from ltpx.control.transport.push import data_headers
    from ltpx.control.trust.signing import SIG_ELEMS, ForgedAnswerError
    from ltpx.dataplane.rig.star import BROADCAST
    from ltpx.dataplane.xdp import wire as W
    secret, n = tokens.new_secret(), 20_000

    def settings(h):
        return Settings(dev=h.ifname, ip=h.ip, netns=h.netns, xdp_mode=rig.config.mode,
                        mtu=rig.config.mtu, timeout=20, job=JOB)
    server = LtpServerLink(settings(rig.ps), 2, BROADCAST, secret=secret)
    workers = [LtpWorkerLink(settings(h), w, 2, secret=tokens.member(secret, w, group=True))
               for w, h in enumerate(rig.workers)]
    sock = rig.socket(rig.workers[1])
    try:
        server.connect({w: {"ip": h.ip} for w, h in enumerate(rig.workers)})
        server.ensure(n)
        for wl in workers:
            wl.connect({**server.address(), "ip": rig.ps.ip})
            wl.ensure(n)
            wl.expect(7, n)
        g = np.random.default_rng(7).standard_normal(n).astype(np.float32)
        server.send(7, g, True)
        for wl in workers:
            out = np.zeros(n, np.float32)
            wl.pull(7, out)
            assert np.array_equal(out, g)
        # worker 1 forges answer 8 to worker 0, every chunk, before the server sends it
        w0 = workers[0]
        w0.expect(8, n)
        bad_before = w0.ep.counters()["bad_token"]
        forged = np.full(n + SIG_ELEMS, 3.0, np.float32)
        lay = ChunkLayout(n + SIG_ELEMS, w0.ep.chunk_bytes)
        flags = np.full(lay.nchunks, W.F_RELIABLE | W.F_GROUP, np.uint16)
        gtok = tokens.derive(tokens.member(secret, 1, group=True), JOB, 8, kind=tokens.GROUP)
        hdrs = data_headers(JOB, 8, 0, lay.nchunks, flags, lay, gtok).reshape(lay.nchunks, -1)
        body = forged.tobytes()
        for c in range(lay.nchunks):
            sock.sendto(hdrs[c].tobytes() + body[c * lay.chunk_bytes:(c + 1) * lay.chunk_bytes],
                        (rig.workers[0].ip, W.PORT))
        held = np.full(n, -1.0, np.float32)
        with pytest.raises(ForgedAnswerError, match="answer 8's signature is not the server's"):
            w0.pull(8, held)
        assert (held == -1.0).all()                              # nothing of it used
        assert w0.ep.counters()["bad_token"] == bad_before       # the token alone let it in
    finally:
        sock.close()
        for link in (*workers, server):
            link.close()
