"""The request object: statuses, timestamps and choices."""

from __future__ import annotations

from orchestrator.engine.request import EngineRequest, FinishReason
from orchestrator.errors import WorkerCrashed, to_wire
from orchestrator.ipc.messages import TextDelta
from orchestrator.lifecycle import Choice, InferenceRequest, RequestStatus


def make(n: int = 2) -> InferenceRequest:
    choices = [Choice(i, EngineRequest(id=f"r.{i}", prompt_ids=(1, 2), max_new_tokens=5)) for i in range(n)]
    return InferenceRequest(id="r", model="m", prompt_tokens=2, choices=choices, stream=False)


def test_status_order_says_finished():
    assert not RequestStatus.WAITING.finished and not RequestStatus.RUNNING.finished
    assert all(s.finished for s in RequestStatus if s >= RequestStatus.FINISHED_STOPPED)


def test_deltas_are_routed_to_their_choice_and_counted():
    request = make()
    request.start()
    request.record(TextDelta("r.1", "Hel", 2))
    request.record(TextDelta("r.0", "Hi", 1, FinishReason.STOP))
    assert request.first_token is not None
    assert [c.completion_tokens for c in request.choices] == [1, 2]
    assert not request.all_finished
    assert request.unfinished_engine_ids() == ["r.1"]
    request.record(TextDelta("r.1", "lo", 1, FinishReason.LENGTH))
    assert request.all_finished
    assert request.completion_tokens == 4
    assert request.final_status() is RequestStatus.FINISHED_STOPPED


def test_all_length_is_finished_length():
    request = make(1)
    request.record(TextDelta("r.0", "x", 1, FinishReason.LENGTH))
    assert request.final_status() is RequestStatus.FINISHED_LENGTH


def test_an_error_delta_carries_the_error_class():
    request = make(1)
    choice = request.record(TextDelta("r.0", "", 0, FinishReason.ERROR, to_wire(WorkerCrashed("gone"))))
    assert isinstance(choice.error, WorkerCrashed)
    assert request.final_status() is RequestStatus.FINISHED_ERROR


def test_finish_is_recorded_once():
    request = make(1)
    request.finish(RequestStatus.FINISHED_CANCELLED)
    first = request.finished
    request.finish(RequestStatus.FINISHED_ERROR)
    assert request.status is RequestStatus.FINISHED_CANCELLED and request.finished == first
