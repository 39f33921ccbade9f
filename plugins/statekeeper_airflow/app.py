"""The plugin's FastAPI app: the catalog API under ``/api`` and the pages at ``/``.

Catalog errors become HTTP answers: an unknown job or snapshot is 404, a bad filter 400, a
catalog that is unreachable or not at head 503. Each carries the catalog's own message, which
says what to do (e.g. run ``statectl catalog upgrade``). The API answers JSON, pages HTML.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from state_engine.errors import (
    CatalogUnreachable,
    CatalogVersionMismatch,
    ConfigurationError,
    InvalidCatalogInput,
    NotFound,
)
from statekeeper_airflow import api, pages
from statekeeper_airflow.catalog_access import CatalogHolder

ERROR_STATUS: tuple[tuple[type[Exception], int], ...] = (
    (NotFound, status.HTTP_404_NOT_FOUND),
    (InvalidCatalogInput, status.HTTP_400_BAD_REQUEST),
    (CatalogVersionMismatch, status.HTTP_503_SERVICE_UNAVAILABLE),
    (CatalogUnreachable, status.HTTP_503_SERVICE_UNAVAILABLE),
    (ConfigurationError, status.HTTP_503_SERVICE_UNAVAILABLE),
)


def security_headers() -> dict[str, str]:
    """Headers every answer carries: the pages run only their own inline style, SVG and the one
    theme script (by its hash); nothing is loaded from elsewhere; no MIME sniffing."""
    return {
        "Content-Security-Policy": (
            "default-src 'none'; style-src 'unsafe-inline'; "
            f"script-src {pages.THEME_SCRIPT_HASH}; img-src 'self' data:; form-action 'self'; "
            "frame-ancestors 'self'; base-uri 'none'"
        ),
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "same-origin",
    }


def validation_message(exc: RequestValidationError) -> str:
    """One line naming each bad parameter and what it must be."""
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error.get("loc", ()) if p not in ("path", "query"))
        got = error.get("input")
        parts.append(f"{where or 'request'}={got!r}: {error.get('msg', 'invalid')}")
    return "bad request: " + "; ".join(parts)


def app_path(request: Request) -> str:
    return request.url.path.removeprefix(request.scope.get("root_path", ""))


def is_api(request: Request) -> bool:
    return app_path(request).startswith("/api/")


def root_of(request: Request) -> str:
    """The relative path from the requested page back to the app's root ("../" per level).

    Counted on the raw path: a job name's encoded "/" (%2F) is not a level.
    """
    raw = request.scope.get("raw_path", request.url.path.encode()).decode("latin-1")
    root_path = request.scope.get("root_path", "")
    depth = raw.split("?", 1)[0].removeprefix(root_path).count("/") - 1
    return "../" * max(depth, 0)


def create_app(catalogs: CatalogHolder | None = None) -> FastAPI:
    holder = catalogs or CatalogHolder()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        holder.close()

    app = FastAPI(
        title="Statekeeper catalog",
        description="Jobs, snapshots, files, key-group skew and maintenance runs of Statekeeper.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.catalogs = holder
    app.include_router(api.router)
    app.include_router(pages.router)

    headers = security_headers()

    @app.middleware("http")
    async def add_security_headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await call_next(request)
        for name, value in headers.items():
            response.headers.setdefault(name, value)
        return response

    def bad_request(request: Request, exc: Exception) -> Response:
        # FastAPI's default is 422 with pydantic's structure; a wrong parameter is a 400 here,
        # with one readable line (an id above 2^63 included: it never reaches the database)
        if not isinstance(exc, RequestValidationError):  # registered for that one type only
            raise exc
        message = validation_message(exc)
        if is_api(request):
            return JSONResponse({"detail": message}, status_code=status.HTTP_400_BAD_REQUEST)
        return pages.error_page(400, message, root=root_of(request))

    app.add_exception_handler(RequestValidationError, bad_request)

    for error, code in ERROR_STATUS:

        def handle(request: Request, exc: Exception, code: int = code) -> Response:
            if is_api(request):
                return JSONResponse({"detail": str(exc)}, status_code=code)
            return pages.error_page(code, str(exc), root=root_of(request))

        app.add_exception_handler(error, handle)
    return app
