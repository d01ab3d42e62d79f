"""The OpenAI-compatible HTTP server: ``create_app()`` builds the FastAPI app around one ``AsyncLLM``.

Endpoints (what vLLM's ``vllm serve`` offers, minus the parts minengine has no engine for):

- ``POST /v1/completions``, ``POST /v1/chat/completions``: streaming (SSE) or not; see
  ``serving_completion`` and ``serving_chat``;
- ``GET /v1/models``, ``GET /v1/models/{model}`` (the SDK's ``models.retrieve``); ``GET /health`` (200,
  or 503 once the engine loop has failed); ``GET /metrics`` (Prometheus, see ``metrics``);
  ``GET /version``.

Errors are OpenAI error bodies, ``{"error": {"message", "type", "param", "code"}}``: 400 for every
validation problem (FastAPI's 422 is turned into 400, as vLLM does) and for a too-long request, 404 for
an unknown model or route, 401 for a wrong API key (``/v1/*`` only, so health checks and Prometheus
need no key). Bad input never causes a 500. A client that disconnects aborts its request.

    app = create_app(model="tinystories-4m")            # or create_app(AsyncLLM(...))
    uvicorn.run(app, host="127.0.0.1", port=8000)       # or minengine.server.ServerThread(app)
"""

from __future__ import annotations

import hmac
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from minengine import __version__
from minengine.engine.async_llm import AsyncLLM
from minengine.server.metrics import ServerMetrics
from minengine.server.protocol import (
    ROLES,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
)
from minengine.server.serving_chat import OpenAIServingChat
from minengine.server.serving_completion import OpenAIServingCompletion
from minengine.server.serving_engine import OpenAIError, error_body

logger = logging.getLogger("minengine.server")

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": desc}
    for code, desc in [(400, "Invalid request"), (401, "Wrong API key"), (404, "Unknown model")]
}


def _json_or_stream(model: type) -> dict[str, Any]:
    """The 200 response of a generation endpoint: JSON, or with ``stream: true`` an SSE stream whose
    ``data:`` lines hold chunk objects and end with ``data: [DONE]`` (documented so the schema is true)."""
    return {
        "model": model,
        "description": "The completion as JSON, or an SSE stream (text/event-stream) when stream is true",
        "content": {
            "text/event-stream": {
                "schema": {
                    "type": "object",
                    "description": "One server-sent event: `data:` holds a chunk object as JSON (or an "
                    "error object); the last event's data is `[DONE]`",
                    "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
                    "required": ["data"],
                }
            }
        },
    }


# The routes are module-level functions that reach the serving objects through ``request.app.state``, as
# vLLM's api_server does. Closures inside ``create_app`` would hold the engine, and FastAPI caches each
# endpoint function it has analysed for the life of the process: every app ever built would keep its
# engine (and on a GPU its memory) until the process exits.
router = APIRouter()


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Shut the engine down on exit when this app built it (``create_app(model=...)``)."""
    yield
    if app.state.owns_llm:
        await app.state.llm.shutdown()


@router.post(
    "/v1/completions",
    response_model=None,
    responses={200: _json_or_stream(CompletionResponse), **_ERRORS},
)
async def create_completion(request: CompletionRequest, raw_request: Request) -> Response:
    return await raw_request.app.state.completions.create_completion(request, raw_request)


@router.post(
    "/v1/chat/completions",
    response_model=None,
    responses={200: _json_or_stream(ChatCompletionResponse), **_ERRORS},
)
async def create_chat_completion(request: ChatCompletionRequest, raw_request: Request) -> Response:
    return await raw_request.app.state.chat.create_chat_completion(request, raw_request)


def _model_card(state: Any) -> ModelCard:
    root = getattr(state.llm.engine.model, "model_path", None)
    return ModelCard(id=state.model_name, root=None if root is None else str(root),
                     max_model_len=state.completions.max_model_len)


@router.get("/v1/models", response_model=ModelList, responses={401: _ERRORS[401]})
async def show_models(raw_request: Request) -> ModelList:
    return ModelList(data=[_model_card(raw_request.app.state)])


@router.get(
    "/v1/models/{model_id:path}",
    response_model=ModelCard,
    responses={401: _ERRORS[401], 404: _ERRORS[404]},
)
async def show_model(model_id: str, raw_request: Request) -> ModelCard:
    name = raw_request.app.state.model_name
    if model_id != name:
        raise OpenAIError(f"The model `{model_id}` does not exist; this server serves `{name}`.", 404,
                          "model")
    return _model_card(raw_request.app.state)


@router.get(
    "/health",
    response_class=Response,
    responses={
        200: {"description": "The engine is running (empty body)"},
        503: {"model": ErrorResponse, "description": "The engine has failed"},
    },
)
async def health(raw_request: Request) -> Response:
    raw_request.app.state.completions.check_health()
    return Response(status_code=200)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"description": "Prometheus text format", "content": {"text/plain": {}}}},
)
async def prometheus_metrics(raw_request: Request) -> Response:
    return Response(raw_request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/version")
async def version() -> dict[str, str]:
    return {"version": __version__}


def create_app(
    llm: AsyncLLM | None = None,
    model: str | None = None,
    *,
    served_model_name: str | None = None,
    api_key: str | None = None,
    metrics_prefix: str = "minengine",
    **engine_options: Any,
) -> FastAPI:
    """Build the app. Pass a running ``AsyncLLM`` (it stays yours: the app does not shut it down), or
    ``model=`` and ``EngineConfig`` options to have one built (then the app shuts it down on exit).

    ``served_model_name`` is the id in ``/v1/models`` and what requests must name (default: ``model``).
    ``api_key``: require ``Authorization: Bearer <api_key>`` on ``/v1/*``.
    """
    owns_llm = llm is None
    if llm is None:
        llm = AsyncLLM(model=model, **engine_options)
    elif engine_options:
        raise TypeError(f"engine options {sorted(engine_options)} given together with a ready AsyncLLM")
    name = served_model_name or model or _model_name(llm)
    metrics = ServerMetrics(llm.engine, name, prefix=metrics_prefix)

    app = FastAPI(title="minengine OpenAI-compatible server", version=__version__, lifespan=lifespan)
    app.state.llm, app.state.owns_llm, app.state.metrics, app.state.model_name = llm, owns_llm, metrics, name
    # the serving objects (the routes use them; tests and labs reach them here too)
    app.state.completions = OpenAIServingCompletion(llm, name, metrics)
    app.state.chat = OpenAIServingChat(llm, name, metrics)
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    _add_error_handlers(app)
    app.include_router(router)
    return app


class APIKeyMiddleware:
    """401 on ``/v1/*`` unless ``Authorization: Bearer <key>`` (checked before the body is read)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] != "OPTIONS" and scope["path"].startswith("/v1"):
            given = Headers(scope=scope).get("authorization", "").encode()
            if not hmac.compare_digest(given, self.expected):
                response = JSONResponse(
                    error_body("Invalid or missing API key", 401),
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def openai_error(_: Request, exc: OpenAIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _describe_validation(exc.errors())
        return JSONResponse(error_body(message, 400, param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            error_body(str(exc.detail), exc.status_code),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error", exc_info=exc)
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}", 500), status_code=500)


def _describe_validation(errors: Any) -> tuple[str, str | None]:
    """pydantic errors -> one readable line and the first offending field ("messages.0.role")."""
    parts, param = [], None
    for err in list(errors)[:3]:
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        msg = err.get("msg", "invalid value")
        if err.get("type") == "json_invalid":  # loc holds the character offset, not a field
            where = f" (at character {loc[-1]})" if loc else ""
            parts.append(f"malformed JSON: {err.get('ctx', {}).get('error', msg)}{where}")
            continue
        field = ".".join(_field_path(loc)) or None
        param = param or field
        parts.append(f"{field}: {msg}" if field else msg)
    return "; ".join(parts) or "invalid request", param


_BRANCH = re.compile(r"^(str|int|float|bool|none|list\[.*\]|dict\[.*\]|function-.*)$")


def _field_path(loc: list[str]) -> list[str]:
    """A field's path without pydantic's union-branch labels: ``messages.0.user.content.str`` (the
    message was read as the ``user`` kind, its content as a ``str``) is the client's
    ``messages.0.content``."""
    out: list[str] = []
    for item in loc:
        if _BRANCH.match(item) or (out and out[-1].isdigit() and item in ROLES):
            continue
        out.append(item)
    return out


def _model_name(llm: AsyncLLM) -> str:
    engine = llm.engine
    if engine.config.model:
        return str(engine.config.model)
    path = getattr(engine.model, "model_path", None)
    if path is not None:
        return Path(path).name
    from minengine.models.loader import DEFAULT_MODEL

    return DEFAULT_MODEL
