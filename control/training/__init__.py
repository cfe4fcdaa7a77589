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
  onrig     `ltp train`'s job on a rig: ranks, the lead's events, logs
  faults    fault injection (--kill ROLE:ID@ITER) and --restart
  curves    training curves: TensorBoard scalars while a run goes, a PNG at the end
  __main__  `python -m ltpx.control.training`: one rank (rank.py)

Launching (the ranks started in a rig's namespaces, the fork server, the
store, restarts, the hang report) is control/launcher, below this package.
The transport under the parameter-server runs, and the API itself, are
control/torchapi (ltpx.torch). docs/training.md has the design, the sync
modes and how to run it on real hosts.
"""

# what a rank of the built-in job imports beyond any ltpx.torch rank's: the fork
# server preloads them for `ltp train` (control/launcher/forkserver.py, `also`)
RANK_MODULES = ("ltpx.control.training.rank", "ltpx.control.training.demo",
                "ltpx.control.training.gloo")
