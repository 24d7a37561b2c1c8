"""The conversations, tools and request options the chat oracle renders every template with.

Fixtures are OpenAI chat-completion message lists as a client sends them (tool-call
arguments as JSON strings, `content: null` beside tool calls); the request options are the
body fields llama-server passes to `common_chat_templates_apply`.
"""

from __future__ import annotations

import itertools
import json

USER = {"role": "user", "content": "What is the weather in Paris?"}
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
CALL_WEATHER = {
    "id": "call_0001",
    "type": "function",
    "function": {"name": "get_weather", "arguments": json.dumps({"location": "Paris"})},
}
CALL_EVENT = {
    "id": "call_0002",
    "type": "function",
    "function": {
        "name": "create_event",
        "arguments": json.dumps(
            {
                "title": "Picnic",
                "when": {"date": "2025-03-15", "time": "12:00"},
                "attendees": ["Ana", "Bo"],
            }
        ),
    },
}
RESULT_WEATHER = {"role": "tool", "tool_call_id": "call_0001", "content": '{"temperature": 21}'}
RESULT_EVENT = {"role": "tool", "tool_call_id": "call_0002", "content": '{"created": true}'}

FIXTURES: dict[str, list[dict]] = {
    "user": [USER],
    "system_user": [SYSTEM, USER],
    "multi_turn": [
        SYSTEM,
        USER,
        {"role": "assistant", "content": "It is sunny and 21 degrees."},
        {"role": "user", "content": "And tomorrow?"},
    ],
    "tool_call": [
        USER,
        {"role": "assistant", "content": None, "tool_calls": [CALL_WEATHER]},
        RESULT_WEATHER,
    ],
    "tool_call_parallel": [
        {"role": "user", "content": "Weather in Paris, and book a picnic tomorrow noon."},
        {"role": "assistant", "content": None, "tool_calls": [CALL_WEATHER, CALL_EVENT]},
        RESULT_WEATHER,
        RESULT_EVENT,
    ],
    "tool_call_followup": [
        SYSTEM,
        USER,
        {"role": "assistant", "content": None, "tool_calls": [CALL_WEATHER]},
        RESULT_WEATHER,
        {"role": "assistant", "content": "It is 21 degrees in Paris."},
        {"role": "user", "content": "Thanks! And in Berlin?"},
    ],
    "reasoning": [
        USER,
        {
            "role": "assistant",
            "reasoning_content": "The user asks about Paris. I have no tools, so I guess.",
            "content": "Probably mild, around 15 degrees.",
        },
        {"role": "user", "content": "And tomorrow?"},
    ],
    "content_parts": [
        {"role": "system", "content": [{"type": "text", "text": "You are terse."}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Describe Paris"},
                {"type": "text", "text": "in one sentence."},
            ],
        },
    ],
    "developer": [{"role": "developer", "content": "Answer in French."}, USER],
    # last message from the assistant: llama-server continues it (continue_final_message
    # "auto", add_generation_prompt false) unless --no-prefill-assistant
    "prefill": [USER, {"role": "assistant", "content": "The weather in Paris is"}],
}

TOOLS: dict[str, list[dict]] = {
    "empty": [],
    "two": [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Get the current weather in a city.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "location": {"type": "string", "description": "City name"},
                        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    },
                    "required": ["location"],
                },
            },
        },
        {
            "type": "function",
            "function": {
                "name": "create_event",
                "description": "Create a calendar event.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "title": {"type": "string"},
                        "when": {
                            "type": "object",
                            "properties": {
                                "date": {"type": "string", "description": "YYYY-MM-DD"},
                                "time": {"type": "string", "description": "HH:MM"},
                            },
                            "required": ["date"],
                        },
                        "attendees": {"type": "array", "items": {"type": "string"}},
                    },
                    "required": ["title", "when"],
                },
            },
        },
    ],
}


def _case(fixture: str, thinking: bool, tools: str | None = None, **over: object) -> dict:
    case = {
        "fixture": fixture,
        "tools": tools,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "enable_thinking": thinking,
        "add_generation_prompt": True,
        "continue_final_message": None,
        "reasoning_format": "deepseek",
        "preserve_reasoning": True,
    }
    case.update(over)
    return case


def cases() -> list[dict]:
    """Every request option combination rendered for each template (same list for all)."""
    out: list[dict] = []
    no_tools = [f for f in FIXTURES if f != "prefill"]
    for fixture, thinking, agp in itertools.product(no_tools, (True, False), (True, False)):
        out.append(_case(fixture, thinking, add_generation_prompt=agp))
    for thinking in (True, False):
        out.append(
            _case("prefill", thinking, add_generation_prompt=False, continue_final_message="auto")
        )
    choices = [("auto", False), ("auto", True), ("required", False), ("required", True)]
    choices.append(("none", False))
    for fixture in ("user", "tool_call", "tool_call_parallel"):
        for (choice, parallel), thinking in itertools.product(choices, (True, False)):
            out.append(
                _case(fixture, thinking, "two", tool_choice=choice, parallel_tool_calls=parallel)
            )
    for fixture, thinking in itertools.product(
        ("system_user", "tool_call_followup", "reasoning"), (True, False)
    ):
        out.append(_case(fixture, thinking, "two"))
    out.append(_case("user", True, "empty"))
    out.append(_case("user", True, reasoning_format="none"))
    out.append(_case("user", True, "two", reasoning_format="none"))
    # --no-reasoning-preserve (llama-server sends preserve_reasoning true unless told not to)
    for fixture, thinking in (("reasoning", True), ("reasoning", False), ("tool_call", True)):
        out.append(
            _case(
                fixture,
                thinking,
                "two" if fixture == "tool_call" else None,
                preserve_reasoning=False,
            )
        )
    return out


def request(case: dict) -> dict:
    """The chat-completion body fields of one case (what chat_oracle's REQ reads)."""
    req = {
        "messages": FIXTURES[case["fixture"]],
        "tool_choice": case["tool_choice"],
        "parallel_tool_calls": case["parallel_tool_calls"],
        "enable_thinking": case["enable_thinking"],
        "add_generation_prompt": case["add_generation_prompt"],
        "reasoning_format": case["reasoning_format"],
        # llama-server's default_template_kwargs (common/arg.cpp; --no-reasoning-preserve: false)
        "chat_template_kwargs": {"preserve_reasoning": case["preserve_reasoning"]},
    }
    if case["tools"] is not None:
        req["tools"] = TOOLS[case["tools"]]
    cont = case["continue_final_message"]
    if cont is not None:  # "auto" is the body's `true`; "content" / "reasoning_content" as is
        req["continue_final_message"] = True if cont == "auto" else cont
    return req
