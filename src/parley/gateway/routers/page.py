"""The web page: ``/`` and its files under ``/static`` (``src/parley/gateway/static``), with
headers that keep it to its own files and this gateway."""

from __future__ import annotations

from importlib import resources as package_files
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response

STATIC = package_files.files("parley.gateway") / "static"

router = APIRouter()

# The page loads nothing but its own files and talks to nothing but this gateway: a
# script injected through a rendering bug could not send the token anywhere else.
PAGE_POLICY = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
PAGE_HEADERS = {
    # Revalidated on every load: an upgrade never pairs a new page with an old script.
    "Cache-Control": "no-cache",
    "Content-Security-Policy": PAGE_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class PageFiles(StaticFiles):
    """The page's static files, with the page's headers."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers.update(PAGE_HEADERS)
        return response


@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
def page() -> FileResponse:
    """The web page (it reads its token from the URL the gateway printed)."""
    with package_files.as_file(STATIC / "index.html") as path:
        return FileResponse(path, headers=PAGE_HEADERS)


def mount_static(app: FastAPI) -> None:
    """Serve the page's files under ``/static`` (a mount: no router carries one)."""
    with package_files.as_file(STATIC) as directory:
        app.mount("/static", PageFiles(directory=directory), name="static")
