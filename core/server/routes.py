"""The operations' routes: FastAPI's `APIRoute` with a shorter way through each request.

FastAPI's request handler serves every endpoint shape (forms, files, streams, dependencies
with `yield` or with parameters of their own, sub-dependencies, overrides, background tasks,
telemetry spans around each step). A row of the operations table has one shape: path, query
and header parameters, at most one JSON body, and dependencies that are async functions of
the request alone (`require_json`, the caller). For that shape `OperationRoute` takes the
same steps in a straight line, with FastAPI's own functions for every check, so the answers
and errors are the same: the body read and JSON-decoded, the dependencies in their declared
order, the parameters and then the body validated (their errors reported together), the
endpoint, the response model's validation and JSON dump. That takes FastAPI's generic
dispatch off every request's CPU (bench/writes.py compares the two).

Any other shape, a request FastAPI's telemetry is tracing, and a FastAPI without the
functions used here take FastAPI's own handler."""

import inspect
import json
from typing import Any, Callable, Coroutine, Optional

from fastapi import HTTPException, Request, Response, params
from fastapi.dependencies.models import Dependant
from fastapi.dependencies.utils import request_body_to_args, request_params_to_args
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError, ResponseValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic_core import PydanticUndefined

try:
    from fastapi.telemetry import get_telemetry_data
except ImportError:  # a FastAPI without native telemetry (before 0.16x): nothing is traced
    def get_telemetry_data() -> None:  # type: ignore[misc]
        return None

Handler = Callable[[Request], Coroutine[Any, Any, Response]]
Dependency = tuple[Optional[str], Callable[..., Any], str]  # (value name, function, its request parameter)

# The calls below as FastAPI 0.113 and later make them.
_SUPPORTED = "embed_body_fields" in inspect.signature(request_body_to_args).parameters


def plain_dependencies(dependant: Dependant) -> Optional[list[Dependency]]:
    """Each dependency of `dependant`, when every one is an async function of the request
    alone; None otherwise (FastAPI's handler then solves them)."""
    plain = []
    for sub in dependant.dependencies:
        if (sub.dependencies or sub.path_params or sub.query_params or sub.header_params or sub.cookie_params
                or sub.body_params or sub.response_param_name or sub.background_tasks_param_name
                or sub.security_scopes_param_name or getattr(sub, "concurrency", None) is not None
                or sub.request_param_name is None or not inspect.iscoroutinefunction(sub.call)):
            return None
        assert sub.call is not None
        plain.append((sub.name, sub.call, sub.request_param_name))
    return plain


def declares_json(request: Request) -> bool:
    """FastAPI's rule for decoding a body as JSON: application/json or application/*+json."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return ctype == "application/json" or (ctype.startswith("application/") and ctype.endswith("+json"))


async def read_json_body(request: Request) -> Any:
    """The body as FastAPI reads it: Undefined when empty, decoded when it declares JSON, else
    the bytes (the validation then refuses them)."""
    try:
        raw = await request.body()
        if not raw:
            return PydanticUndefined
        if not declares_json(request):
            return raw
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error",
                                       "input": {}, "ctx": {"error": e.msg}}], body=e.doc) from e
    except HTTPException:
        raise
    except Exception as e:  # undecodable bytes, nesting too deep, a broken stream
        raise HTTPException(status_code=400, detail="There was an error parsing the body") from e


class OperationRoute(APIRoute):
    """An `APIRoute` whose requests take the straight way when its endpoint has the operations'
    shape (see the module's docstring); the OpenAPI document is FastAPI's as before."""

    straight: bool  # whether its requests take the short way (else FastAPI's handler)

    def get_route_handler(self) -> Handler:
        generic = super().get_route_handler()
        self.straight = False
        dependant = self.dependant
        plain = plain_dependencies(dependant)
        body_field, response_field = self.body_field, self.response_field
        if (not _SUPPORTED or plain is None or dependant.cookie_params or dependant.response_param_name
                or dependant.background_tasks_param_name or dependant.security_scopes_param_name
                or dependant.http_connection_param_name or not inspect.iscoroutinefunction(dependant.call)
                or getattr(self, "is_json_stream", False) or getattr(self, "is_sse_stream", False)
                or self.dependency_overrides_provider is not None
                or (body_field is not None and isinstance(body_field.field_info, params.Form))  # forms, files
                or (response_field is not None and not hasattr(response_field, "serialize_json"))):
            return generic
        endpoint = dependant.call
        assert endpoint is not None
        self.straight = True
        parameters = [(fields, source) for fields, source in (
            (dependant.path_params, lambda request: request.path_params),
            (dependant.query_params, lambda request: request.query_params),
            (dependant.header_params, lambda request: request.headers)) if fields]
        status_code = self.status_code or 200  # FastAPI's: the route's, else the response class's

        async def handle(request: Request) -> Response:
            if get_telemetry_data() is not None:  # FastAPI's spans and events wrap its own steps
                return await generic(request)
            body = await read_json_body(request) if body_field is not None else PydanticUndefined
            values: dict[str, Any] = {}
            for name, call, request_param in plain:
                solved = await call(**{request_param: request})
                if name is not None:
                    values[name] = solved
            errors: list[Any] = []
            for fields, source in parameters:
                found, wrong = request_params_to_args(fields, source(request))
                values.update(found)
                errors += wrong
            if dependant.body_params:
                found, wrong = await request_body_to_args(dependant.body_params, body, self._embed_body_fields)
                values.update(found)
                errors += wrong
            if errors:
                raise RequestValidationError(errors, body=body)
            if dependant.request_param_name:
                values[dependant.request_param_name] = request
            result = await endpoint(**values)
            if isinstance(result, Response):
                return result
            if response_field is None:
                return JSONResponse(jsonable_encoder(result), status_code=status_code)
            value, errors = response_field.validate(result, {}, loc=("response",))
            if errors:
                raise ResponseValidationError(errors=errors, body=result)
            content = response_field.serialize_json(
                value, include=self.response_model_include, exclude=self.response_model_exclude,
                by_alias=self.response_model_by_alias, exclude_unset=self.response_model_exclude_unset,
                exclude_defaults=self.response_model_exclude_defaults, exclude_none=self.response_model_exclude_none)
            return Response(content, status_code=status_code, media_type="application/json")

        return handle


__all__ = ["OperationRoute"]
