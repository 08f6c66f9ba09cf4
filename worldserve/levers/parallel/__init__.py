"""Running one generation request on a group of ranks: the rank mesh and its process groups
(`mesh`), collectives that fail instead of hanging (`comm`), sequence-parallel attention
(`attention`: Ulysses all-to-all over heads, Ring over sequence chunks), FSDP-style block
sharding (`shard`) and strip-parallel convolutions with halo exchange (`halo`).

Generic pieces only: a family wires them into its own transformer and VAE
(`models/cosmos3/parallel*.py`). The processes themselves are started by
`worldserve/ranks/group.py`; nothing here knows about scheduling or sockets.
"""
