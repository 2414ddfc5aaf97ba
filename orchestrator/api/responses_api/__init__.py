"""OpenAI's Responses API (`POST /v1/responses`): its wire types (wire.py), its input items as a chat conversation
(conversation.py), the presenter that writes a response as one object or as its named events (presenter.py), and
the routes (routes.py). It runs through the same preparation and generation path as chat completions."""
