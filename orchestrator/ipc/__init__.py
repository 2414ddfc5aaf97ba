"""What the HTTP process and a model's worker process both speak: the messages (messages.py) and the channel that
frames them (channel.py). Imported by both processes: no model runtime, nothing per token."""
