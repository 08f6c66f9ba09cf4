"""Process runtime: the supervisor (api side) and the stage process loop."""
