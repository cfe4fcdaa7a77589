# SPDX-License-Identifier: Apache-2.0
"""The `ltp` torch.distributed backend, known to torch without `import ltpx.torch`.

torch calls every entry point of the group `torch.backends` at the end of its
own import (pyproject.toml names `register` here), so `init_process_group("ltp")`
works under torchrun as under `ltp launch` (whose ranks fork from a process
that imported ltpx.torch) even where a script forgot the import. This module
is what torch's import pays for: it registers a creator that imports the
backend (control/torchapi/backend.py) only when a process group is made, and
it never lets torch's import fail (TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns the
mechanism off; then the import is needed again).
"""
from __future__ import annotations

NAME = "ltp"   # torchapi/backend.py's NAME (this module imports it only when a group is made)


def register() -> None:
    try:
        import torch.distributed as dist   # noqa: PLC0415 (inside the guard: torch is importing us)
        if dist.is_available() and NAME.upper() not in dist.Backend._plugins:
            dist.Backend.register_backend(NAME, create, devices=["cpu", "cuda"])
    except Exception:      # noqa: BLE001 - torch's own import must never fail for us
        pass


def create(store, rank: int, size: int, timeout):
    """torch's creator for "ltp": the backend's, imported now."""
    from .torchapi.backend import create as backend_create   # noqa: PLC0415 (torch's import must stay light)
    return backend_create(store, rank, size, timeout)
