"""ScriptedModel: the answer is a pure function of the request."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from parley.errors import InvalidRequest
from parley.models.scripted import ScriptedModel
from parley.ports.host import ModelReply, ModelRequest
from parley.schemas.messages import (
    AssistantMessage,
    InputOrigin,
    Message,
    Prefix,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from parley.schemas.records import Usage
from tests.providers.sink import RecordingSink

PREFIX = Prefix(system_prompt="s", tools=())


def request(*messages: Message) -> ModelRequest:
    return ModelRequest(prefix=PREFIX, messages=messages)


def user(text: str, origin: InputOrigin = "prompt") -> UserMessage:
    return UserMessage(text=text, origin=origin)


def assistant(text: str = "", *calls: ToolCall) -> AssistantMessage:
    return AssistantMessage(text=text, tool_calls=calls)


def answer(model: ScriptedModel, req: ModelRequest) -> tuple[ModelReply, list[str]]:
    sink = RecordingSink()
    reply = model.stream(req, sink)
    return reply, sink.deltas


def model_of(*rules: dict[str, Any]) -> ScriptedModel:
    return ScriptedModel({"rules": list(rules)})


def steps_rule(when: str, *texts: str) -> dict[str, Any]:
    return {"when": when, "steps": [{"text": t} for t in texts]}


# ---------------------------------------------------------------------------- rule choice


def test_first_matching_rule_wins() -> None:
    model = model_of(
        steps_rule("retry", "first"),
        steps_rule("retry policy", "second"),
        steps_rule(".*", "fallback"),
    )
    assert answer(model, request(user("what is the retry policy?")))[0].text == "first"
    assert answer(model, request(user("hello")))[0].text == "fallback"


def test_when_is_a_search_not_a_full_match() -> None:
    model = model_of(steps_rule("pol+icy", "found"))
    assert answer(model, request(user("the retry policy, please")))[0].text == "found"


def test_rule_matches_the_last_prompt_not_history_or_steers() -> None:
    model = model_of(steps_rule("^old", "old rule"), steps_rule("^new", "new rule"))
    history_then_new = request(
        user("old question"),
        assistant("old answer"),
        user("new question"),
        user("old-looking steer", origin="steer"),
    )
    assert answer(model, history_then_new)[0].text == "new rule"


def test_no_matching_rule_is_invalid_request() -> None:
    model = model_of(steps_rule("^only this$", "x"))
    with pytest.raises(InvalidRequest):
        model.stream(request(user("something else")), RecordingSink())


def test_request_without_a_prompt_is_invalid_request() -> None:
    model = model_of(steps_rule(".*", "x"))
    with pytest.raises(InvalidRequest):
        model.stream(request(user("a steer", origin="steer")), RecordingSink())


# ---------------------------------------------------------------------------- step choice


def test_step_counts_assistant_messages_after_the_prompt() -> None:
    model = model_of(steps_rule(".*", "zero", "one", "two"))
    call = ToolCall(id="c", name="t", arguments="{}")
    # An earlier turn's assistant messages must not count towards this turn's step.
    history = (user("earlier"), assistant("a"), assistant("b"))
    assert answer(model, request(*history, user("now")))[0].text == "zero"
    after_one = request(
        *history,
        user("now"),
        assistant("", call),
        ToolMessage(call_id="c", name="t", content="r"),
    )
    assert answer(model, after_one)[0].text == "one"
    after_two = request(*history, user("now"), assistant("x"), user("steer", "steer"), assistant())
    assert answer(model, after_two)[0].text == "two"


def test_last_step_repeats_past_the_end() -> None:
    model = model_of(steps_rule(".*", "zero", "last"))
    for taken in (1, 2, 5):
        req = request(user("p"), *[assistant(str(n)) for n in range(taken)])
        assert answer(model, req)[0].text == "last"


# ---------------------------------------------------------------------------- substitution


def test_prompt_substitution() -> None:
    model = model_of(steps_rule(".*", "you said <{prompt}> twice: {prompt}"))
    reply, _ = answer(model, request(user("hi")))
    assert reply.text == "you said <hi> twice: hi"


def test_last_message_is_the_newest_user_text_of_any_origin() -> None:
    model = model_of(steps_rule(".*", "prompt={prompt} last={last_message}", "again"))
    assert answer(model, request(user("p")))[0].text == "prompt=p last=p"
    steered = request(user("p"), user("go left", origin="steer"))
    assert answer(model, steered)[0].text == "prompt=p last=go left"
    checked = request(user("p"), user("steer", origin="steer"), user("tests fail", "check"))
    assert answer(model, checked)[0].text == "prompt=p last=tests fail"


def test_substituted_text_is_not_substituted_again() -> None:
    """User text is data, not template: a prompt that contains ``{last_message}`` must be
    echoed literally, not re-expanded with the steer's text."""
    model = model_of(steps_rule(".*", "{prompt}"))
    reply, _ = answer(model, request(user("literal {last_message}"), user("STEER", "steer")))
    assert reply.text == "literal {last_message}"


# ---------------------------------------------------------------------------- streaming


def test_chunk_chars_splits_the_stream_exactly() -> None:
    model = model_of({"when": ".*", "steps": [{"text": "abcdefghij", "chunk_chars": 4}]})
    reply, deltas = answer(model, request(user("p")))
    assert deltas == ["abcd", "efgh", "ij"]
    assert "".join(deltas) == reply.text == "abcdefghij"


def test_chunking_applies_to_the_substituted_text() -> None:
    model = model_of({"when": ".*", "steps": [{"text": "<{prompt}>", "chunk_chars": 3}]})
    reply, deltas = answer(model, request(user("hello")))
    assert reply.text == "<hello>"
    assert deltas == ["<he", "llo", ">"]


def test_default_chunking_still_concatenates_to_the_text() -> None:
    text = "x" * 40 + "y" * 7
    model = model_of(steps_rule(".*", text))
    reply, deltas = answer(model, request(user("p")))
    assert len(deltas) > 1
    assert "".join(deltas) == reply.text == text


def test_empty_text_streams_nothing() -> None:
    model = model_of({"when": ".*", "steps": [{"tool_calls": [{"name": "t"}]}]})
    reply, deltas = answer(model, request(user("p")))
    assert reply.text == ""
    assert "".join(deltas) == ""


def test_delay_ms_delays_the_stream() -> None:
    step = {"text": "abcdef", "chunk_chars": 1, "delay_ms": 20}
    model = model_of({"when": ".*", "steps": [step]})
    started = time.monotonic()
    _, deltas = answer(model, request(user("p")))
    elapsed = time.monotonic() - started
    assert deltas == list("abcdef")
    # Six chunks with 20 ms between them: well over 50 ms even if the first is immediate.
    assert elapsed >= 0.05


# ---------------------------------------------------------------------------- tool calls


def test_tool_call_ids_and_sorted_json_arguments() -> None:
    model = model_of(
        {
            "when": ".*",
            "steps": [
                {"text": "zero"},
                {
                    "tool_calls": [
                        {"name": "read_file", "arguments": {"path": "a.py", "limit": 3}},
                        {"name": "list_files", "arguments": {"z": 1, "a": {"y": 2, "b": 1}}},
                        {"name": "noop"},
                    ]
                },
            ],
        }
    )
    reply, _ = answer(model, request(user("p"), assistant("zero")))
    assert [(c.id, c.name) for c in reply.tool_calls] == [
        ("call_1_0", "read_file"),
        ("call_1_1", "list_files"),
        ("call_1_2", "noop"),
    ]
    assert reply.tool_calls[0].arguments == '{"limit": 3, "path": "a.py"}'
    assert reply.tool_calls[1].arguments == '{"a": {"b": 1, "y": 2}, "z": 1}'
    assert json.loads(reply.tool_calls[2].arguments) == {}


def test_tool_call_ids_use_the_real_step_number_when_the_last_step_repeats() -> None:
    model = model_of({"when": ".*", "steps": [{"tool_calls": [{"name": "t"}]}]})
    req = request(user("p"), *[assistant("") for _ in range(3)])
    reply, _ = answer(model, req)
    assert [c.id for c in reply.tool_calls] == ["call_3_0"]


def test_raw_string_arguments_are_passed_verbatim() -> None:
    raw = '{ "path" :"b.py" ,"x":1 }  not even json'
    model = model_of({"when": ".*", "steps": [{"tool_calls": [{"name": "t", "arguments": raw}]}]})
    reply, _ = answer(model, request(user("p")))
    assert reply.tool_calls[0].arguments == raw


# ---------------------------------------------------------------------------- usage


def test_script_usage_is_used_verbatim() -> None:
    usage = {"input_tokens": 123, "output_tokens": 7, "cached_tokens": 5}
    model = model_of({"when": ".*", "steps": [{"text": "a long answer " * 20, "usage": usage}]})
    reply, _ = answer(model, request(user("p")))
    assert reply.usage == Usage(input_tokens=123, output_tokens=7, cached_tokens=5)


def test_usage_is_estimated_without_a_script_usage() -> None:
    model = model_of(steps_rule(".*", "some answer"))
    short, _ = answer(model, request(user("p")))
    assert short.usage.input_tokens > 0
    assert short.usage.output_tokens > 0
    long, _ = answer(model, request(user("p" * 400)))
    assert long.usage.input_tokens > short.usage.input_tokens


def test_reply_names_the_model() -> None:
    model = ScriptedModel({"rules": [steps_rule(".*", "x")]}, name="demo-model")
    assert model.name == "demo-model"
    assert answer(model, request(user("p")))[0].model == "demo-model"


# ---------------------------------------------------------------------------- statelessness


def test_same_request_same_reply() -> None:
    """No state between calls: another request in between, or another instance (another
    worker process, after a crash), gives the same answer."""
    script = {
        "rules": [
            {
                "when": ".*",
                "steps": [
                    {"text": "{last_message}", "tool_calls": [{"name": "t", "arguments": {}}]},
                    {"text": "done"},
                ],
            }
        ]
    }
    model = ScriptedModel(script)
    req = request(user("p"), user("s", "steer"))
    first = answer(model, req)
    answer(model, request(user("other"), assistant("x")))
    again = answer(model, req)
    fresh = answer(ScriptedModel(script), req)
    assert first[0].text == "s"
    assert first == again == fresh


# ---------------------------------------------------------------------------- loading


def test_loads_from_a_path_and_a_string_path(tmp_path: Path) -> None:
    script = {"rules": [steps_rule("retry", "from file")]}
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script), encoding="utf-8")
    for source in (path, str(path)):
        model = ScriptedModel(source)
        assert answer(model, request(user("retry?")))[0].text == "from file"


def test_unreadable_path_is_invalid_request(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest):
        ScriptedModel(tmp_path / "missing.json")
    with pytest.raises(InvalidRequest):
        ScriptedModel(tmp_path)  # a directory


def test_invalid_json_file_is_invalid_request(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"rules": [', encoding="utf-8")
    with pytest.raises(InvalidRequest):
        ScriptedModel(path)


def test_non_utf8_file_is_invalid_request(tmp_path: Path) -> None:
    path = tmp_path / "latin1.json"
    path.write_bytes('{"rules": [{"when": "é", "steps": [{}]}]}'.encode("latin-1"))
    with pytest.raises(InvalidRequest):
        ScriptedModel(path)


# ---------------------------------------------------------------------------- validation


def _step_script(step: Any) -> dict[str, Any]:
    return {"rules": [{"when": ".*", "steps": [step]}]}


@pytest.mark.parametrize(
    "script",
    [
        pytest.param({}, id="no-rules"),
        pytest.param({"rules": []}, id="empty-rules"),
        pytest.param({"rules": "x"}, id="rules-not-a-list"),
        pytest.param({"rules": ["x"]}, id="rule-not-an-object"),
        pytest.param({"rules": [{"steps": [{}]}]}, id="rule-without-when"),
        pytest.param({"rules": [{"when": 3, "steps": [{}]}]}, id="when-not-a-string"),
        pytest.param({"rules": [{"when": "(", "steps": [{}]}]}, id="bad-regex"),
        pytest.param({"rules": [{"when": ".*"}]}, id="no-steps"),
        pytest.param({"rules": [{"when": ".*", "steps": []}]}, id="empty-steps"),
        pytest.param(_step_script("text"), id="step-not-an-object"),
        pytest.param(_step_script({"txt": "typo"}), id="unknown-step-key"),
        pytest.param(_step_script({"text": 5}), id="text-not-a-string"),
        pytest.param(_step_script({"chunk_chars": 0}), id="chunk-zero"),
        pytest.param(_step_script({"chunk_chars": -2}), id="chunk-negative"),
        pytest.param(_step_script({"chunk_chars": 2.5}), id="chunk-float"),
        pytest.param(_step_script({"chunk_chars": True}), id="chunk-bool"),
        pytest.param(_step_script({"delay_ms": -1}), id="delay-negative"),
        pytest.param(_step_script({"delay_ms": "5"}), id="delay-string"),
        pytest.param(_step_script({"tool_calls": [{}]}), id="call-without-name"),
        pytest.param(_step_script({"tool_calls": [{"name": ""}]}), id="call-empty-name"),
        pytest.param(_step_script({"tool_calls": ["read_file"]}), id="call-not-an-object"),
        pytest.param(
            _step_script({"tool_calls": [{"name": "t", "arguments": [1]}]}), id="arguments-list"
        ),
        pytest.param(_step_script({"usage": 5}), id="usage-not-an-object"),
        pytest.param(_step_script({"usage": {"input_tokens": "many"}}), id="usage-not-a-number"),
        pytest.param(_step_script({"tool_calls": 5}), id="tool-calls-a-number"),
        pytest.param(_step_script({"tool_calls": None}), id="tool-calls-null"),
    ],
)
def test_invalid_script_is_invalid_request(script: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        ScriptedModel(script)


def test_valid_edge_values_are_accepted() -> None:
    model = ScriptedModel(_step_script({"chunk_chars": 1, "delay_ms": 0.5, "text": "ab"}))
    assert answer(model, request(user("p")))[1] == ["a", "b"]


# ---------------------------------------------------------------------------- tools


def test_validate_tools_refuses_unknown_tools() -> None:
    model = model_of(
        {"when": "a", "steps": [{"tool_calls": [{"name": "read_file"}]}]},
        {"when": ".*", "steps": [{"text": "x"}, {"tool_calls": [{"name": "deploy"}]}]},
    )
    assert model.tool_names() == {"read_file", "deploy"}
    model.validate_tools(["read_file", "deploy", "extra"])
    with pytest.raises(InvalidRequest, match="deploy"):
        model.validate_tools(["read_file", "write_file"])


def test_validate_tools_accepts_a_script_without_tools() -> None:
    model_of(steps_rule(".*", "x")).validate_tools([])
