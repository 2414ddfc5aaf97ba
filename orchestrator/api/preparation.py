"""Everything a generation request passes before it asks the scheduler for a lease, in order:

1. the model, if the caller's key may use it (access.py; 404 otherwise, as for a model that does not exist);
2. the priority class: the request's `service_tier`, else the key's class, else the model's; a key's class is
   also the best its requests may ask for;
3. the key's concurrent requests (each of the `n` choices counts as one) and requests per minute (429 with
   Retry-After);
4. the prompt: one too long in characters to fit whatever it tokenises to is refused before tokenising (looked
   at only for bodies that could hold one); then the wire format's `generation()` (the chat template and the
   tokenizer) and `engine_requests.inference_request`, on a thread for a big body (body.py), which decides once
   how many tokens each choice may generate: what was asked (refused above the model's `max_tokens` ceiling
   from models.toml, or beyond the context), else the API's default or what the context leaves, capped by the
   ceiling; and the salt of the prefix cache it may use (cache_salt.py: the caller's key, or its own salt).
   The tokenizer reuses segments of prompts that the caller's key sent before (text/segments.py);
5. the key's tokens per minute: the prompt's tokens and every choice's `max_tokens` are reserved (429 with
   Retry-After); what the request did not use is given back when it ends.

What the key's limiter took is settled when the request ends (accounting.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from orchestrator.access.keys import ANONYMOUS, KeyPolicy
from orchestrator.api.access import model_view
from orchestrator.api.body import off_loop
from orchestrator.api.cache_salt import cache_salt
from orchestrator.api.engine_requests import Generation, inference_request
from orchestrator.api.record import RequestRecord, record_of
from orchestrator.api.state import STATE
from orchestrator.engine.catalogue import Engine
from orchestrator.errors import ContextLengthExceeded
from orchestrator.ipc.messages import ROW_REQUEST_ID, ROW_TEXT
from orchestrator.lifecycle import InferenceRequest
from orchestrator.scheduler import ModelView, Priority, Tenant, request_priority
from orchestrator.text import segments


class FrontDoorRequest(Protocol):
    """What preparation needs of a wire request, whatever API it came through (chat, completions, Responses,
    Messages): the model it names, its service tier, how it names its prompt, and its `Generation`."""

    model: str
    service_tier: str | None
    PROMPT_PARAM: str

    @property
    def choices_asked(self) -> int:
        """How many choices (`n`) the request asks for: each counts against its key's concurrent requests."""

    def generation(self, engine: Engine) -> Generation:
        """The request in the server's own terms, its prompt tokenised (raises the taxonomy's 400s)."""

    def prompt_text(self, engine: Engine) -> str | None:
        """The prompt as one text (a conversation rendered by the template); None for token ids."""

    def audit_prompt(self) -> object:
        """The prompt as the audit log keeps it (text, or the messages)."""


@dataclass(frozen=True)
class Prepared:
    model: ModelView
    priority: Priority
    request: InferenceRequest
    tenant: Tenant  # whom the scheduler shares the model with fairly: the caller's key


async def prepare_generation(http: web.Request, wire: FrontDoorRequest, id_prefix: str) -> Prepared:
    """The checked inference request, its model's view and its priority class; raises the taxonomy's errors
    (404, 400, 429) as listed in this module's docstring."""
    state, record = http.app[STATE], record_of(http)
    record.generation = True
    model = model_view(http, wire.model)
    caller = record.caller or ANONYMOUS
    priority = request_priority(wire.service_tier, model.settings.priority_class, caller.priority)
    admit_caller(http, wire.choices_asked)
    request = await off_loop(http, _checked_inference_request, wire, model.engine, record.body_bytes, id_prefix,
                             priority.in_engine, model.settings.max_tokens, record.caller,
                             prompts=model.engine.prompts)
    record.inference = request
    if record.limiter is not None:
        most = sum(choice.engine_request.max_new_tokens for choice in request.choices)
        record.tokens_taken = record.limiter.admit_tokens(request.prompt_tokens, most)
    if state.audit.include_text:
        _keep_text(record, wire, request)
    return Prepared(model, priority, request, Tenant(caller.name, caller.weight))


def admit_caller(http: web.Request, choices: int = 1) -> None:
    """Count the request's choices against its key's limit on requests running, and the request against its
    requests per minute (RateLimited, a 429, when over one); the limiter gets them back when the request ends
    (accounting.py)."""
    record = record_of(http)
    caller = record.caller or ANONYMOUS
    if caller.limited:
        limiter = http.app[STATE].limits.of(caller)
        limiter.admit(choices)
        record.limiter, record.choices_taken = limiter, choices


def _checked_inference_request(wire: FrontDoorRequest, engine: Engine, body_bytes: int, id_prefix: str,
                               priority: int, ceiling: int | None, caller: KeyPolicy | None) -> InferenceRequest:
    """The prompt's length in characters checked, then tokenised into the inference request: one piece of work,
    so that a big body goes to a thread once."""
    _check_prompt_chars(wire, engine, body_bytes)
    key_salt = cache_salt(caller, None)
    with segments.scope(key_salt):  # the key's own segments of prompts (text/segments.py)
        generation = wire.generation(engine)
    salt = key_salt if generation.cache_salt is None else cache_salt(caller, generation.cache_salt)
    return inference_request(engine, generation, id_prefix=id_prefix, priority=priority, ceiling=ceiling,
                             salt=salt)


def most_prompt_chars(engine: Engine) -> int:
    """No prompt the model takes is longer than this, in characters: its longest prompt in tokens times the
    most characters one token stands for."""
    return engine.manifest.limits.max_input_len * engine.prompts.longest_token_chars


def _check_prompt_chars(wire: FrontDoorRequest, engine: Engine, body_bytes: int) -> None:
    """A prompt longer than any the model could take, in characters, is refused before the tokenizer spends
    seconds on it (and the event loop's thread time on the huge result). Only a body this large could hold one:
    for the others (the common case) nothing is done twice."""
    most = most_prompt_chars(engine)
    text = wire.prompt_text(engine) if body_bytes > most else None
    if text is not None and len(text) > most:
        limit = engine.manifest.limits.max_input_len
        raise ContextLengthExceeded(
            f"this model's maximum prompt length is {limit} tokens (at most {most} characters), "
            f"but the prompt has {len(text)} characters",
            param=wire.PROMPT_PARAM,
        )


def _keep_text(record: RequestRecord, wire: FrontDoorRequest, request: InferenceRequest) -> None:
    """For an audit log with text: the prompt, and every choice's text as it is delivered."""
    record.prompt_text = wire.audit_prompt()
    completions = record.completions = {c.engine_request.id: [] for c in request.choices}
    deliver = request.deliver

    def deliver_and_keep(row: list) -> None:  # a wire row (TextDelta.to_wire): engine request id, text, ...
        completions[row[ROW_REQUEST_ID]].append(row[ROW_TEXT])
        deliver(row)

    request.deliver = deliver_and_keep  # the sink the generation path hands the worker
    request.attachable = False  # every row must come here to be kept: its worker writes none to the client
