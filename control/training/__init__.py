"""Parameter-server training over LTP, with TCP and gloo baselines.

Modules, each with one job:
  data      the digits data set (scikit-learn's copy, no download), split and shards
  model     the MLP and a flat view of its parameters and gradients (zero copy)
  comm      how gradients go up and parameters come down: LTP, or TCP sockets
  runtime   the rank loops: parameter server, worker (bsp | wbsp), gloo DDP worker
  rank      the entry point of one rank (`python -m ltpx.control.training`),
            torch.distributed env:// conventions, so torchrun can start it
  launch    start every rank inside a rig's namespaces and collect the result

docs/training.md has the design, the sync modes and how to run it on real hosts.
"""
