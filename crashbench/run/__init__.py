"""The run: a session on one server, each crash run's loop, drain, workers and their supervision."""
