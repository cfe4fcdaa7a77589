# SPDX-License-Identifier: Apache-2.0
"""Values over the store's 8 MiB limit go in parts (storeparts.py), through
a real TCPStore: whole again on the other side, sealed as one, gone with
their key; a part changed, missing, or a head that no value has, is a
clear StoreValueError."""
from __future__ import annotations

import os

import pytest
import torch.distributed as dist

from ltpx.control.launcher.storehost import loopback_store
from ltpx.control.torchapi import storeparts
from ltpx.control.torchapi.coord import KEY, Coord
from ltpx.control.trust import jobkey
from ltpx.control.trust.sealing import StoreValueError

pytestmark = pytest.mark.unit
W = 2
BIG = 9 * 2**20 + 123         # over the store's 8 MiB, three parts


@pytest.fixture(scope="module")
def store():
    return loopback_store(30.0)


def _pair(store, keyed: bool) -> tuple[Coord, Coord]:
    """(worker 0's coordination, the server's): a state is a worker's to write."""
    if not keyed:
        return Coord(store, W, 5.0), Coord(store, W, 5.0)
    key = jobkey.new_key()
    return (Coord(store, W, 5.0, key=jobkey.store_auth(jobkey.member_keys(key, 0))),
            Coord(store, W, 5.0, key=jobkey.store_auth(key)))


def test_the_store_itself_refuses_a_value_over_8_mib(store):
    # why the parts exist: torch's TCPStore resets such a client's connection
    client = dist.TCPStore("127.0.0.1", store.port, None, False)
    with pytest.raises(dist.DistNetworkError, match="reset"):
        client.set("plain/big", b"x" * BIG)


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "keyless"])
def test_a_value_over_the_limit_goes_in_parts_and_comes_back_whole(store, keyed):
    co, srv = _pair(store, keyed)
    blob = os.urandom(BIG)
    co.put("sync/7", blob)
    head = store.get(KEY + "sync/7")
    assert len(head) == storeparts.HEAD_BYTES            # the key holds the head only
    assert store.check([KEY + f"sync/7/part/{i}" for i in range(3)])
    assert not store.check([KEY + "sync/7/part/3"])
    writer, got = srv.take_from("sync/7", bytes)
    assert got == blob and writer == (0 if keyed else None)
    srv.drop("sync/7")
    assert not store.check([KEY + "sync/7"])
    assert not any(store.check([KEY + f"sync/7/part/{i}"]) for i in range(3))


def test_a_small_value_is_one_key_as_before(store):
    co, srv = _pair(store, True)
    co.put("sync/8", b"small state")
    assert not store.check([KEY + "sync/8/part/0"])
    assert srv.take("sync/8", bytes) == b"small state"
    srv.drop("sync/8")
    assert not store.check([KEY + "sync/8"])


def test_a_part_changed_in_the_store_fails_the_whole_values_seal(store):
    co, srv = _pair(store, True)
    co.put("sync/9", os.urandom(BIG))
    part = bytearray(store.get(KEY + "sync/9/part/1"))
    part[100] ^= 1
    store.set(KEY + "sync/9/part/1", bytes(part))
    with pytest.raises(StoreValueError, match=f"store key {KEY}sync/9"):
        srv.take("sync/9", bytes)
    srv.drop("sync/9")
    assert not store.check([KEY + "sync/9/part/0"])


def test_a_missing_part_or_a_head_no_value_has_is_refused_by_name(store):
    co, _ = _pair(store, False)
    co.put("sync/10", os.urandom(BIG))
    store.delete_key(KEY + "sync/10/part/2")
    with pytest.raises(StoreValueError, match="sync/10: a value in 3 parts whose parts are not"):
        co.take("sync/10", bytes)
    # a head claiming 2**40 parts: refused before any part is looked for
    store.set(KEY + "sync/11", storeparts.MAGIC + storeparts.HEAD.pack(2**40, BIG))
    with pytest.raises(StoreValueError, match="sync/11: a head of 1099511627776 parts"):
        co.take("sync/11", bytes)
    co.drop("sync/10")
    co.drop("sync/11")
    assert not store.check([KEY + "sync/10"]) and not store.check([KEY + "sync/10/part/0"])


def test_drop_takes_the_parts_a_put_that_did_not_finish_left(store):
    # a donor that died after two of its three parts: no head, parts left
    co, _ = _pair(store, False)
    for i in range(2):
        store.set(KEY + f"sync/12/part/{i}", b"p" * storeparts.PART)
    co.drop("sync/12")
    assert not any(store.check([KEY + f"sync/12/part/{i}"]) for i in range(2))
    co.drop("sync/13")        # nothing there: nothing to do, no wait
    assert not store.check([KEY + "sync/13"])
