"""Training the dev models on the dev world (issue 30; docs/dev-world.md).

Scripts, not part of the installed package: they drive the serving code's own pieces (the
Cosmos3 runner's prompt packing, the reasoner engine's chat and frame prompts), so they sit
above every layer of worldserve. `python -m tools.world_training.retrain` re-makes the shipped
weights (worldserve/models/dev/world/weights/); nothing trains at build, serve or test time.
"""
