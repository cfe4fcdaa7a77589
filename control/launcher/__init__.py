# SPDX-License-Identifier: Apache-2.0
"""The launcher: any script's ranks started inside a rig's network namespaces,
their output followed (`ltp launch`; `ltp train` through control/training/onrig.py).

Modules, each with one job:
  launch      RigJob: start every rank of a job in its host's namespace, with
              torchrun's env:// variables and the LTP_* settings; pump, stop, follow
  plan        Rank and plan_ranks: the rig host and node each server and worker runs on
  restarts    RestartPolicy, the one restart policy: a dead rank restarted,
              let go, or every rank started again (RestartJob)
  hangs       the launcher's hang report: one line per rank from the flight recorder
  forkserver, zygote   a fork server for ranks: torch imported once, a fork per rank
  storehost   the job's rendezvous store (a TCPStore on a namespace's loopback)
  storerelay  the store reached as 127.0.0.1:PORT from every namespace of a rig

It sits below control/training/ (the built-in job, which launches through
it) and never imports it: what `ltp train`'s ranks want preloaded in the
fork server beyond forkserver.PRELOAD comes in as an argument.
"""
