"""The server's state (`app.state.server`): the configuration, the model and engine once
loaded (or why loading failed), and the flights in progress."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from starlette.requests import Request as HttpRequest

from loraserve.chat.template import ChatTemplate
from loraserve.engine.engine import Engine
from loraserve.engine.request import Event, Run
from loraserve.model.loader import LoadedModel
from loraserve.server.config.args import ServerConfig
from loraserve.server.errors import unavailable
from loraserve.server.flight import Flights

log = logging.getLogger("loraserve.server")

WARNED_MODELS_MAX = 256  # unknown `model` names remembered for the once-per-name warning
NAME_KEY_MAX = 128  # a longer name is remembered by its SHA-256, and logged cut


class ServerState:
    """The server's one shared object.

    `engine` is None until the model is loaded (every endpoint but /health answers 503
    meanwhile). Engine state is only touched through the engine's public methods.
    """

    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self.model: LoadedModel | None = None
        self.engine: Engine | None = None
        self.load_error: str | None = None
        self.chat_template: ChatTemplate | None = None  # resolved at start, with the model
        self.loop: asyncio.AbstractEventLoop | None = None  # the app's, set at start-up
        self.started = time.time()
        self.flights = Flights()
        self.listeners: list[Callable[[Run, Event], None]] = []  # added at `attach`
        self._warned_models: OrderedDict[str, None] = OrderedDict()  # LRU, WARNED_MODELS_MAX
        self.unknown_model_requests = 0  # requests whose `model` named nothing known
        # slot id -> (tenant that restored it, the id of the slot's last request then: None,
        # as a restore clears it): a restored slot's owner under `--cache-isolation key`
        # (`native/slots.py`); slot actions on one slot run one at a time (`slot_locks`)
        self.slot_restores: dict[int, tuple[str, int | None]] = {}
        self.slot_locks: dict[int, asyncio.Lock] = {}

    def attach(self, model: LoadedModel, engine: Engine) -> None:
        """Make a started engine serve requests (called once, from the loading thread);
        `listeners` become engine listeners, with the one that wakes the flights."""
        engine.listeners.extend([*self.listeners, self.flights.listener])
        self.model = model
        self.engine = engine

    def template(self) -> ChatTemplate:
        """The chat template requests render with (resolved at start from the flags, the
        model's own, or the fallback)."""
        if self.chat_template is None:  # a model attached without `startup.start`
            from loraserve.chat.template import resolve_chat_template

            tok = self.require().tokenizer
            tool_use = (
                self.model.metadata.get("tokenizer.chat_template.tool_use") if self.model else None
            )
            self.chat_template, _ = resolve_chat_template(
                self.cfg.chat_template, self.cfg.chat_template_origin, tok, tool_use
            )
        return self.chat_template

    def require(self) -> Engine:
        """The engine, or a 503 while the model is loading (or failed to)."""
        if self.engine is None:
            if self.load_error:
                raise unavailable(f"Model failed to load: {self.load_error}")
            raise unavailable()
        return self.engine

    @property
    def model_name(self) -> str:
        """The name clients see in `model`: the first `--alias`, else the model's file name."""
        if self.cfg.alias:
            return self.cfg.alias[0]
        if self.model is not None:
            return self.model.path.name
        return self.cfg.model or ""

    def names_the_model(self, name: str) -> bool:
        """Whether an OpenAI `model` names the served model (its name, file name or an
        alias; case ignored) rather than an adapter."""
        names = {self.model_name, *self.cfg.alias}
        if self.model is not None:
            names |= {self.model.name, self.model.path.name, self.model.path.stem}
        return name.casefold() in {n.casefold() for n in names if n}

    def warn_unknown_model(self, name: str) -> None:
        """Count a `model` naming nothing known (it is served by the model) and log it once
        per name among the last WARNED_MODELS_MAX names (bounded memory whatever clients
        send; a long name is kept as its hash and logged cut)."""
        self.unknown_model_requests += 1
        key = name if len(name) <= NAME_KEY_MAX else hashlib.sha256(name.encode()).hexdigest()
        if key in self._warned_models:
            self._warned_models.move_to_end(key)
            return
        self._warned_models[key] = None
        if len(self._warned_models) > WARNED_MODELS_MAX:
            self._warned_models.popitem(last=False)
        shown = (
            name if len(name) <= NAME_KEY_MAX else f"{name[:NAME_KEY_MAX]}... ({len(name)} chars)"
        )
        log.warning(
            "model %r names neither the model nor a loaded adapter: served by %s "
            "(--strict-model-names makes it a 404)",
            shown,
            self.model_name,
        )

    @property
    def warned_model_names(self) -> int:
        """How many unknown model names are remembered for the warning (at most
        WARNED_MODELS_MAX)."""
        return len(self._warned_models)

    def abort_flights(self, message: str = "the server is shutting down") -> None:
        """Event loop: end every flight now; its unfinished requests are cancelled and
        answer 503 `unavailable_error` (the end of the shutdown grace period)."""
        self.flights.abort_all(message)

    def shutdown(self) -> None:
        """Cancel every request still in flight and stop the engine thread."""
        self.flights.close_all()
        if self.engine is not None:
            self.engine.shutdown()


def get_state(request: HttpRequest) -> ServerState:
    """The `ServerState` of the app serving `request`."""
    return request.app.state.server
