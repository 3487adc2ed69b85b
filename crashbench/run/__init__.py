"""The run: a session on one server, and each crash run's loop, producer, drain, readings and workers."""
