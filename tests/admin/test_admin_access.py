"""Who may use the admin API once the broker has [auth]: only the principals [admin] allow names,
by name or by role, with the same credentials as every listener."""

from __future__ import annotations

from typing import Any

import pytest_twisted

from tests.access.conftest import AuthFiles, basic
from tests.admin.http import base_of, http, open_tap
from tests.brokers import LOCAL, Broker
from tests.support import eventually
from wireproto.admin import AdminSettings
from wireproto.authentication import AuthSettings


async def start(broker: Broker, files: AuthFiles, **admin: Any) -> str:
    auth = AuthSettings(enabled=True, jwt_algorithms=("HS256",),
                        jwt_secret_file=str(files.secret), password_file=str(files.passwords))
    service, bound = await broker.start(f"websmq+ws@tcp:0:{LOCAL}", auth=auth,
                                        admin=AdminSettings(**admin))
    return base_of(bound[0].address)


@pytest_twisted.ensureDeferred
async def test_no_credentials_get_401_with_a_challenge_but_the_page_gets_none(
    broker: Broker, auth_files: AuthFiles,
) -> None:
    base = await start(broker, auth_files)
    refused = await http(base, "/api/status")
    assert refused.status == 401
    assert "Basic" in refused.header("www-authenticate")
    assert "error" in refused.json and "sessions" not in refused.json
    from_page = await http(base, "/api/status", headers={"x-wireproto-page": "1"})
    assert from_page.status == 401 and from_page.header("www-authenticate") is None
    wrong = await http(base, "/api/status", headers={"authorization": basic("carol", "guess")})
    assert wrong.status == 401
    # The page itself is static and public; everything it shows comes from the API.
    assert (await http(base, "/")).status == 200


@pytest_twisted.ensureDeferred
async def test_a_principal_that_is_not_an_admin_gets_403(
    broker: Broker, auth_files: AuthFiles,
) -> None:
    base = await start(broker, auth_files)
    carol = basic("carol", "carol's password")
    refused = await http(base, "/api/status", headers={"authorization": carol})
    assert refused.status == 403 and "not an admin" in refused.json["error"]
    user = "Bearer " + auth_files.token("dave", roles=["staff"])
    assert (await http(base, "/api/sessions", headers={"authorization": user})).status == 403
    closing = await http(base, "/api/publish", {"topic": "a", "payload": "x"},
                         headers={"authorization": user})
    assert closing.status == 403
    tap = await http(base, "/api/tap?pattern=%23", headers={"authorization": user})
    assert tap.status == 403


@pytest_twisted.ensureDeferred
async def test_the_admin_role_and_a_named_admin_get_in(
    broker: Broker, auth_files: AuthFiles,
) -> None:
    base = await start(broker, auth_files, allow=("role:admin", "carol"))
    admin = "Bearer " + auth_files.token("erin", roles=["admin"])
    answer = await http(base, "/api/whoami", headers={"authorization": admin})
    assert answer.status == 200 and answer.json == {"name": "erin", "roles": ["admin"]}
    carol = basic("carol", "carol's password")
    answer = await http(base, "/api/status", headers={"authorization": carol})
    assert answer.status == 200 and "sessions" in answer.json
    published = await http(base, "/api/publish", {"topic": "a", "payload": "x"},
                           headers={"authorization": carol})
    assert published.status == 200
    response, reader = await open_tap(base, "#", {"authorization": admin})
    assert response.code == 200
    await eventually(lambda: reader.lines == [{"tap": "#"}])
    response._transport.stopProducing()


@pytest_twisted.ensureDeferred
async def test_an_admin_on_a_page_elsewhere_is_refused_before_its_credentials_are_read(
    broker: Broker, auth_files: AuthFiles,
) -> None:
    base = await start(broker, auth_files)
    admin = "Bearer " + auth_files.token("erin", roles=["admin"])
    elsewhere = {"authorization": admin, "origin": "http://evil.example"}
    refused = await http(base, "/api/whoami", headers=elsewhere)
    assert refused.status == 403 and "origin" in refused.json["error"]
    response, _reader = await open_tap(base, "#", elsewhere)
    assert response.code == 403
    own = await http(base, "/api/whoami", headers={"authorization": admin,
                                                   "origin": base})
    assert own.status == 200 and own.json["name"] == "erin"
