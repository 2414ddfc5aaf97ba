"""The HTTP process's side of model workers: starting worker processes, keeping a spare ready, and talking to
each over its channel. Runs in the HTTP process: imports no model runtime."""
