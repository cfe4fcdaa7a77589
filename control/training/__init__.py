# SPDX-License-Identifier: Apache-2.0
"""Parameter-server training over LTP, with TCP and gloo baselines: `ltp train`'s job.

Modules, each with one job:
  data      the digits data set (scikit-learn's copy, no download), split and shards
  model     the MLP, its parameter count, digest and evaluation
  config    TrainConfig: what to train and how, the same on every rank
  args      the training flags `ltp train` and a rank share, and flags -> TrainConfig
  local     a rank's local work: compute steps, evaluation, clock, version hashes
  demo      the built-in job on the public API (ltpx.torch): LTP and TCP runs
  straggler_report  who each step waited for, over a run (the barrier's last, the NIC's)
  context   a gloo rank's place in the job, and its metadata in the store
  gloo      the gloo DDP baseline's loop
  rank      the entry point of one rank (`python -m ltpx.control.training`),
            torch.distributed env:// conventions, so torchrun can start it
  launch    start every rank of a job inside a rig's namespaces, follow its output
            (`ltp launch`)
  onrig     `ltp train`'s job on a rig: ranks, the lead's events, logs
  faults    fault injection (--kill ROLE:ID@ITER) and restart policies
  hangs     the launcher's hang report: one line per rank from the flight recorder
  curves    training curves: TensorBoard scalars while a run goes, a PNG at the end
  forkserver, zygote   a fork server for ranks: torch imported once, a fork per rank
  storehost the job's rendezvous store (a TCPStore on a namespace's loopback)
  storerelay  the store reached as 127.0.0.1:PORT from every namespace of a rig
  __main__  `python -m ltpx.control.training`: one rank (rank.py)

The transport under the parameter-server runs, and the API itself, are
control/torchapi (ltpx.torch). docs/training.md has the design, the sync
modes and how to run it on real hosts.
"""
