"""Generated text: streaming-safe detokenization and stop strings.

Text is released to the client only when it is complete UTF-8 and cannot still turn
into a stop string (a suffix that is a prefix of a stop string is held back), as
llama-server does.
"""

from __future__ import annotations

from loraserve.model.tokenizer import StreamDecoder, Tokenizer


class TextOutput:
    """Accumulates one sequence's text and finds stop strings in it."""

    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...]) -> None:
        self._dec = StreamDecoder(tokenizer)
        self.stop = tuple(s for s in stop if s)
        self.text = ""
        self.sent = 0
        self.stopping_word = ""

    def push(self, token: int) -> str:
        """Add a token; return the text that can be sent now ('' if none).

        After a stop string is found, `stopping_word` is set and `text` ends before it.
        """
        self.text += self._dec.push(token)
        return self._release()

    def flush(self) -> str:
        """At the end: everything not sent yet (held-back partial stops included)."""
        if not self.stopping_word:
            self.text += self._dec.flush()
            found = self._find_stop()
            if found:
                return self._release()
        out = self.text[self.sent :]
        self.sent = len(self.text)
        return out

    def _find_stop(self) -> bool:
        longest = max((len(s) for s in self.stop), default=0)
        start = max(0, self.sent - longest)
        best = None
        for s in self.stop:
            i = self.text.find(s, start)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return False
        self.text = self.text[: best[0]]
        self.stopping_word = best[1]
        return True

    def _release(self) -> str:
        if self.stop and not self.stopping_word:
            self._find_stop()
        end = len(self.text)
        if not self.stopping_word:
            end -= self._held_back()
        out = self.text[self.sent : end]
        self.sent = max(self.sent, end)
        return out

    def _held_back(self) -> int:
        n = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text) - self.sent), n, -1):
                if self.text.endswith(s[:k]):
                    n = k
                    break
        return n
