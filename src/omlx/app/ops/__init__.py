"""Operating a cache folder: the admin commands, request logs and log set-up."""
