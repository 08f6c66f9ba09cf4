"""Generation engine: images, video jobs and actions (diffusers pipelines)."""
