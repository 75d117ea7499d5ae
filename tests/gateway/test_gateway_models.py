"""The response models change no byte: each JSON route serves its view's body as built, a join document as written."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import gateway_settings
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from gateway_helpers import AUTH, tel

from flywheel import proto
from flywheel.launch import remote
from flywheel.services.gateway import views
from flywheel.services.gateway.app import GatewayService, create_app


def _as_built(body: Any) -> bytes:
    """The body as the gateway wrote it before it had response models: the view's dict, straight to JSON."""
    return bytes(JSONResponse(body).body)


def _record(monkeypatch: pytest.MonkeyPatch, name: str) -> list[Any]:
    """Every value the view ``name`` returns from now on."""
    seen: list[Any] = []
    real: Callable[..., Any] = getattr(views, name)

    def recording(*args: Any) -> Any:
        seen.append(real(*args))
        return seen[-1]

    monkeypatch.setattr(views, name, recording)
    return seen


def _clip(progress: float) -> proto.ClipChunk:
    data = np.frombuffer(b"\x00\x00\x00\x18ftypmp42" * 10, dtype=np.uint8)
    return proto.ClipChunk("a-0", 1, 0, 1, len(data), 7, "SuperMarioBros-1-1-v3", 30.0, 120, 640.5, 119, progress,
                           True, time.time(), data)


def test_every_json_route_serves_its_view_byte_for_byte(gateway: tuple[TestClient, GatewayService],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    client, service = gateway
    statuses, histories = _record(monkeypatch, "status"), _record(monkeypatch, "history")
    service.registry.update(tel("learner", "l-0", 1, {"updates_total": 7}, {"loss": 0.25, "weight_version": 3}))
    service.sweep(wall=time.time() - 10)  # a curve point without actors: env_steps is the whole number 0
    service.registry.update(tel("actor", "a-0", 1, {"env_steps_total": 100, "episodes_total": 2},
                                {"epsilon": 0.4, "episode_return_mean": 1.5, "weight_version": 2},
                                {"env": "snake"}))
    service.registry.update(tel("actor", "a-1", 1, {"env_steps_total": 50}, {"epsilon": 0.01}))
    service.registry.update(tel("replay", "r-0", 1, {"transitions_received_total": 150}, {"size_transitions": 150}))
    service.leases.handle(proto.LeaseRequest("a-0"))  # a-1 holds none: its "lease" key stays out
    assert service.clips.add(_clip(progress=1234.0)) is not None
    service.sweep(wall=time.time())
    for command, args in (("set_lr", {"lr": 1e-4}), ("set_publish_interval", {"updates": 50.0}),
                          ("checkpoint", {"tag": "t-1"})):
        accepted = client.post(f"/control/{command}", json=args, headers=AUTH)
        assert accepted.status_code == 202
        assert accepted.content == _as_built({"seq": accepted.json()["seq"], "command": command,
                                              "target": accepted.json()["target"],
                                              "args": service.control.state()["recent"][-1]["args"]})

    status = client.get("/status")
    assert status.status_code == 200 and status.content == _as_built(statuses[-1])
    instances = {i["instance"]: i for s in status.json()["services"].values() for i in s["instances"]}
    assert "lease" in instances["a-0"] and "lease" not in instances["a-1"]
    history = client.get("/history")
    assert history.status_code == 200 and history.content == _as_built(histories[-1])
    assert b'"env_steps":0,' in history.content and len(history.json()["points"]) >= 2
    for path, body in (("/control", service.control.state()), ("/clip", service.clips.newest.info())):
        response = client.get(path)
        assert response.status_code == 200 and response.content == _as_built(body), path


def test_health_is_its_model(gateway: tuple[TestClient, GatewayService]) -> None:
    client, _ = gateway
    assert client.get("/healthz").content == b'{"ok":true,"detail":"ok"}'


def _serve_join(path: Path) -> tuple[int, bytes]:
    settings = gateway_settings(join_file=path)
    with TestClient(create_app(settings, GatewayService(settings))) as client:
        response = client.get("/join")
    return response.status_code, response.content


def test_the_join_document_is_served_as_written(tmp_path: Path) -> None:
    join = {"format": remote.FORMAT, "endpoints": {"TRANSITIONS_ENDPOINT": "tcp://10.0.0.1:47100"},
            "advertise": "10.0.0.1"}
    path = remote.write_join_file(join, {"actor": {"ENV_ID": "CartPole-v1", "NUM_ENVS": "4"}}, "CartPole-v1",
                                  None, tmp_path)
    assert _serve_join(path) == (200, _as_built(json.loads(path.read_text())))
    newer = {**json.loads(path.read_text()), "added_later": [1, 2]}  # a key this gateway does not know: served
    path.write_text(json.dumps(newer))
    assert _serve_join(path) == (200, _as_built(newer))


@pytest.mark.parametrize("text", ["[1, 2]", "{not json", '{"format": "flywheel-join"}',
                                  '{"format": "flywheel-join", "actor": ["ENV_ID"]}'])
def test_a_join_document_an_actor_could_not_use_is_not_served(tmp_path: Path, text: str) -> None:
    path = tmp_path / "join.json"
    path.write_text(text)
    status, body = _serve_join(path)
    assert status == 404 and b"flywheel run --listen" in body
