"""The generation stage as a group of ranks (`stages.generation.parallel`, docs/parallel.md).

`group.py` owns the peer processes (spawn, join, failure, restart), `messages.py` the rank 0 ->
peer commands, `runner.py` the one runner the generation engine sees (`RankGroupRunner`: every
phase sent to the peers, run on rank 0, confirmed), `worker.py` a peer rank's process
(`python -m worldserve.ranks.worker`). The collectives and sharding math a family's model uses
are levers (`worldserve/levers/parallel/`); the rank's runner is the family's
(`models/cosmos3/parallel.py`).
"""
