"""Schemathesis fuzzes a live gateway (a real uvicorn on loopback) against its own OpenAPI schema.

Positive and negative examples for every operation, a bounded number of each: no 5xx ever, schema-violating
requests get a 4xx with a JSON reason, the responses match the documented schemas, and control without the
token is refused.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from gateway_helpers import AUTH, gateway_env, http_get, start_gateway, wait_for
from hypothesis import HealthCheck, settings
from schemathesis.generation import GenerationMode

MAX_EXAMPLES = 20
SEEN: Counter[tuple[str, int]] = Counter()  # (path, status) of every fuzzed request


@pytest.fixture(scope="module")
def live_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("fuzz") / "gateway.log"
    proc, url, _ = start_gateway(gateway_env(), log)  # on the port the kernel picked, as its start line says
    try:
        wait_for(lambda: proc.poll() is None and _up(url), timeout=30, what=f"gateway on {url} ({log})")
        yield url
        status, _ = http_get(f"{url}/healthz")
        assert status == 200, "the gateway is unhealthy after the fuzzing"
    finally:
        proc.terminate()
        assert proc.wait(timeout=15) == 0, Path(log).read_text()[-3000:]
    text = Path(log).read_text()
    assert "Traceback" not in text and "Exception in ASGI" not in text, text[-3000:]


def _up(url: str) -> bool:
    try:
        return http_get(f"{url}/healthz", timeout=1)[0] == 200
    except OSError:
        return False


@pytest.fixture
def api_schema(live_gateway: str) -> schemathesis.schemas.BaseSchema:
    schema = schemathesis.openapi.from_url(f"{live_gateway}/openapi.json")
    # The token is added to every request by the test; schemathesis still checks that requests without it are
    # refused (its ignored_auth check), but must not mutate the header itself and expect a refusal.
    schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                                    max_examples=MAX_EXAMPLES, with_security_parameters=False)
    return schema


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@pytest.mark.system
def test_api_against_its_schema(case: schemathesis.Case) -> None:
    response = case.call_and_validate(headers=AUTH)
    SEEN[(case.path, response.status_code)] += 1
    assert response.status_code < 500
    if 400 <= response.status_code < 500:
        assert response.headers["content-type"][0].startswith("application/json"), response.text[:200]
        assert response.json()["error"], "a 4xx must say why"


@pytest.mark.system  # reads what the fuzzing above (system) saw: runs with it
def test_the_fuzzing_reached_both_sides_of_control() -> None:
    """Positive examples were accepted and negative ones refused, for every command (the fuzz test ran first)."""
    from flywheel.services.gateway.control import COMMANDS

    for name in COMMANDS:
        codes = {code for (path, code), _ in SEEN.items() if path == f"/control/{name}"}
        assert 202 in codes, f"no accepted {name}: {codes}"
        if name not in ("pause", "resume", "checkpoint"):
            assert codes & {400, 422}, f"no refused {name}: {codes}"


@pytest.mark.system
def test_openapi_documents_every_command_with_examples(live_gateway: str) -> None:
    import json

    from flywheel.services.gateway.control import COMMANDS

    status, body = http_get(f"{live_gateway}/openapi.json")
    doc = json.loads(body)
    for name in COMMANDS:
        op = doc["paths"][f"/control/{name}"]["post"]
        assert op["security"] == [{"controlToken": []}]
        assert {"401", "422", "413"} <= set(op["responses"])
        content = op["requestBody"]["content"]["application/json"]
        assert content["schema"] == COMMANDS[name].schema
        if COMMANDS[name].examples:
            assert [e["value"] for e in content["examples"].values()] == list(COMMANDS[name].examples.values())
    assert doc["components"]["securitySchemes"]["controlToken"]["scheme"] == "bearer"
