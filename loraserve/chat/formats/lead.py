"""Where the answer starts: what the prompt already wrote of the answer's turn, which
llama.cpp parses together with the answer (`common_chat_parse` reads
`generation_prompt + output`, its parser consuming the generation prompt up to the
reasoning start as a literal), and whether the prompt left the answer inside reasoning.
"""

from __future__ import annotations

from loraserve.chat.formats.description import ChatFormat

HARMONY_ANALYSIS = "<|channel|>analysis<|message|>"
HARMONY_FINAL = "<|channel|>final"


def turn_lead(fmt: ChatFormat, prompt: str, continued: str = "") -> str:
    """What the prompt already wrote of the answer's turn, parsed with the answer: the prompt
    after its last assistant marker (from the reasoning start when the turn writes one, so
    a template whose reasoning start is its assistant marker still opens reasoning), less a
    closed empty reasoning block (llama.cpp's literal prefix consumes it), leading
    whitespace dropped; "" when a user turn follows the last marker. `continued`: the text
    of a continued assistant message, the lead when the format knows no assistant marker
    and the prompt ends with it; else, with no marker found, the reasoning the prompt left
    open (llama.cpp's continuation of a reasoning prefill: reasoning start + prefill)."""
    start = fmt.assistant_start
    at = _turn_at(fmt, prompt)
    if at < 0:
        if continued and prompt.endswith(continued):
            return continued
        r_start = fmt.reasoning_start.strip()
        if r_start and opens_reasoning(fmt, prompt):  # no marker to find the turn by: the
            return prompt[prompt.rfind(r_start) :]  # reasoning it opened (and its prefill)
        return ""
    turn = prompt[at:]
    r_start, r_end = fmt.reasoning_start.strip(), fmt.reasoning_end.strip()
    opens = turn.find(r_start) if r_start else -1
    if fmt.dialect == "harmony":
        at = _harmony_turn(prompt, at, start)
        lead = prompt[at + len(start) :]
    elif fmt.dialect == "muse_glimmer":
        lead = prompt[_muse_turn(prompt, at) + len(start) :]
    elif opens >= 0 and opens < len(start):  # the marker is (part of) the reasoning start
        lead = turn[opens:]
    else:
        lead = turn[len(start) :]
    lead = _last_opener(lead.lstrip(" \t\n\r"), r_start, r_end)
    if r_end and lead.startswith(r_end) and r_start not in lead:  # thinking off: closed block
        lead = lead[len(r_end) :].lstrip(" \t\n\r")
    return lead


def _turn_at(fmt: ChatFormat, prompt: str) -> int:
    """Where the answer's turn starts: the last assistant marker, unless a user turn follows
    it (an earlier turn's marker, or one a system prompt quotes); -1 when none."""
    start = fmt.assistant_start
    at = prompt.rfind(start) if start else -1
    if at >= 0 and fmt.user_start and prompt.find(fmt.user_start, at) >= 0:
        return -1
    return at


def _last_opener(lead: str, r_start: str, r_end: str) -> str:
    """The lead from the last reasoning opener of its leading run of reasoning markers.
    A template that writes the opener, or a closed empty block, itself without the
    generation prompt (llama.cpp leaves `add_generation_prompt` undefined there, and RWKV
    World defaults it to true) or whose generation prompt closes the reasoning (GLM 4.7,
    Laguna, Spark with thinking off: `</think>`) is followed, in a reasoning prefill's
    prompt, by the continuation's own opener; llama.cpp's generation prompt, a render diff
    (up to its opener), then holds only the continuation's, and parses from there."""
    if not r_start:
        return lead
    i, last = 0, 0
    while True:
        i += len(lead[i:]) - len(lead[i:].lstrip(" \t\n\r"))
        if lead.startswith(r_start, i):
            last, i = i, i + len(r_start)
        elif r_end and lead.startswith(r_end, i):
            i += len(r_end)
        else:
            return lead[last:]


def _muse_turn(prompt: str, at: int) -> int:
    """Muse Glimmer writes a turn as several assistant messages: a continued answer's turn
    starts at the ` to=self` message before it (llama.cpp's generation prompt holds both)."""
    while prompt.endswith(MUSE_EOM, 0, at):
        before = prompt.rfind(MUSE_START, 0, at)
        if before < 0 or "<|start|>" in prompt[before + len(MUSE_START) : at]:
            break
        at = before
    return at


def _harmony_turn(prompt: str, at: int, start: str) -> int:
    """gpt-oss writes a turn as several assistant messages: a continued final message's
    turn starts at the analysis message just before it."""
    if not prompt.startswith(HARMONY_FINAL, at + len(start)):
        return at
    before = prompt.rfind(start, 0, at)
    between = prompt[before + len(start) : at] if before >= 0 else ""
    if between.startswith(HARMONY_ANALYSIS) and "<|start|>" not in between:
        return before
    return at


MUSE_START, MUSE_SELF, MUSE_EOM = "<|start|>assistant", " to=self<|message|>", "<|eom|>"


def opens_reasoning(fmt: ChatFormat, prompt: str) -> bool:
    """Whether the prompt leaves the answer inside reasoning: the generation prompt (or a
    continued assistant message) opened the reasoning block and did not close it (Muse
    Glimmer: its last message is an unended ` to=self` one, a reasoning prefill)."""
    if fmt.dialect == "muse_glimmer":
        at = prompt.rfind(MUSE_START)
        tail = prompt[at + len(MUSE_START) :] if at >= 0 else ""
        return tail.startswith(MUSE_SELF) and MUSE_EOM not in tail
    r_start, r_end = fmt.reasoning_start.strip(), fmt.reasoning_end.strip()
    if not r_start:
        return False
    turn = _turn_at(fmt, prompt)
    tail = prompt[turn:] if turn >= 0 else prompt[-len(r_start) - 256 :]
    at = tail.rfind(r_start)
    return at >= 0 and (not r_end or tail.find(r_end, at) < 0)


def closes_reasoning(fmt: ChatFormat, prompt: str) -> bool:
    """Whether the generation prompt wrote a closed reasoning block itself (thinking off:
    Qwen3's `<think>\\n\\n</think>\\n\\n`, GLM 4.7's `</think>`): llama.cpp's grammar, fed
    the generation prompt, takes it as the answer's one optional reasoning block, so a
    forced call then follows with no block of the answer's own."""
    r_end = fmt.reasoning_end.strip()
    if not r_end or opens_reasoning(fmt, prompt):
        return False
    at = _turn_at(fmt, prompt)
    if at < 0:
        return prompt.rstrip().endswith(r_end)
    return r_end in prompt[at + len(fmt.assistant_start) :]
