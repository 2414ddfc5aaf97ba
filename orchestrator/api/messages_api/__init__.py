"""Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`): its wire types, the
translation of its conversation into chat-template messages, and its presenter; served through the same
preparation and generation path as chat completions."""
