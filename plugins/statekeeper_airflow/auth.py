"""Authentication for the plugin app, by Airflow's own token resolution.

Airflow mounts plugin apps without any of its core API's dependencies, so every route here
depends on one of the two functions below. Both delegate to
``airflow.api_fastapi.core_api.security.get_user``: a Bearer token wins, else the UI's ``_token``
cookie; the token is validated by the configured auth manager (signature, expiry, revocation).
That function reaches the auth manager through ``get_auth_manager()``, the process-wide
singleton, not ``request.app.state``: inside a mounted app ``request.app`` is the plugin app,
which holds no auth manager.

Refusals: the API answers 401 with a JSON ``detail`` for a missing, expired or invalid token
(Airflow's core API says 403 for an invalid one; for a credential that proves nothing 401 is
the honest answer, and clients need only one case). A page redirects to the auth manager's
login page with ``next`` pointing back, which is what a person in a browser needs.
"""

from __future__ import annotations

from typing import Annotated

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.api_fastapi.core_api.security import bearer_scheme, get_user
from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials

Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]


class AuthManagerMissing(HTTPException):
    def __init__(self) -> None:
        super().__init__(
            status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
            detail=(
                "Airflow's auth manager is not initialized, so no user can be authenticated; "
                "the Statekeeper app must run inside the Airflow API server (`airflow api-server`)"
            ),
        )


async def _resolve(request: Request, credentials: HTTPAuthorizationCredentials | None) -> BaseUser:
    try:
        get_auth_manager()
    except RuntimeError as exc:
        raise AuthManagerMissing() from exc
    return await get_user(request, None, credentials)


async def api_user(request: Request, credentials: Credentials) -> BaseUser:
    try:
        return await _resolve(request, credentials)
    except AuthManagerMissing:
        raise
    except HTTPException as exc:
        raise HTTPException(
            status_code=status.HTTP_401_UNAUTHORIZED,
            detail=f"{exc.detail}: send an Airflow JWT as 'Authorization: Bearer <token>' "
            "(get one from POST /auth/token)",
            headers={"WWW-Authenticate": "Bearer"},
        ) from exc


async def page_user(request: Request, credentials: Credentials) -> BaseUser:
    try:
        return await _resolve(request, credentials)
    except AuthManagerMissing:
        raise
    except HTTPException as exc:
        login = get_auth_manager().get_url_login(next_url=str(request.url))
        raise HTTPException(
            status_code=status.HTTP_303_SEE_OTHER,
            detail="log in to Airflow to see this page",
            headers={"Location": login},
        ) from exc


ApiUser = Annotated[BaseUser, Depends(api_user)]
PageUser = Annotated[BaseUser, Depends(page_user)]
