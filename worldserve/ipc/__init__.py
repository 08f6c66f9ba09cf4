"""Typed messages between the api process and the stage processes, and their transport."""
