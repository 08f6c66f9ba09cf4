"""A small synthetic world for the dev models: seeded clips with known labels and a pixel
evaluator that reads those labels back (issue 30; docs/dev-world.md).

Generation needs numpy and PIL only: `scenes.make_clip(seed, kind)` draws one flat shape
(square, circle, triangle; red, green, blue, yellow) on a black or white background, moving one
way or driven by held keys, with a tone per colour and a click when an edge stops the agent.
`grammar` holds the prompts, questions and answers; `evaluate` the statistics that score a
model's frames, sound and replies against them.
"""
