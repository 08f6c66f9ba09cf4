"""Image and video job records (SQLite) and the service that runs jobs on the generation stage."""
