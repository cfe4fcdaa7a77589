# SPDX-License-Identifier: Apache-2.0
"""Trust: the job's keys and what is made and checked with them (docs/operations.md, "Threat model").

  jobkey     the job key file (servers) and each worker's member key file:
             reading them (0600, the right rank's), deriving every key below
  storeauth  Ed25519 keys per rank for the store's values (a signer, public keys)
  sealing    store values signed by their writer and checked when read
             (`Seal`, `may_write`: who may write which key; StoreValueError)
  tokens     round tokens: a round's packets keyed to the job's secret and
             run (RoundTokens), the answer's signing key
  signing    each answer signed at the server and checked at a worker, in
             pieces as it streams (Signer, StreamSigner, Verifier)
  hello      the TCP transport's hello: a worker's id and a MAC over the run

What each value must hold is its reader's (torchapi/storevalues.py), as
the packets' checks are the dataplane's. Imports nothing above it but the
settings table (jobkey) and the errors.
"""
