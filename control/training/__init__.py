"""Parameter-server training over LTP, with TCP and gloo baselines.

Modules, each with one job:
  data      the digits data set (scikit-learn's copy, no download), split and shards
  model     the MLP and a flat view of its parameters and gradients (zero copy)
  config    TrainConfig: what to train and how, the same on every rank
  args      the training flags `ltp train` and a rank share, and flags -> TrainConfig
  comm      how gradients go up and parameters come down: LTP, or TCP sockets
  context   a rank's place in the job, and its barriers through the rendezvous store
  local     a rank's local work: compute steps, evaluation, clock, version hashes
  ps        the parameter server's loop
  worker    a worker's loop (bsp | wbsp)
  gloo      the gloo DDP baseline's loop
  rank      the entry point of one rank (`python -m ltpx.control.training`),
            torch.distributed env:// conventions, so torchrun can start it
  launch    start every rank inside a rig's namespaces and collect the result

docs/training.md has the design, the sync modes and how to run it on real hosts.
"""
